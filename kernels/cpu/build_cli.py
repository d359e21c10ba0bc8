"""`python -m pagedinfer.kernels.cpu.build`: compile the native CPU kernels once and install them prebuilt.

    python -m pagedinfer.kernels.cpu.build [--out DIR]   # build (or reuse the extensions cache's build), install
    python -m pagedinfer.kernels.cpu.build --check       # load the prebuilt library only, or exit 1

The install copies `<name>.so` (`build.extension_name()`: the sources' hash)
into DIR (default: the package's `prebuilt/`, `build.PACKAGE_PREBUILT_DIR`)
under a temporary name, then renames it into place, mode 0644: an engine
loading from DIR meanwhile sees the whole library or none. Run it as the
folder's owner (root in an image build) so the engine's user can read, not
change, it. `--check` is what an image's last stage runs: it proves a
library for exactly these sources and this torch is found where the engine
looks (`build.prebuilt_dirs()`) and that it loads, with no compiler needed.

Exit 0 on success; 1 when the build fails or `--check` finds no library
(one line on stderr, naming the cause); 2 for a bad DIR.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from pagedinfer.kernels.cpu import build


def install(library: Path, out_dir: Path) -> Path:
    """Copy `library` into `out_dir` atomically (same file name, mode 0644); the installed path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / library.name
    partial = out_dir / f".{library.name}.{os.getpid()}.part"
    shutil.copyfile(library, partial)
    partial.chmod(0o644)
    os.replace(partial, target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pagedinfer.kernels.cpu.build",
        description="Build the native CPU kernels and install them prebuilt.",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=build.PACKAGE_PREBUILT_DIR,
        help="the folder to install the library into (default: %(default)s)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="only load the prebuilt library the engine would find; exit 1 if there is none",
    )
    args = parser.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        print(f"build: --out {args.out} is not a directory", file=sys.stderr)
        return 2
    name = build.extension_name()
    if args.check:
        library = build.load_prebuilt(name)
        if library is None:
            searched = ", ".join(str(d) for d in build.prebuilt_dirs())
            print(f"build: no prebuilt {build.library_filename(name)} for these sources in {searched}", file=sys.stderr)
            return 1
        import torch

        print(f"{library} loads; its attention kernel here: {torch.ops.pagedinfer.cpu_attention_isa('')}")
        return 0
    try:
        library, _ = build.build_and_load(name)
    except Exception as error:  # a missing compiler or ninja, or a compile error
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        print(f"build: the native CPU kernels could not be built: {first_line}", file=sys.stderr)
        return 1
    print(install(library, args.out))
    return 0
