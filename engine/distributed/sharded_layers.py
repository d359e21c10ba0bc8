"""One rank's layers under each plan kind (`plan_styles.py`): the weights it keeps and the collective it adds.

Invariants:
- every shard holds copies of its ranges (`take`), never views of the whole
  weight: the whole one is freed once the model's module is replaced;
- a row-parallel layer adds its bias once, after the sum over the ranks;
- gathered outputs and embeddings are padded to the same width on every rank
  (a collective moves equal sizes), then trimmed: the result is torch's
  `Shard` chunking (ceil(size/N) per rank, the last shorter) put back whole;
- the weights a oneDNN pack may replace are the `weight` parameters of the
  modules that declare `packable_weight` and compute through
  `engine/cpu/linear.linear` (`engine/cpu/linear.pack_linear_weights`).
"""

from __future__ import annotations

import torch
from torch import nn

from pagedinfer.engine.cpu.linear import linear
from pagedinfer.engine.distributed.group import TPGroup
from pagedinfer.engine.distributed.plan_styles import Cut, chunk


def take(tensor: torch.Tensor, dim: int, cut: Cut) -> torch.Tensor:
    """A contiguous copy of `tensor`'s `cut` ranges along `dim`, concatenated in order."""
    parts = [tensor.narrow(dim, start, stop - start) for start, stop in cut.ranges]
    return torch.cat(parts, dim=dim) if len(parts) > 1 else parts[0].clone().contiguous()


def _param(tensor: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(tensor, requires_grad=False)


def cut_linear(module: nn.Linear, rows: Cut | None = None, cols: Cut | None = None) -> nn.Linear:
    """A plain nn.Linear of the weight's `rows` (output, bias cut alike) and `cols` (input, bias whole)."""
    weight = module.weight.data
    if rows is None and cols is None:
        weight = weight.clone()
    if rows is not None:
        weight = take(weight, 0, rows)
    if cols is not None:
        weight = take(weight, 1, cols)
    out = nn.Linear(weight.shape[1], weight.shape[0], bias=module.bias is not None, dtype=weight.dtype, device="meta")
    out.weight = _param(weight)
    if module.bias is not None:
        out.bias = _param(take(module.bias.data, 0, rows) if rows is not None else module.bias.data.clone())
    return out


class RowParallelLinear(nn.Module):
    """y = all_reduce(x_r @ W[:, cols]^T) / replicas + b: this rank's input columns, summed over the ranks.

    x_r is the input as it arrives (ROW: already this rank's chunk) or its `cols` taken here
    (`split_input`: SPLIT_ROW, the input whole on every rank). `replicas` > 1 (UNIT_ROW): that many ranks
    hold each column group, so the sum over all N ranks counts every partial `replicas` times.
    """

    packable_weight = True  # engine/cpu/linear.py may pack `weight` for oneDNN on a CPU

    def __init__(
        self, module: nn.Linear, group: TPGroup, cols: Cut | None = None, split_input: bool = False, replicas: int = 1
    ) -> None:
        super().__init__()
        self.cols = cols if cols is not None else chunk(module.in_features, group.rank, group.world_size)
        self.in_features, self.out_features = self.cols.size, module.out_features
        self.weight = _param(take(module.weight.data, 1, self.cols))
        self.bias = None if module.bias is None else _param(module.bias.data.clone())
        self.split_input, self.replicas = split_input, replicas
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.split_input:
            x = take(x, -1, self.cols)
        y = self.group.all_reduce(linear(x, self.weight))
        if self.replicas > 1:
            y = y / self.replicas
        return y if self.bias is None else y + self.bias


def _padded_chunk(weight: torch.Tensor, dim: int, group: TPGroup) -> torch.Tensor:
    """Rank r's `chunk` of `weight` along `dim`, zero-padded to ceil(size/N) (a collective moves equal sizes)."""
    size = weight.shape[dim]
    width = -(-size // group.world_size)
    shard = take(weight, dim, chunk(size, group.rank, group.world_size))
    if shard.shape[dim] == width:
        return shard
    shape = list(weight.shape)
    shape[dim] = width
    padded = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
    padded.narrow(dim, 0, shard.shape[dim]).copy_(shard)
    return padded


def _vocab_rows(weight: torch.Tensor, group: TPGroup) -> torch.Tensor:
    """Rank r's rows [r*ceil(V/N), (r+1)*ceil(V/N)) of a [V, hidden] table, zero-padded to ceil(V/N)."""
    return _padded_chunk(weight, 0, group)


def _check_plain(embedding: nn.Embedding, name: str) -> None:
    if embedding.max_norm is not None:
        raise ValueError(f"tensor_parallel_size: {name} renormalizes its rows (max_norm); a shard cannot")


class VocabParallelEmbedding(nn.Module):
    """Rank r holds vocab rows [r*R, (r+1)*R); each id is looked up on the rank holding it, then all-reduced."""

    def __init__(self, embedding: nn.Embedding, group: TPGroup, weight: nn.Parameter | None = None) -> None:
        super().__init__()
        _check_plain(embedding, "the vocab-parallel embedding")
        self.num_embeddings, self.embedding_dim = embedding.num_embeddings, embedding.embedding_dim
        self.weight = weight if weight is not None else _param(_vocab_rows(embedding.weight.data, group))
        self.first_id = group.rank * self.weight.shape[0]
        self.group = group

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.first_id
        held = (local >= 0) & (local < self.weight.shape[0])
        out = nn.functional.embedding(torch.where(held, local, 0), self.weight)
        return self.group.all_reduce(out * held.unsqueeze(-1).to(out.dtype))


class HiddenParallelEmbedding(nn.Module):
    """Rank r holds hidden columns [r*C, (r+1)*C) of every row; the ranks' lookups are gathered (then trimmed)."""

    def __init__(self, embedding: nn.Embedding, group: TPGroup) -> None:
        super().__init__()
        _check_plain(embedding, "the hidden-parallel embedding")
        self.num_embeddings, self.embedding_dim = embedding.num_embeddings, embedding.embedding_dim
        self.weight = _param(_padded_chunk(embedding.weight.data, 1, group))
        self.group = group

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = nn.functional.embedding(input_ids, self.weight)
        return self.group.all_gather_last_dim(local)[..., : self.embedding_dim]


class GatherOutputLinear(nn.Module):
    """Output rows cut, output gathered whole on every rank (zero-padded to out_per_rank, then trimmed).

    The LM head's vocab rows (its shard shared with a tied VocabParallelEmbedding), or any GATHER_COLUMN linear
    (Phi-3's qkv_proj, gate_up_proj).
    """

    packable_weight = True  # packed on a CPU unless tied to the VocabParallelEmbedding (then shared, left dense)

    def __init__(self, module: nn.Linear, group: TPGroup) -> None:
        super().__init__()
        self.in_features, self.out_features = module.in_features, module.out_features
        self.weight = _param(_vocab_rows(module.weight.data, group))
        self.bias = None if module.bias is None else _param(_vocab_rows(module.bias.data[:, None], group)[:, 0])
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = linear(x, self.weight, self.bias)
        return self.group.all_gather_last_dim(local)[..., : self.out_features]


def reduce_output_hook(group: TPGroup):
    """A forward hook summing a module's output over the ranks (a tuple's first element), in place."""

    def hook(module: nn.Module, args, output):
        if isinstance(output, torch.Tensor):
            return group.all_reduce(output)
        if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
            return (group.all_reduce(output[0]),) + output[1:]
        raise TypeError(
            f"tensor_parallel_size: a reduced-output module returned {type(output).__name__},"
            " not a tensor or a tuple starting with one"
        )

    return hook
