"""`pagedinfer serve` with a grammar backend that is slow to load, for the tests of where it is loaded.

Usage: python slow_grammar_backend.py DELAY_SECONDS serve ARGS...

Runs the real command (`pagedinfer.engine.cli.main`) in this process, after
adding an import hook: the first import of llguidance or of any of its public
modules (`llguidance.hf`, `llguidance.torch`, ...; not its private `_`
modules) takes DELAY_SECONDS more, as a slow disk or torch._dynamo (which
`llguidance.torch` imports) would make it. Whichever thread imports one of
them waits that long, and each such import is said on stderr first (HELD and
the module's name), so a test reads from the output where the set-up happened.
Nothing of the server is changed, and nothing in the product reads this file:
the seam lives in the test support alone.
"""

from __future__ import annotations

import sys
import time

from pagedinfer.engine.cli import main

HELD = "slow_grammar_backend: held the import of"


class SlowBackendImports:
    """A meta-path finder that only waits, then lets the ordinary finders find the module."""

    def __init__(self, delay_seconds: float) -> None:
        self.delay_seconds = delay_seconds

    def find_spec(self, fullname: str, path=None, target=None):
        top, _, sub = fullname.partition(".")
        if top == "llguidance" and not sub.startswith("_"):
            print(HELD, fullname, file=sys.stderr, flush=True)
            time.sleep(self.delay_seconds)
        return None


if __name__ == "__main__":
    sys.meta_path.insert(0, SlowBackendImports(float(sys.argv[1])))
    sys.exit(main(sys.argv[2:]))
