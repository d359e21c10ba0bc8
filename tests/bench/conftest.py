"""The benchmark's own modules (bench/ is a folder of scripts, not a package) are importable in these tests."""

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
