"""Build the model runner of a replica: one process, or rank 0 plus N-1 children."""

from __future__ import annotations

from pagedinfer.contracts.config.engine_config import EngineConfig
from pagedinfer.engine.distributed.sharding import check_divisible
from pagedinfer.engine.hf_config import load_hf_config


def create_runner(config: EngineConfig):
    """The ModelRunner of rank 0; with tensor_parallel_size N > 1 it drives ranks 1..N-1."""
    from pagedinfer.engine.distributed.workers import WorkerSet
    from pagedinfer.engine.runner.loading import tp_device
    from pagedinfer.engine.runner.model_runner import ModelRunner

    if config.tensor_parallel_size == 1:
        return ModelRunner(config)
    cfg = load_hf_config(config.model)
    cfg = cfg.get("text_config") or cfg
    heads = int(cfg.get("num_attention_heads") or 0)
    check_divisible(heads, int(cfg.get("num_key_value_heads") or heads), config.tensor_parallel_size)
    workers = WorkerSet(config, tp_device(config, 0))
    try:
        runner = ModelRunner(config, workers.group)
        workers.wait_ready()
    except BaseException:
        workers.shutdown()
        raise
    runner.workers = workers
    return runner
