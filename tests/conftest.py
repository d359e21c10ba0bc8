"""Shared fixtures. Test-support modules live in tests/support (put on sys.path
here; it holds no `operator` folder, so nothing in the stdlib is shadowed)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Triton runs on the CPU interpreter in every test (this machine has no GPU). `@triton.jit` picks the
# interpreter when it decorates, and torch imports triton from many places (registering a custom op
# imports torch._dynamo, which imports triton), so this must precede every import of torch, in the
# first conftest read: a test module of another folder, collected before tests/kernels, once imported
# triton first and every interpreted kernel then failed ("Cannot call @triton.jit'd outside of the
# scope of a kernel"). tests/kernels/test_compiles_for_hopper.py removes it for its compile check.
os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

SUPPORT = Path(__file__).resolve().parent / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))

# Every teardown bounded by its test's timeout, a failed test's too (tests/support/teardown_watchdog.py).
from teardown_watchdog import pytest_runtest_logreport, pytest_runtest_teardown  # noqa: E402,F401

# A test past its timeout is named, with its stacks, on stderr (in an xdist worker too: tests/support/timeout_report.py).
from timeout_report import pytest_timeout_set_timer  # noqa: E402,F401


@pytest.fixture(scope="session")
def tiny_models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny_models")


@pytest.fixture(scope="session")
def make_model(tiny_models_dir):
    """make_model(arch="llama", **config_overrides) -> Path of a saved tiny model (cached per session)."""
    from pagedinfer.engine.tiny_model import make_tiny_model

    def _make(arch: str = "llama", seed: int = 0, **overrides) -> Path:
        key = "-".join([arch, str(seed)] + [f"{k}={v}" for k, v in sorted(overrides.items())])
        return make_tiny_model(tiny_models_dir / key, arch=arch, seed=seed, **overrides)

    return _make


@pytest.fixture(scope="session")
def tiny_llama(make_model) -> Path:
    return make_model("llama")
