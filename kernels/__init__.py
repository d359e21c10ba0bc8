"""pagedinfer.kernels: paged attention and KV-cache ops.

Each op has a plain torch reference (`reference.py`, the tests' oracle), a
Triton kernel (CUDA) and a CPU path (`cpu/`: native kernels built on first
use, a vectorised torch fallback); `dispatch.py` picks one per device and
`PAGEDINFER_ATTENTION`. Importing this package builds and loads nothing.
"""
