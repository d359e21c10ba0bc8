"""Build and load the native CPU kernels (`csrc/`) once per process, on first use.

`torch.utils.cpp_extension.load` compiles `csrc/*.cpp` with ninja and the
system C++ compiler (`CXX`, else `c++`) into the torch extensions cache
(`TORCH_EXTENSIONS_DIR`, default `~/.cache/torch_extensions/<python>_cpu/`),
then loads the library, whose static initializers register the CPU kernels of
the ops defined in `ops.py`. A later process with the same sources and flags
reuses the cached library (a file lock serialises concurrent builds).

The code is compiled for the build machine: `-O3 -march=native`, and ATen's
`at::vec` for the machine's best capability (`CPU_CAPABILITY_AVX512` on
AVX-512, AVX2, else the portable vectors), so the library is built where it
runs and never shipped prebuilt.

Nothing here runs at import. `load()` tries once: on any failure (no compiler,
no ninja, a compile error) it warns once, naming the cause, and returns False
forever after in this process; callers then take the torch path.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import torch

EXTENSION_NAME = "pagedinfer_cpu_kernels"
SOURCES = [Path(__file__).parent / "csrc" / "paged_attention.cpp"]

_loaded: bool | None = None  # None: not tried yet in this process


def capability_flags() -> list[str]:
    """The `at::vec` capability defines for this machine, as ATen compiles its own CPU kernels."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability.startswith("AVX512"):
        return ["-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"]
    if capability == "AVX2":
        return ["-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"]
    return []


def _ninja_on_path() -> None:
    """cpp_extension runs `ninja` from PATH; the pip wheel's binary sits beside the interpreter."""
    if shutil.which("ninja") is None:
        try:
            import ninja
        except ImportError:
            return
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def load() -> bool:
    """True once the native kernels are registered; False (one warning) if they cannot be built."""
    global _loaded
    if _loaded is None:
        try:
            from torch.utils import cpp_extension

            _ninja_on_path()
            cpp_extension.load(name=EXTENSION_NAME, sources=[str(s) for s in SOURCES],
                               extra_cflags=["-O3", "-march=native", *capability_flags()],
                               is_python_module=False, verbose=False)
            _loaded = True
        except Exception as error:  # a missing compiler or ninja, or a compile error: all mean "fall back"
            _loaded = False
            first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
            warnings.warn(f"pagedinfer: the native CPU attention could not be built ({first_line}); "
                          "using the slower torch path", RuntimeWarning, stacklevel=2)
    return _loaded
