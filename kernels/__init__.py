"""pagedinfer.kernels: paged attention and KV-cache ops.

Each op has a torch reference (`reference.py`, runs anywhere) and a Triton
kernel beside it; `dispatch.py` picks one per device and `PAGEDINFER_ATTENTION`.
"""
