"""Kernel tests run Triton on the CPU interpreter.

`TRITON_INTERPRET=1` must be in the environment before triton decorates any
kernel (`@triton.jit` picks the interpreter at import), and without it Triton
finds "0 active drivers" on this GPU-less machine: tests/conftest.py sets it
before anything imports torch.
"""

import pytest


@pytest.fixture(scope="session")
def native_cpu_kernels():
    """The native CPU kernels, built (or loaded from the extensions cache) once per session."""
    from pagedinfer.kernels.cpu import ops

    assert ops.native_available(), "the native CPU kernels did not build (a C++ compiler and ninja are needed)"
    return ops


@pytest.fixture(params=("portable", "avx2", "avx512", "avx512_bf16"))
def isa(request, native_cpu_kernels):
    """Each native kernel level this CPU can run, forced for one test (then back to the best it has)."""
    best = native_cpu_kernels.attention_isa("auto")
    levels = native_cpu_kernels.ISA_LEVELS
    if levels.index(request.param) > levels.index(best):
        pytest.skip(f"this CPU lacks {request.param} (it has {best})")
    assert native_cpu_kernels.attention_isa(request.param) == request.param
    yield request.param
    native_cpu_kernels.attention_isa("auto")
