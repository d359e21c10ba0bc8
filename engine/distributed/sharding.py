"""Shard a transformers model's linear layers following its own tensor-parallel plan.

The plan is the model's: `config.base_model_tp_plan` (module patterns of the
base model, e.g. "layers.*.self_attn.q_proj": "colwise") and the causal-LM
class's `_tp_plan` ("lm_head": "colwise_gather_output"). Styles:
- colwise: rank r keeps rows [r*out/N, (r+1)*out/N) of the weight (and bias);
  q/k/v then hold heads [r*H/N, (r+1)*H/N), gate/up 1/N of the MLP;
- rowwise: rank r keeps the matching input columns; its partial output is
  summed over the ranks (all-reduce) before the bias is added once;
- colwise_gather_output: the LM head's vocab rows, its logits gathered so that
  every rank holds the full row (padded to a multiple of N, then trimmed);
- replicated_*: left whole (norms).
Beyond the plan, the input embedding is vocab-parallel too (rank r keeps the
same vocab rows as its LM-head shard, looks up the ids it holds, zeros for the
others, and the ranks all-reduce), so that every rank holds about 1/N of the
weights, as the sizing (`weights / tensor_parallel_size`) assumes. A tied LM
head and embedding share their shard.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from pagedinfer.engine.cpu.linear import linear
from pagedinfer.engine.distributed.group import TPGroup

_REPLICATED = ("replicated_with_grad_allreduce", "replicated")
_VOCAB = "embedding_vocab_parallel"  # our own style for the input embedding


def check_divisible(num_attention_heads: int, num_kv_heads: int, tensor_parallel_size: int) -> None:
    """ValueError unless N divides both head counts (each rank holds whole heads)."""
    n = tensor_parallel_size
    if num_attention_heads % n or num_kv_heads % n:
        raise ValueError(
            f"tensor_parallel_size: {n} must divide both num_attention_heads ({num_attention_heads}) and"
            f" num_key_value_heads ({num_kv_heads}): each GPU holds whole heads")


class RowParallelLinear(nn.Module):
    """y = all_reduce(x[..., shard] @ W[:, shard]^T) + b: this rank's input columns, summed over ranks."""

    packable_weight = True  # engine/cpu/linear.py may pack `weight` for oneDNN on a CPU

    def __init__(self, linear: nn.Linear, group: TPGroup) -> None:
        super().__init__()
        n, r = group.world_size, group.rank
        cols = linear.in_features // n
        self.in_features, self.out_features = cols, linear.out_features
        self.weight = nn.Parameter(linear.weight.data[:, r * cols:(r + 1) * cols].clone(), requires_grad=False)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.data.clone(), requires_grad=False)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.group.all_reduce(linear(x, self.weight))
        return y if self.bias is None else y + self.bias


def _vocab_rows(weight: torch.Tensor, group: TPGroup) -> torch.Tensor:
    """Rank r's rows [r*ceil(V/N), (r+1)*ceil(V/N)) of a [V, hidden] table, zero-padded to ceil(V/N)."""
    rows = -(-weight.shape[0] // group.world_size)
    shard = weight[group.rank * rows:(group.rank + 1) * rows]
    padded = torch.zeros(rows, weight.shape[1], dtype=weight.dtype, device=weight.device)
    padded[: shard.shape[0]] = shard
    return padded


class VocabParallelEmbedding(nn.Module):
    """Rank r holds vocab rows [r*R, (r+1)*R); each id is looked up on the rank holding it, then all-reduced."""

    def __init__(self, embedding: nn.Embedding, group: TPGroup, weight: nn.Parameter | None = None) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = embedding.num_embeddings, embedding.embedding_dim
        self.weight = weight if weight is not None else \
            nn.Parameter(_vocab_rows(embedding.weight.data, group), requires_grad=False)
        self.first_id = group.rank * self.weight.shape[0]
        self.group = group

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.first_id
        held = (local >= 0) & (local < self.weight.shape[0])
        out = nn.functional.embedding(torch.where(held, local, 0), self.weight)
        return self.group.all_reduce(out * held.unsqueeze(-1).to(out.dtype))


class GatherOutputLinear(nn.Module):
    """The LM head: this rank's vocab rows (zero-padded to out_per_rank), logits gathered whole on every rank."""

    packable_weight = True  # packed on a CPU unless tied to the VocabParallelEmbedding (then shared, left dense)

    def __init__(self, linear: nn.Linear, group: TPGroup) -> None:
        super().__init__()
        self.out_features = linear.out_features
        self.weight = nn.Parameter(_vocab_rows(linear.weight.data, group), requires_grad=False)
        self.bias = None if linear.bias is None else \
            nn.Parameter(_vocab_rows(linear.bias.data[:, None], group)[:, 0], requires_grad=False)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = linear(x, self.weight, self.bias)
        return self.group.all_gather_last_dim(local)[..., : self.out_features]


def _column(linear: nn.Linear, group: TPGroup) -> nn.Linear:
    n, r = group.world_size, group.rank
    rows = linear.out_features // n
    out = nn.Linear(linear.in_features, rows, bias=linear.bias is not None,
                    dtype=linear.weight.dtype, device="meta")
    out.weight = nn.Parameter(linear.weight.data[r * rows:(r + 1) * rows].clone(), requires_grad=False)
    if linear.bias is not None:
        out.bias = nn.Parameter(linear.bias.data[r * rows:(r + 1) * rows].clone(), requires_grad=False)
    return out


def _pattern(glob: str) -> re.Pattern:
    return re.compile("^" + re.escape(glob).replace(r"\*", r"\d+") + "$")


def planned_modules(model: nn.Module) -> list[tuple[str, str]]:
    """(module name, style) of every module the model's own plans split (replicated ones left out)."""
    plan: dict[str, str] = {}
    prefix = getattr(model, "base_model_prefix", "model")
    for glob, style in (getattr(model.config, "base_model_tp_plan", None) or {}).items():
        plan[f"{prefix}.{glob}"] = style
    plan.update(getattr(type(model), "_tp_plan", None) or {})
    rules = [(_pattern(glob), style) for glob, style in plan.items()]
    found = []
    for name, _ in model.named_modules():
        style = next((s for pattern, s in rules if pattern.match(name)), None)
        if style is not None and style not in _REPLICATED:
            found.append((name, style))
    embedding = model.get_input_embeddings()
    if found and isinstance(embedding, (nn.Embedding, VocabParallelEmbedding)):
        found.append((next(n for n, m in model.named_modules() if m is embedding), _VOCAB))
    return found


def _divides(name: str, linear: nn.Linear, style: str, n: int) -> None:
    size = linear.in_features if style == "rowwise" else linear.out_features
    if size % n:
        raise ValueError(f"tensor_parallel_size: {n} does not divide {name}'s {size} "
                         f"{'input' if style == 'rowwise' else 'output'} features")


def shard_model(model: nn.Module, group: TPGroup) -> list[str]:
    """Replace the planned linear layers by this rank's shards, in place; returns the sharded names."""
    n = group.world_size
    planned = planned_modules(model)
    if not planned:
        raise ValueError(f"tensor_parallel_size: {type(model).__name__} declares no tensor-parallel plan"
                         " (config.base_model_tp_plan); it can only run with tensor_parallel_size 1")
    head = model.get_output_embeddings()
    tied_weight = head.weight if head is not None else None  # the embedding's own table when tied
    sharded: list[str] = []
    for name, style in planned:
        module = model.get_submodule(name)
        if style != _VOCAB and not isinstance(module, nn.Linear):
            raise ValueError(f"tensor_parallel_size: plan style {style!r} for {name}, a"
                             f" {type(module).__name__}, is not supported (only nn.Linear layers are sharded)")
        if style == "colwise":
            _divides(name, module, style, n)
            new: nn.Module = _column(module, group)
        elif style == "rowwise":
            _divides(name, module, style, n)
            new = RowParallelLinear(module, group)
        elif style == "colwise_gather_output":
            new = GatherOutputLinear(module, group)
        elif style == _VOCAB:
            head = model.get_output_embeddings()
            tied = isinstance(head, GatherOutputLinear) and head.weight.shape[1] == module.embedding_dim \
                and module.weight is tied_weight
            new = VocabParallelEmbedding(module, group, head.weight if tied else None)
        else:
            raise ValueError(f"tensor_parallel_size: plan style {style!r} of {name} is not supported"
                             " (colwise, rowwise, colwise_gather_output, replicated)")
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, new)
        sharded.append(name)
    return sharded


def planned_parameter_bytes(model: nn.Module) -> int:
    """Bytes of the parameters of the layers the plan splits (after sharding: this rank's shards)."""
    params = {id(p): p for name, _ in planned_modules(model) for p in model.get_submodule(name).parameters()}
    return sum(p.numel() * p.element_size() for p in params.values())  # a tied head and embedding count once
