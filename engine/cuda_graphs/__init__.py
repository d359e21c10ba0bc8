"""CUDA graphs for decode steps: one graph per batch-size bucket, fed from static buffers.

A pure-decode step (every sequence one new token) of n sequences, n at most
the largest bucket, runs at the smallest bucket b >= n (`contracts/cuda_graph_buckets`): its
inputs are written into buffers allocated once (`static_inputs`), rows n..b
padded so that they write no KV (slot -1) and attend to one harmless key,
then the bucket's graph is replayed (`decode_graphs`) and the first n rows of
its logits are kept. On CUDA the graphs are captured at start-up, after the
KV pool is allocated, in one shared memory pool; on a CPU (or wherever
capture is unavailable) the same forward runs eagerly on the same static
buffers ("replay without capture"), so the bucketing, padding and slicing
are exercised by CPU tests. Prefill and mixed steps, and batches above the
largest bucket, take the eager path.

The buckets are a contract (pure, no torch): `contracts/sizing.py` and the operator size the
graphs' memory from it. The option is `EngineConfig.max_cudagraph_capture_size`
(`--max-cudagraph-capture-size`, 0 = off).
"""
