"""The model runner: one rank's model, KV pools and steps.

`loading` (device, dtype, the RoPE check, the transformers model sharded and in the forward form that runs
it), `profiling` (activation memory measured on CUDA or estimated on a CPU, the KV pool sized:
`size_kv_cache`), `inputs` (a step's host inputs from its sequences, and how its logits rows split back),
`model_runner` (`ModelRunner`: the pools, block moves and the packed forward of each step).
"""
