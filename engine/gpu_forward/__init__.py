"""The GPU's own decoder: Llama-family layers as Triton kernels and fused GEMMs (`decoder.py`), chosen at load
(`select.py`); the CPU's equivalent is `engine/cpu/fused_layers.py`, whose plan (`engine/cpu/layer_plan.py`) it runs."""
