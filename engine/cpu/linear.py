"""Linear layers through oneDNN with their weights packed once at load (CPU only).

`F.linear` on a CPU calls MKL's sgemm (fp32) or oneDNN (bf16) with the plain
`[out, in]` weight, which the library re-lays out into its blocked format on
every call. Packing the weight once (`torch.ops.mkldnn._reorder_linear_weight`,
an opaque oneDNN tensor in the blocked layout) and calling
`torch.ops.mkldnn._linear_pointwise` skips that: about 2x the GFLOP/s of
F.linear in fp32 and up to 2x in bf16 at small M on an AVX-512 EPYC
(`bench/cpu_linear.py`; figures in docs/engine-benchmark.md). bf16 GEMMs
accumulate in fp32 inside oneDNN, as F.linear's do.

Invariants:
- the packed weight REPLACES the dense one (the module's `weight` parameter
  is the packed tensor; nothing else holds the dense copy), so parameter
  bytes, the sizing's `weight_bytes` and the process's memory count it once;
- a weight shared with another module (an LM head tied to the input
  embedding, which needs the dense table for its lookup) is left dense:
  packing it would hold a second copy;
- only CPU modules are packed; without the mkldnn ops (a torch build
  without oneDNN) nothing is packed and one warning says so;
- `PAGEDINFER_CPU_LINEAR=aten` turns packing off (benchmarks, bisecting);
  unset, empty or `onednn` packs.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
from torch import nn

logger = logging.getLogger(__name__)

ENV_VAR = "PAGEDINFER_CPU_LINEAR"
BACKENDS = ("onednn", "aten")
PACKED_DTYPES = (torch.float32, torch.bfloat16)


def backend() -> str:
    """The linear backend `PAGEDINFER_CPU_LINEAR` asks for (default onednn)."""
    choice = os.environ.get(ENV_VAR, "").strip().lower() or "onednn"
    if choice not in BACKENDS:
        raise ValueError(f"{ENV_VAR}={choice!r}: expected one of {', '.join(BACKENDS)}")
    return choice


def onednn_available() -> bool:
    """Whether this torch build has oneDNN and its packed-linear ops."""
    return bool(
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """The `[out, in]` weight in oneDNN's blocked layout (an opaque mkldnn tensor of the same shape)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


@torch.library.custom_op("pagedinfer::onednn_linear", mutates_args=())
def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The packed GEMM as an opaque op for torch.compile (inductor lowers mkldnn's own op for constant weights only)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


@onednn_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for a weight packed by `pack_weight` (the opaque op when compiling:
    a fake tensor does not say `is_mkldnn`, so callers decide on the real weight, before tracing)."""
    if torch.compiler.is_compiling():
        return onednn_linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for a dense weight or one packed by `pack_weight` (eager callers)."""
    if weight.is_mkldnn:
        return packed_linear(x, weight, bias)
    return nn.functional.linear(x, weight, bias)


class PackedLinear(nn.Module):
    """An nn.Linear whose `weight` is packed for oneDNN (same parameter names, same results)."""

    def __init__(self, module: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = module.in_features, module.out_features
        self.weight = nn.Parameter(pack_weight(module.weight), requires_grad=False)
        self.bias = module.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


@dataclass(frozen=True)
class PackingReport:
    """What `pack_linear_weights` did to a model."""

    backend: str  # "onednn" when packed, else "aten" (F.linear)
    packed: tuple[str, ...]  # names of the modules whose weight is now packed
    skipped_shared: tuple[str, ...]  # linear layers left dense: their weight is shared (tied embeddings)


_unavailable_warned = False


def pack_linear_weights(model: nn.Module) -> PackingReport:
    """Pack, in place, the weight of every CPU linear layer of `model` (see the module's invariants).

    Packed: nn.Linear (replaced by a PackedLinear) and any module that declares
    `packable_weight = True` and computes its output with this module's `linear`
    (the tensor-parallel shards of engine/distributed/sharding.py): its weight
    parameter is swapped for the packed one.
    """
    global _unavailable_warned
    if backend() == "aten":
        return PackingReport("aten", (), ())
    if not onednn_available():
        if not _unavailable_warned:
            logger.warning("this torch build has no oneDNN packed linear ops: CPU linear layers use F.linear")
            _unavailable_warned = True
        return PackingReport("aten", (), ())
    uses: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        uses[id(param)] = uses.get(id(param), 0) + 1
    packed, shared = [], []
    for name, module in list(model.named_modules()):
        weight = getattr(module, "weight", None)
        is_linear = type(module) is nn.Linear
        if not (is_linear or getattr(module, "packable_weight", False)) or not isinstance(weight, nn.Parameter):
            continue
        if weight.device.type != "cpu" or weight.is_mkldnn or weight.dtype not in PACKED_DTYPES:
            continue
        if uses[id(weight)] > 1:
            shared.append(name)
            continue
        if is_linear:
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, child, PackedLinear(module))
        else:
            module.weight = nn.Parameter(pack_weight(weight), requires_grad=False)
        packed.append(name)
    return PackingReport("onednn", tuple(packed), tuple(shared))
