"""Build and load the native CPU kernels (`csrc/`) once per process, on first use.

`torch.utils.cpp_extension.load` compiles `csrc/*.cpp` with ninja and the
system C++ compiler (`CXX`, else `c++`) into the torch extensions cache
(`TORCH_EXTENSIONS_DIR`, default `~/.cache/torch_extensions/<python>_cpu/`),
then loads the library, whose static initializers register the CPU kernels of
the ops defined in `ops.py` (attention) and `layer_ops.py` (norms, rotary, SiLU-and-multiply). The extension's name carries a hash of the
sources (headers included) and flags, `pagedinfer_cpu_kernels_<hash>`, so
another version of the sources (another checkout, an upgrade over a kept
cache) builds into its own folder and never loads, or overwrites, this one's
library; a later process with the same sources and flags reuses the cached
library. Concurrent builds are serialised by an advisory lock on
`<build dir>/pagedinfer.flock` (`_exclusive_build`), which the kernel drops
with its holder: a build killed mid-way (an OOM kill, a Ctrl-C, a pod evicted
during start-up) leaves torch's own lock file behind, on which every later
`cpp_extension.load` would wait forever; holding the flock, that file can only
be such a leftover, and is removed. A build still running elsewhere is waited
for at most `BUILD_WAIT_S`, then this process takes the torch path.

The code is compiled for the baseline x86-64 (`-O3`, no `-march`), so a
library built on one machine (an image build, a cache shared between nodes)
runs on any other: `csrc/isa.cpp` finds the CPU's instruction sets at run
time (`cpuid`) and the kernels for wider sets (target attributes or a
`#pragma GCC target` per translation unit) run only where it found them: the
AVX-512 kernel (bfloat16 scored with avx512_bf16's dot product where the CPU
has it), else `at::vec`'s kernel for AVX-512, AVX2 or generic vectors.

Nothing here runs at import. `load()` tries once: on any failure (no compiler,
no ninja, a compile error) it warns once, naming the cause, and returns False
forever after in this process; callers then take the torch path.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CSRC = Path(__file__).parent / "csrc"
# Baseline translation units first: the linker keeps the first copy of an inline function that
# several define, so never one compiled for a wider instruction set (see csrc/target_avx2.h).
SOURCES = [CSRC / name
           for name in ("paged_attention.cpp", "isa.cpp", "attention_vec_default.cpp", "attention_avx512.cpp",
                        "layer_ops.cpp", "layer_ops_default.cpp",
                        "attention_vec_avx2.cpp", "attention_vec_avx512.cpp", "layer_ops_avx2.cpp",
                        "layer_ops_avx512.cpp")]

CFLAGS = ["-O3"]

BUILD_WAIT_S = 900.0  # the longest wait for another process's build of the same sources (a cold build: ~2 min)
_POLL_S = 0.2

_loaded: bool | None = None  # None: not tried yet in this process


def extension_name() -> str:
    """`pagedinfer_cpu_kernels_<12 hex digits>`: a hash of every file in csrc/ and of the flags."""
    digest = hashlib.sha256(" ".join(CFLAGS).encode())
    for path in sorted(CSRC.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"pagedinfer_cpu_kernels_{digest.hexdigest()[:12]}"

def _ninja_on_path() -> None:
    """cpp_extension runs `ninja` from PATH; the pip wheel's binary sits beside the interpreter."""
    if shutil.which("ninja") is None:
        try:
            import ninja
        except ImportError:
            return
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


@contextmanager
def _exclusive_build(directory: Path, wait_s: float) -> Iterator[None]:
    """Hold the build lock of `directory` (see the module docstring); TimeoutError after `wait_s`."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / "pagedinfer.flock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"another process has been building {directory} for over {wait_s:.0f} s")
                time.sleep(_POLL_S)
        # every build of this folder runs under the flock: a torch lock file now is a killed build's
        (directory / "lock").unlink(missing_ok=True)
        yield
    finally:
        os.close(fd)  # releases the flock


def load() -> bool:
    """True once the native kernels are registered; False (one warning) if they cannot be built."""
    global _loaded
    if _loaded is None:
        try:
            from torch.utils import cpp_extension

            _ninja_on_path()
            name = extension_name()
            directory = Path(cpp_extension._get_build_directory(name, verbose=False))  # TORCH_EXTENSIONS_DIR's rule
            with _exclusive_build(directory, BUILD_WAIT_S):
                cpp_extension.load(name=name, sources=[str(s) for s in SOURCES], extra_cflags=CFLAGS,
                                   build_directory=str(directory), is_python_module=False, verbose=False)
            _loaded = True
        except Exception as error:  # a missing compiler or ninja, or a compile error: all mean "fall back"
            _loaded = False
            first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
            warnings.warn(f"pagedinfer: the native CPU kernels (attention, layer ops) could not be built ({first_line}); "
                          "using the slower torch path", RuntimeWarning, stacklevel=2)
    return _loaded
