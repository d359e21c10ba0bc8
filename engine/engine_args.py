"""The engine's flags for `pagedinfer generate`, `serve` and `plan`, derived from `EngineConfig`.

Each option is defined once, as an annotated field of `EngineConfig`
(`contracts/config/engine_config.py`: name, default, help, type, choices, managed by the
operator); this module only turns those fields into argparse options and
parsed arguments back into a config (`contracts/config/options.py`). Torch-free.
"""

from __future__ import annotations

import argparse

from pagedinfer.contracts.config.engine_config import EngineConfig
from pagedinfer.contracts.config.options import add_flags, values_from_args

# The options `pagedinfer plan` shares with the engine (it sizes the pool they shape).
PLAN_FIELDS = (
    "gpu_memory_utilization",
    "block_size",
    "tensor_parallel_size",
    "max_num_batched_tokens",
    "max_model_len",
    "dtype",
    "max_num_seqs",
    "max_cudagraph_capture_size",
)


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Every engine flag, in one argument group "engine" (--model optional: commands default it)."""
    add_flags(p.add_argument_group("engine"), EngineConfig)


def add_plan_args(p: argparse.ArgumentParser) -> None:
    """The engine flags `plan` takes; the token budget there also sets the activation reserve."""
    add_flags(
        p,
        EngineConfig,
        PLAN_FIELDS,
        help_for={"max_num_batched_tokens": "token budget of one step; sets the activation reserve (default 2048)"},
    )


def engine_config_from_args(args: argparse.Namespace, model: str | None = None) -> EngineConfig:
    """The EngineConfig of parsed engine flags; `model` replaces --model (a resolved directory)."""
    values = values_from_args(EngineConfig, args)
    if model:
        values["model"] = model
    return EngineConfig(**values)
