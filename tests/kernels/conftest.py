"""Kernel tests run Triton on the CPU interpreter.

`TRITON_INTERPRET=1` must be in the environment before triton decorates any
kernel (`@triton.jit` picks the interpreter at import), and without it Triton
finds "0 active drivers" on this GPU-less machine; hence the first lines.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"
