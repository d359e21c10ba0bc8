"""The tensor-parallel plan styles transformers names, what each means for one rank, and the cuts they make.

A model's plan maps module (or parameter) names to style names, and
transformers' meaning of a style is the forward its DTensor hooks produce
(`transformers/distributed/tensor_parallel.py` from 5.x, its
`integrations/tensor_parallel.py` in 4.56-5.0; which versions register which
name is in `STYLES` below, of 4.56.0, 4.57.6, 5.0.0, 5.12.1, 5.20.2 and
5.25.0, whose registries and model plans were read). For inference every
style comes down to one `Kind`: how a rank cuts the weights and what its
forward adds.

- COLUMN (`colwise`, `local_colwise`): the rank keeps its chunk of the output
  rows (weight and bias); its output stays that chunk (q/k/v: its heads).
- PACKED_COLUMN (`packed_colwise`): a weight packing two halves along the
  output ([gate; up]) keeps its chunk of each half, [gate_r; up_r], so the
  module's own `chunk(2)` still pairs them (transformers' `_StridedShard`,
  split factor 2; 5.25 cuts a 1-D bias plainly, which would pair the wrong
  halves, here the bias is cut like the rows).
- UNIT_COLUMN (`unit_colwise`): whole heads per rank; with fewer heads than
  ranks the ranks form g = gcd(heads, N) groups, rank r in group r // (N/g),
  and each group holds its 1/g of the heads (replicated within the group).
- GATHER_COLUMN (`colwise_rep` 4.56+, `colwise_gather_output` 5.x): output
  rows cut, the output gathered so every rank holds all of it (Phi-3's fused
  qkv and gate_up, LM heads): the attention after it runs on every head.
- ROW (`rowwise`): the rank keeps its chunk of the input columns; its input is
  already that chunk (a COLUMN output); the partial outputs are all-reduced,
  then the bias is added once.
- SPLIT_ROW (`rowwise_rep` 4.56+, `rowwise_split_input` 5.x): as ROW, but its
  input arrives whole and the rank takes its chunk of it (after a
  GATHER_COLUMN: Phi-3's o_proj and down_proj).
- UNIT_ROW (`unit_rowwise`): ROW over the column chunk of UNIT_COLUMN's head
  groups; replicas hold the same partials, so the sum over all ranks is
  divided by the replicas (N/g).
- PARTIAL_ROW (`local_rowwise`, 4.56-5.0 MoE plans): ROW's cut, the whole
  bias, and no reduction: a module above it sums (REDUCE_OUTPUT).
- PACKED_PARTIAL_ROW (`local_packed_rowwise` 4.56-5.0, `packed_rowwise` 5.x):
  PARTIAL_ROW with the input columns cut as two packed halves.
- VOCAB_EMBEDDING (`embedding_rowwise`): an embedding's chunk of vocab rows;
  ids outside it look up zeros; the ranks all-reduce.
- HIDDEN_EMBEDDING (`embedding_colwise`): an embedding's chunk of the hidden
  columns for every id; the ranks gather them.
- REDUCE_OUTPUT (`gather` 4.56-5.0, `all_reduce` 5.x, `moe_tp_experts` 5.x):
  any module; its output (the first element of a tuple) is all-reduced.
- SCALED (`local`, 4.56-5.0): any module, run on its own weights, each of its
  directly owned weights divided by N (transformers' IsolatedParallel: a
  REDUCE_OUTPUT above it sums the N copies back to one).
- WHOLE: no cut, no collective. `replicate`; `replicated_with_grad_allreduce`
  and `mla_kv_a_proj` (their collectives act on gradients only);
  `local_params` (a module run on its local shards: ours always are);
  `sequence_parallel` (its weights whole, the module run on the rank's own
  tokens, which in this engine are all of them: no layer here ever splits
  the sequence, every row-parallel output is reduced whole).

Refused (`REFUSED`, a ValueError naming module and style): expert-parallel
styles, which route tokens to the experts a rank holds (`grouped_gemm`,
`ep_router`, `ep_dispatch_experts`, `megamoe_router`, `megamoe_experts`,
`moe_identity_expert`): the engine shards no experts by rank.

Cuts follow torch's `Shard` (chunks of ceil(size/N), the last shorter), which
is what transformers' DTensors hold. Pure Python: no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum


class Kind(Enum):
    COLUMN = "column"
    PACKED_COLUMN = "packed column"
    UNIT_COLUMN = "unit column"
    GATHER_COLUMN = "gathered column"
    ROW = "row"
    SPLIT_ROW = "split-input row"
    UNIT_ROW = "unit row"
    PARTIAL_ROW = "partial row"
    PACKED_PARTIAL_ROW = "packed partial row"
    VOCAB_EMBEDDING = "vocab-parallel embedding"
    HIDDEN_EMBEDDING = "hidden-parallel embedding"
    REDUCE_OUTPUT = "reduced output"
    SCALED = "scaled copy"
    WHOLE = "whole"


STYLES: dict[str, Kind] = {  # the transformers versions (of those read) that register the name
    "colwise": Kind.COLUMN,  # all
    "local_colwise": Kind.COLUMN,  # 4.56-5.0
    "packed_colwise": Kind.PACKED_COLUMN,  # 5.12-5.25
    "unit_colwise": Kind.UNIT_COLUMN,  # 5.25
    "colwise_rep": Kind.GATHER_COLUMN,  # 4.56-5.0, 5.20-5.25
    "colwise_gather_output": Kind.GATHER_COLUMN,  # 5.12-5.25
    "rowwise": Kind.ROW,  # all
    "rowwise_rep": Kind.SPLIT_ROW,  # 4.56-5.0, 5.20-5.25
    "rowwise_split_input": Kind.SPLIT_ROW,  # 5.12-5.25
    "unit_rowwise": Kind.UNIT_ROW,  # 5.25
    "local_rowwise": Kind.PARTIAL_ROW,  # 4.56-5.0
    "local_packed_rowwise": Kind.PACKED_PARTIAL_ROW,  # 4.56-5.0
    "packed_rowwise": Kind.PACKED_PARTIAL_ROW,  # 5.12-5.25
    "embedding_rowwise": Kind.VOCAB_EMBEDDING,  # 5.12-5.25
    "embedding_colwise": Kind.HIDDEN_EMBEDDING,  # 5.12, 5.25
    "gather": Kind.REDUCE_OUTPUT,  # 4.56-5.0
    "all_reduce": Kind.REDUCE_OUTPUT,  # 5.12-5.25
    "moe_tp_experts": Kind.REDUCE_OUTPUT,  # 5.12-5.25 (deprecated in 5.25)
    "local": Kind.SCALED,  # 4.56-5.0
    "replicate": Kind.WHOLE,  # 4.56-5.0, 5.25
    "replicated_with_grad_allreduce": Kind.WHOLE,  # 5.12-5.25
    "mla_kv_a_proj": Kind.WHOLE,  # 5.12-5.25
    "local_params": Kind.WHOLE,  # 5.25
    "sequence_parallel": Kind.WHOLE,  # all
}
EXPERT_PARALLEL = (
    "grouped_gemm",
    "ep_router",
    "ep_dispatch_experts",
    "megamoe_router",
    "megamoe_experts",
    "moe_identity_expert",
)
REFUSED: dict[str, str] = {
    name: "expert parallelism (experts routed to the rank holding them) is not implemented" for name in EXPERT_PARALLEL
}

# kinds whose output chunk is this rank's heads when they hold the attention keys
HEAD_SPLITTING = (Kind.COLUMN, Kind.UNIT_COLUMN)
# transformers' names of the projections that hold the attention keys (get_kv_heads_per_rank's)
KEY_PROJECTIONS = ("k_proj", "qkv_proj", "query_key_value")
LINEAR_KINDS = (
    Kind.COLUMN,
    Kind.PACKED_COLUMN,
    Kind.UNIT_COLUMN,
    Kind.GATHER_COLUMN,
    Kind.ROW,
    Kind.SPLIT_ROW,
    Kind.UNIT_ROW,
    Kind.PARTIAL_ROW,
    Kind.PACKED_PARTIAL_ROW,
)
EMBEDDING_KINDS = (Kind.VOCAB_EMBEDDING, Kind.HIDDEN_EMBEDDING)


def kind_of(style: str, where: str) -> Kind:
    """The style's kind; ValueError naming `where` (the module or parameter), the style and the supported ones."""
    if style in STYLES:
        return STYLES[style]
    why = REFUSED.get(style, "transformers style unknown to this engine")
    raise ValueError(
        f"tensor_parallel_size: plan style {style!r} of {where} is not supported ({why});"
        f" supported: {', '.join(STYLES)}"
    )


@dataclass(frozen=True)
class Cut:
    """The index ranges [start, stop) a rank keeps along one dimension, in order (concatenated)."""

    ranges: tuple[tuple[int, int], ...]

    @property
    def size(self) -> int:
        return sum(stop - start for start, stop in self.ranges)


def chunk(size: int, rank: int, world_size: int) -> Cut:
    """torch's Shard: rank r keeps [r*c, (r+1)*c) with c = ceil(size/N), clipped to size (possibly empty)."""
    c = -(-size // world_size)
    return Cut(((min(rank * c, size), min((rank + 1) * c, size)),))


def packed_chunk(size: int, rank: int, world_size: int, where: str) -> Cut:
    """Rank r's chunk of each of two packed halves, [half0_r, half1_r]; ValueError unless 2N divides size."""
    if size % (2 * world_size):
        raise ValueError(f"tensor_parallel_size: {world_size} does not divide each packed half of {where}'s {size}")
    half, c = size // 2, size // (2 * world_size)
    return Cut(tuple((h * half + rank * c, h * half + (rank + 1) * c) for h in range(2)))


def unit_groups(num_units: int, world_size: int) -> tuple[int, int]:
    """(groups, replicas): N ranks as gcd(units, N) groups of N/groups ranks that hold the same units."""
    groups = math.gcd(num_units, world_size)
    return groups, world_size // groups


def unit_chunk(size: int, unit: int, rank: int, world_size: int, where: str) -> Cut:
    """The whole units (heads of `unit` features) of rank r's group; ValueError unless `unit` divides size."""
    if unit <= 0 or size % unit:
        raise ValueError(f"tensor_parallel_size: {where}'s {size} features are not whole heads of {unit}")
    groups, replicas = unit_groups(size // unit, world_size)
    per_group, group = size // groups, rank // replicas
    return Cut(((group * per_group, (group + 1) * per_group),))


def kv_heads_per_rank(plan: dict[str, str], num_kv_heads: int, world_size: int) -> int:
    """The KV heads each rank's attention sees (and its KV pool holds) under `plan` (name -> style).

    Split only when a key projection's output is this rank's chunk (COLUMN: 1/N of the heads;
    UNIT_COLUMN: 1/gcd(heads, N)); gathered, replicated or unplanned keys leave every rank all heads.
    """
    kinds = {STYLES.get(style) for name, style in plan.items() if name.rsplit(".", 1)[-1] in KEY_PROJECTIONS}
    if Kind.COLUMN in kinds:
        return num_kv_heads // world_size
    if Kind.UNIT_COLUMN in kinds:
        return num_kv_heads // unit_groups(num_kv_heads, world_size)[0]
    return num_kv_heads
