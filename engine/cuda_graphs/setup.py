"""Building a runner's decode graphs from the engine options: the buckets, the checks, the capture on CUDA."""

from __future__ import annotations

import logging

import torch

from pagedinfer.contracts import sizing
from pagedinfer.contracts.config.engine_config import EngineConfig
from pagedinfer.contracts.cuda_graph_buckets import capture_sizes
from pagedinfer.contracts.model_shape import ModelShape
from pagedinfer.engine.cuda_graphs.decode_graphs import DecodeGraphs, Forward

logger = logging.getLogger(__name__)


def make_decode_graphs(
    config: EngineConfig, device: torch.device, forward: Forward, max_model_len: int, shape: ModelShape
) -> DecodeGraphs | None:
    """The runner's decode graphs (captured on CUDA), or None with max_cudagraph_capture_size 0.

    Called once the KV pool is allocated: a captured graph holds the pool's addresses. On CUDA the memory the
    capture took is measured (`DecodeGraphs.captured_bytes`) and logged beside the sizing's estimate
    (`planned_bytes`, what the KV pool left room for), with a warning when it exceeds it.
    """
    sizes = capture_sizes(config.max_cudagraph_capture_size, config.max_num_seqs)
    if not sizes:
        return None
    if device.type == "cuda" and config.tensor_parallel_size > 1:
        raise ValueError(
            "max_cudagraph_capture_size (--max-cudagraph-capture-size): decode graphs are not captured"
            f" with tensor_parallel_size {config.tensor_parallel_size} (the collectives are not in"
            " them yet); set it to 0"
        )
    graphs = DecodeGraphs(sizes, forward, device, max_model_len, config.block_size)
    graphs.planned_bytes = sizing.estimate_cuda_graph_bytes(
        shape, config.max_cudagraph_capture_size, config.max_num_seqs, max_model_len, config.block_size
    )
    if device.type == "cuda":
        graphs.capture()
        measured, planned = graphs.captured_bytes or 0, graphs.planned_bytes
        log = logger.warning if measured > planned else logger.info
        log(
            "decode graphs took %.1f MiB of device memory; the KV sizing left %.1f MiB for them%s",
            measured / 2**20,
            planned / 2**20,
            " (more: the pool may run short)" if measured > planned else "",
        )
    return graphs
