"""The command line of every Python child the product starts: a fresh interpreter that never imports
from the working directory.

`python -m mod` puts the working directory first on sys.path, and `python -c code` puts '' there
(the same thing). A child started that way in a directory holding a folder named like one of ours
or one of our dependencies' (`pagedinfer/`, `kernels/` - which hides the PyPI `kernels` package that
transformers imports -, `engine/`, `router/`, `testing/`, a checkout's root) imports that folder
instead, and dies or misbehaves. `-P` (Python 3.11+) leaves that entry out; pyproject's
`requires-python = ">=3.11"` is what makes it always available, so no fallback exists.

Invariant: the returned argv starts `[sys.executable, "-P", ...]`: the child runs the same
interpreter, hence the same environment and installed `pagedinfer`, as its parent.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def child_python_argv(*, module: str | None = None, code: str | None = None, args: Sequence[str] = ()) -> list[str]:
    """argv running `module` (as `-m`) or `code` (as `-c`), exactly one of them, followed by `args`."""
    if (module is None) == (code is None):
        raise ValueError("child_python_argv: give exactly one of module= and code=")
    target = ["-m", module] if module is not None else ["-c", code]
    return [sys.executable, "-P", *target, *map(str, args)]
