"""Smoke test of ``benchmarks/backbone.py``: the unmodified ResNet-18 on images of different sizes
runs end to end at its smallest configuration, and its float64 check (ours against the per-image
loop, features and every parameter gradient) holds."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch

pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_backbone_benchmark_runs_and_agrees(tmp_path):
    spec = importlib.util.spec_from_file_location("backbone_bench", os.path.join(ROOT, "benchmarks", "backbone.py"))
    mod = importlib.util.module_from_spec(spec)
    import sys
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    threads = torch.get_num_threads()
    try:
        spec.loader.exec_module(mod)
        out = tmp_path / "r.json"
        r = mod.main(["--quick", "--batch", "2", "--sides", "32,40", "--json", str(out)])
    finally:
        sys.path.remove(os.path.join(ROOT, "benchmarks"))
        torch.set_num_threads(threads)
    assert r["check"] < 1e-9
    assert r["ms"]["ours"] > 0 and r["ms"]["loop"] > 0
    assert r["peak_mib"]["ours"] > 0 and r["peak_mib"]["loop"] > 0
    assert json.loads(out.read_text())["batch"] == 2
