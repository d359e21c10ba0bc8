"""Find, or build, and load the native CPU kernels (`csrc/`) once per process, on first use.

The library's name carries a hash of every file in csrc/ (headers included),
the flags and the torch release it links against, `pagedinfer_cpu_kernels_<hash>`
(`extension_name`), so a library of other sources, or built for another torch,
is never loaded. `load()` takes the first of:

1. A prebuilt library, `<dir>/<name>.so`, in the first folder of
   `prebuilt_dirs()` that holds one: `$PAGEDINFER_CPU_KERNELS_DIR` (the CPU
   engine image sets it to the root-owned folder its build compiled into), then
   the package's own `prebuilt/` (`python -m pagedinfer.kernels.cpu.build`
   installs there). It is loaded as it is (`torch.ops.load_library`): nothing
   is written, no lock, no ninja, so a read-only folder, a read-only root
   filesystem and a read-only HOME all do. A folder holding only other hashes'
   libraries is passed over.
2. The torch extensions cache (`TORCH_EXTENSIONS_DIR`, default
   `~/.cache/torch_extensions/<python>_cpu/<name>/`): `torch.utils.cpp_extension.load`
   compiles `csrc/*.cpp` there with ninja and the system C++ compiler (`CXX`,
   else `c++`) if the folder holds no up-to-date build, then loads it, and
   stamps the library it saw built (`<name>.so.stamp`: its size and mtime). A
   stamped library is loaded as it is, without ninja (`load_cached`): the name
   already says which sources it was built from, while torch's `build.ninja`
   holds their paths, so two checkouts of the same sources sharing the cache
   would otherwise rebuild each other's library (minutes each). Concurrent
   builds are serialised by an advisory lock on `<build dir>/pagedinfer.flock`
   (`_exclusive_build`), which the kernel drops with its holder: a build killed
   mid-way (an OOM kill, a Ctrl-C, a pod evicted during start-up) leaves torch's
   own lock file behind, on which every later `cpp_extension.load` would wait
   forever; holding the flock, that file can only be such a leftover, and is
   removed. A build still running elsewhere is waited for at most
   `BUILD_WAIT_S`, then this process takes the torch path.
3. Neither (no prebuilt library, no compiler or ninja, a compile error): one
   warning naming the cause, and the callers take the torch path.

`origin()` says which it was (`KernelsOrigin`), and the load logs it at INFO
(`pagedinfer.kernels`), with its seconds.

The code is compiled for the baseline x86-64 (`-O3`, no `-march`), so a
library built on one machine (an image build, a cache shared between nodes)
runs on any other: `csrc/isa.cpp` finds the CPU's instruction sets at run
time (`cpuid`) and the kernels for wider sets (target attributes or a
`#pragma GCC target` per translation unit) run only where it found them: the
AVX-512 kernel (bfloat16 scored with avx512_bf16's dot product where the CPU
has it), else `at::vec`'s kernel for AVX-512, AVX2 or generic vectors.

Nothing here runs at import. `load()` tries once per process: its answer
(True, or False after the one warning) stands for the rest of it.

`python -m pagedinfer.kernels.cpu.build [--out DIR]` (`build_cli.py`) compiles
the library (or reuses the cache's build) and installs a copy into DIR
(default: the package's `prebuilt/`); `--check` loads the prebuilt one only,
failing (exit 1) where there is none for these sources: an image build runs
both.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CSRC = Path(__file__).parent / "csrc"
# Baseline translation units first: the linker keeps the first copy of an inline function that
# several define, so never one compiled for a wider instruction set (see csrc/target_avx2.h).
SOURCES = [
    CSRC / name
    for name in (
        "paged_attention.cpp",
        "isa.cpp",
        "attention_vec_default.cpp",
        "attention_avx512.cpp",
        "layer_ops.cpp",
        "layer_ops_default.cpp",
        "attention_vec_avx2.cpp",
        "attention_vec_avx512.cpp",
        "layer_ops_avx2.cpp",
        "layer_ops_avx512.cpp",
    )
]

CFLAGS = ["-O3"]

DIR_ENV = "PAGEDINFER_CPU_KERNELS_DIR"  # a folder of prebuilt libraries, searched first
PACKAGE_PREBUILT_DIR = Path(__file__).parent / "prebuilt"  # the package's own, searched second

BUILD_WAIT_S = 900.0  # the longest wait for another process's build of the same sources (a cold build: ~2 min)
_POLL_S = 0.2

logger = logging.getLogger("pagedinfer.kernels")


@dataclass(frozen=True)
class KernelsOrigin:
    """Where this process's native CPU kernels came from."""

    kind: str  # "prebuilt" (loaded as it is), "cached" (the extensions cache's build) or "compiled" (built now)
    library: Path  # the .so loaded
    load_seconds: float  # finding (and building) plus loading


_loaded: bool | None = None  # None: not tried yet in this process
_origin: KernelsOrigin | None = None  # set when _loaded is True


def extension_name() -> str:
    """`pagedinfer_cpu_kernels_<12 hex digits>`: a hash of every file in csrc/, the flags and torch's release."""
    import torch

    digest = hashlib.sha256(" ".join(CFLAGS).encode() + b"\0" + torch.__version__.encode())
    for path in sorted(CSRC.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"pagedinfer_cpu_kernels_{digest.hexdigest()[:12]}"


def library_filename(name: str) -> str:
    return f"{name}.so"


def prebuilt_dirs() -> list[Path]:
    """The folders searched for a prebuilt library, in order: $PAGEDINFER_CPU_KERNELS_DIR, the package's."""
    explicit = os.environ.get(DIR_ENV)
    return [Path(explicit), PACKAGE_PREBUILT_DIR] if explicit else [PACKAGE_PREBUILT_DIR]


def find_prebuilt(name: str) -> Path | None:
    """The first `<dir>/<name>.so` of `prebuilt_dirs()`; None where none holds this hash's library."""
    for directory in prebuilt_dirs():
        candidate = directory / library_filename(name)
        if candidate.is_file():
            return candidate
    return None


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


def cached_library(name: str) -> Path:
    """Where the torch extensions cache holds (or will hold) the build of `name` (TORCH_EXTENSIONS_DIR's rule)."""
    from torch.utils import cpp_extension

    return Path(cpp_extension._get_build_directory(name, verbose=False)) / library_filename(name)


def stamp_path(library: Path) -> Path:
    """The file saying that `library` is a build this module saw finish."""
    return library.with_name(library.name + ".stamp")


def _stamp_of(library: Path) -> str:
    st = library.stat()
    return f"{st.st_size} {st.st_mtime_ns}\n"


def _write_stamp(library: Path) -> None:
    stamp = stamp_path(library)
    partial = stamp.with_name(f"{stamp.name}.{os.getpid()}")
    partial.write_text(_stamp_of(library))
    partial.replace(stamp)  # atomic: a reader sees the whole stamp or none


def load_cached(name: str) -> Path | None:
    """Load the extensions cache's build of this hash without ninja where its stamp matches it (a build seen
    to finish, not replaced since); None where there is none, it is unstamped or stale, or it does not load."""
    import torch

    library = cached_library(name)
    try:
        if stamp_path(library).read_text() != _stamp_of(library):
            return None
    except OSError:  # no library or no stamp
        return None
    try:
        torch.ops.load_library(str(library))
    except OSError:  # a stamped but unloadable file: let the build path replace it
        return None
    return library


def build_and_load(name: str) -> tuple[Path, bool]:
    """Build (unless the extensions cache holds an up-to-date build) and load; (the library, whether compiled now).

    Raises whatever the build raises (no compiler, no ninja, a compile error, TimeoutError).
    """
    from torch.utils import cpp_extension

    _ninja_on_path()
    library = cached_library(name)
    directory = library.parent
    with _exclusive_build(directory, BUILD_WAIT_S):
        before = library.stat().st_mtime_ns if library.exists() else None
        cpp_extension.load(
            name=name,
            sources=[str(s) for s in SOURCES],
            extra_cflags=CFLAGS,
            build_directory=str(directory),
            is_python_module=False,
            verbose=False,
        )
        _write_stamp(library)
    return library, before != library.stat().st_mtime_ns


def load_prebuilt(name: str) -> Path | None:
    """Load this hash's prebuilt library, writing nothing; None where there is none (or it does not load)."""
    import torch

    library = find_prebuilt(name)
    if library is None:
        return None
    try:
        torch.ops.load_library(str(library))
    except OSError as error:  # a truncated or foreign file: the build path may still work
        warnings.warn(
            f"pagedinfer: the prebuilt native CPU kernels {library} did not load ({error}); building them instead",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return library


def load() -> bool:
    """True once the native kernels are registered; False (one warning) if there are none and they cannot be built."""
    global _loaded, _origin
    if _loaded is None:
        start = time.monotonic()
        try:
            name = extension_name()
            library = load_prebuilt(name)
            if library is not None:
                kind = "prebuilt"
            elif (library := load_cached(name)) is not None:
                kind = "cached"
            else:
                library, compiled = build_and_load(name)
                kind = "compiled" if compiled else "cached"
            _origin = KernelsOrigin(kind, library, time.monotonic() - start)
            _loaded = True
            logger.info(
                "native CPU kernels: %s library %s, loaded in %.0f ms", kind, library, 1e3 * _origin.load_seconds
            )
        except Exception as error:  # a missing compiler or ninja, or a compile error: all mean "fall back"
            _loaded, _origin = False, None
            first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
            searched = ", ".join(str(d) for d in prebuilt_dirs())
            warnings.warn(
                f"pagedinfer: the native CPU kernels (attention, layer ops) could not be built ({first_line}) "
                f"and none prebuilt for these sources is in {searched}; using the slower torch path",
                RuntimeWarning,
                stacklevel=2,
            )
    return _loaded


def origin() -> KernelsOrigin | None:
    """Where the loaded kernels came from; None before `load()` or where it returned False."""
    return _origin


if __name__ == "__main__":
    from pagedinfer.kernels.cpu import build_cli

    sys.exit(build_cli.main())
