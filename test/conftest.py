import os

import torch

# Without CUDA, Triton kernels run in Triton's interpreter on CPU tensors; it reads the variable
# when a kernel is decorated, so it must be set before any test module imports one.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, Phase, settings

import torch_multijagged  # noqa: F401  (registers the layout)

# Small, deterministic examples: the suite must stay fast and reproducible. Set
# HYPOTHESIS_PROFILE=thorough for a longer randomised run.
# No shrinking by default: examples are small already, and shrinking made each xfail(strict)
# test (a known bug) cost seconds. The thorough profile shrinks.
settings.register_profile(
    "default",
    max_examples=25,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "thorough",
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "quick",  # for triage: few examples, no shrinking
    max_examples=5,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def pytest_report_header(config):
    p = settings.default
    return f"hypothesis profile: {os.environ.get('HYPOTHESIS_PROFILE', 'default')} (max_examples={p.max_examples}; grid cells and few(n) scale with it)"
