"""pagedinfer.kernels.cpu: the paged-attention path the engine runs on CPU tensors.

`ops.py` defines the custom ops and picks, per call, the native kernels
(`csrc/`, built on first use by `build.py`) or the vectorised torch fallback
(`torch_attention.py`). Importing this package builds nothing.
"""
