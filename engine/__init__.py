"""pagedinfer.engine: a paged-KV-cache LLM inference engine.

The public names (`LLM`, `SamplingParams`, ...) are resolved lazily so that
torch-free modules of this package can be imported without loading torch.
`EngineConfig` is a contract (`pagedinfer.contracts.config.engine_config`).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "LLM": "pagedinfer.engine.llm",
    "SamplingParams": "pagedinfer.engine.sampling_params",
    "BeamSearchParams": "pagedinfer.engine.beam.params",
    "BeamSearchOutput": "pagedinfer.engine.beam.params",
    "RequestOutput": "pagedinfer.engine.outputs",
    "CompletionOutput": "pagedinfer.engine.outputs",
    "LLMEngine": "pagedinfer.engine.llm_engine",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pagedinfer.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
