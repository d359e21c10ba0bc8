"""`pagedinfer serve` with a model that takes DELAY_SECONDS more to load, for the tests of a stop during the load.

Usage: python slow_load.py DELAY_SECONDS serve ARGS...

Runs the real command (`pagedinfer.engine.cli.main`) in this process, after
wrapping `LLMEngine.__init__` so that it first sleeps DELAY_SECONDS on the
engine thread, as reading a large model's weights would. Nothing of the
server is changed, and nothing in the product reads this file.
"""

from __future__ import annotations

import functools
import sys
import time

from pagedinfer.engine.cli import main
from pagedinfer.engine.llm_engine import LLMEngine


def slow_down_loading(delay_seconds: float) -> None:
    original = LLMEngine.__init__

    @functools.wraps(original)
    def slow_init(self, *args, **kwargs):
        time.sleep(delay_seconds)
        original(self, *args, **kwargs)

    LLMEngine.__init__ = slow_init


if __name__ == "__main__":
    slow_down_loading(float(sys.argv[1]))
    sys.exit(main(sys.argv[2:]))
