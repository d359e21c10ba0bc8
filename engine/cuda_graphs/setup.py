"""Building a runner's decode graphs from the engine options: the buckets, the checks, the capture on CUDA."""

from __future__ import annotations

import torch

from pagedinfer.engine.config import EngineConfig
from pagedinfer.engine.cuda_graphs.buckets import capture_sizes
from pagedinfer.engine.cuda_graphs.decode_graphs import DecodeGraphs, Forward


def make_decode_graphs(config: EngineConfig, device: torch.device, forward: Forward, max_model_len: int
                       ) -> DecodeGraphs | None:
    """The runner's decode graphs (captured on CUDA), or None with max_cudagraph_capture_size 0.

    Called once the KV pool is allocated: a captured graph holds the pool's addresses.
    """
    sizes = capture_sizes(config.max_cudagraph_capture_size, config.max_num_seqs)
    if not sizes:
        return None
    if device.type == "cuda" and config.tensor_parallel_size > 1:
        raise ValueError("max_cudagraph_capture_size (--max-cudagraph-capture-size): decode graphs are not captured"
                         f" with tensor_parallel_size {config.tensor_parallel_size} (the collectives are not in"
                         " them yet); set it to 0")
    graphs = DecodeGraphs(sizes, forward, device, max_model_len, config.block_size)
    if device.type == "cuda":
        graphs.capture()
    return graphs
