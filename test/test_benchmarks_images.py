"""Smoke tests of ``benchmarks/images.py`` at its smallest configuration (sides × 0.125, one step):
the script runs end to end (``--json``, ``--plot``), every method that runs agrees with the float64
per-sample reference, a method that cannot run is reported as ``n/a`` instead of crashing the run,
and the reference check catches a padded baseline that forgets to re-mask."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")
SMALL = ["--scale", "0.125", "--steps", "1", "--warmup", "0", "--threads", "1"]


@pytest.fixture(autouse=True)
def _keep_threads():
    """The script sets torch's thread count; later tests must not inherit it."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _load():
    if BENCH not in sys.path:
        sys.path.insert(0, BENCH)  # the script imports _harness and _image_modules as siblings
    spec = importlib.util.spec_from_file_location("bench_images", os.path.join(BENCH, "images.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _check_payload(payload: dict, models, regimes) -> None:
    assert list(payload["results"]) == list(models)
    for mn in models:
        assert list(payload["results"][mn]) == list(regimes)
        for r in regimes:
            res = payload["results"][mn][r]
            ran = res["methods"]
            assert {"padded", "loop"} <= set(ran), (mn, r, res["notes"])
            for name, m in ran.items():
                assert abs(m["loss"] - res["reference_loss"]) <= 1e-5 * abs(res["reference_loss"]), (mn, r, name)
                assert m["ms_per_step"] > 0 and m["peak_bytes"] > 0
            assert res["loss_spread"] <= 1e-5
            # ours either ran (and agreed, above) or is reported with the reason, not dropped silently
            assert "ours" in ran or any(n.startswith("ours: n/a") for n in res["notes"]), res["notes"]
            assert 0 < res["rho"] <= 1


def test_images_benchmark_script_smoke(tmp_path):
    """The CLI end to end, both models, one regime; JSON and (with matplotlib) the plot."""
    out = tmp_path / "images.json"
    args = [sys.executable, os.path.join(BENCH, "images.py"), *SMALL, "--regime", "moderate", "--json", str(out)]
    if importlib.util.find_spec("matplotlib") is not None:
        args += ["--plot", str(tmp_path / "images.png")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]), MPLBACKEND="Agg")
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "cnn / moderate" in proc.stdout and "navit / moderate" in proc.stdout
    assert "Goals (reported, not asserted)" in proc.stdout
    payload = json.loads(out.read_text())
    _check_payload(payload, ["cnn", "navit"], ["moderate"])
    if "--plot" in args:
        assert (tmp_path / "images.png").stat().st_size > 0


def test_images_benchmark_group_norm_skewed(capsys):
    """--norm group: the loop is the module on each image alone; padded uses a masked GroupNorm."""
    mod = _load()
    payload = mod.main([*SMALL, "--model", "cnn", "--norm", "group", "--regime", "skewed"])
    _check_payload(payload, ["cnn"], ["skewed"])


def test_images_benchmark_aborts_when_padded_is_not_remasked(monkeypatch, capsys):
    """A padded baseline without re-masking computes another function: the run must abort."""
    mod = _load()
    import _image_modules as im

    def no_remask(self, x, mask=None):  # the block without its `x * mask`
        return im.each(torch.relu, self.norm(im.each(self.conv, x), mask))

    monkeypatch.setattr(im.ConvBlock, "forward", no_remask)
    with pytest.raises(SystemExit) as e:
        mod.main([*SMALL, "--model", "cnn", "--regime", "moderate", "--methods", "padded,loop"])
    assert e.value.code == 2
    assert "padded disagrees with the float64 reference" in capsys.readouterr().err
