"""Which forward runs a step: our Triton decoder (`decoder.py`) or the module path, chosen once at load.

`EngineConfig.forward` (`--forward`):
- `auto`: the Triton decoder on CUDA at tensor parallel size 1 for a model the
  plan fits (`CAUSAL_LM_CLASSES`: Llama, Mistral, Qwen2, Qwen3 causal LMs in float32,
  bfloat16 or float16); any other model, or a CPU, keeps its path (the module
  path on CUDA, the CPU's own fused layers on a CPU);
- `module`: never the Triton decoder;
- `triton`: the Triton decoder on any device (on a CPU under `TRITON_INTERPRET=1`:
  how the tests prove it); a model it cannot run is a ValueError naming why.

Invariants: the choice is made before any other fusion touches the model (the
runner then skips the CPU's fused layers); `fuse_projections` runs only for a
model whose causal-LM class is supported, so an unsupported model is left as it was.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from pagedinfer.engine.cpu.fused_layers import CAUSAL_LM_CLASSES, rotary_cos_sin, unfusable_structure
from pagedinfer.engine.cpu.fused_projections import FusionReport, fuse_projections
from pagedinfer.engine.cpu.layer_plan import plan_decoder, projection

if TYPE_CHECKING:  # the decoder imports triton: a CPU engine without it never loads it
    from pagedinfer.engine.gpu_forward.decoder import TritonDecoder

logger = logging.getLogger(__name__)

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class DecoderChoice:
    """What `choose_decoder` did: the decoder (None: the device's own path) and why not, when not."""

    decoder: TritonDecoder | None
    fusion: FusionReport | None  # the q/k/v and gate/up fusion it ran (None when it left the model alone)
    reason: str  # "" when the decoder runs


def _unsupported(model: nn.Module) -> str:
    """Why `model` (its projections not fused yet) is not a class the decoder runs ("" when it is)."""
    if type(model).__name__ not in CAUSAL_LM_CLASSES:
        return f"model class {type(model).__name__} (supported: {', '.join(CAUSAL_LM_CLASSES)})"
    dtype = next(model.parameters()).dtype
    if dtype not in DTYPES:
        return f"dtype {dtype}"
    if not isinstance(getattr(model, "lm_head", None), nn.Module):
        return "no lm_head module"
    return ""


def wants_triton_decoder(forward: str, device: torch.device, tensor_parallel_size: int) -> bool:
    """Whether `forward` asks for the Triton decoder here (see the module docstring); ValueError where it cannot run."""
    if forward == "module":
        return False
    if forward == "auto":
        return device.type == "cuda" and tensor_parallel_size == 1
    if tensor_parallel_size != 1:
        raise ValueError(
            f"forward (--forward) triton: the Triton decoder runs at tensor_parallel_size 1, got {tensor_parallel_size}"
        )
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("forward (--forward) triton on a CPU needs TRITON_INTERPRET=1 set before triton is imported")
    return True


def choose_decoder(
    model: nn.Module, forward: str, device: torch.device, tensor_parallel_size: int, num_positions: int
) -> DecoderChoice:
    """Build the Triton decoder over `model` (on `device` already) if `forward` asks for it and the model fits."""
    if not wants_triton_decoder(forward, device, tensor_parallel_size):
        return DecoderChoice(None, None, f"forward {forward!r} on {device.type}")
    reason = _unsupported(model)
    fusion = None
    if not reason:
        fusion = fuse_projections(model)
        reason = unfusable_structure(model.model)
    if reason:
        if forward == "triton":
            raise ValueError(f"forward (--forward) triton: the Triton decoder cannot run this model: {reason}")
        logger.info("the Triton decoder does not run this model (%s): the module path runs it", reason)
        return DecoderChoice(None, fusion, reason)
    from pagedinfer.engine.gpu_forward.decoder import TritonDecoder

    triton_decoder = TritonDecoder(
        plan_decoder(model.model), rotary_cos_sin(model.model.rotary_emb, num_positions), projection(model.lm_head)
    )
    logger.info("the Triton decoder runs %s (%d layers)", type(model).__name__, triton_decoder.num_layers)
    return DecoderChoice(triton_decoder, fusion, "")
