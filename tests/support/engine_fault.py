"""`pagedinfer serve` with a fault injected into its engine, for the tests of the failure path.

Usage: python engine_fault.py METHOD TRIGGER_FILE serve ARGS...

Runs the real command (`pagedinfer.engine.cli.main`, what the console script
runs) in this process, after wrapping `LLMEngine.METHOD`: once TRIGGER_FILE
exists, every call raises RuntimeError, as an engine bug or a device fault
would. Nothing of the server is changed, and nothing in the product reads
this file or its trigger: the seam lives in the test support alone.
"""

from __future__ import annotations

import functools
import os
import sys

from pagedinfer.engine.cli import main
from pagedinfer.engine.llm_engine import LLMEngine


def inject(method: str, trigger_file: str) -> None:
    original = getattr(LLMEngine, method)

    @functools.wraps(original)
    def faulty(self, *args, **kwargs):
        if os.path.exists(trigger_file):
            raise RuntimeError(f"injected fault in LLMEngine.{method}")
        return original(self, *args, **kwargs)

    setattr(LLMEngine, method, faulty)


if __name__ == "__main__":
    inject(sys.argv[1], sys.argv[2])
    sys.exit(main(sys.argv[3:]))
