"""Shard a transformers model following its own tensor-parallel plan.

The plan is the model's: `config.base_model_tp_plan` (globs under the base
model, e.g. "layers.*.self_attn.q_proj": "colwise") and the causal-LM
class's `_tp_plan` ("lm_head": "colwise_gather_output", "colwise_rep" before
5.x). What each style means, and what it is refused for, is
`plan_styles.py`; the layers a rank runs are `sharded_layers.py`. As in
transformers, a rule names a module or a parameter:

- a module rule of a linear kind replaces an nn.Linear (exactly that class:
  a subclass's own forward would be lost) by this rank's shard, of an
  embedding kind an nn.Embedding; REDUCE_OUTPUT hooks any module's output;
  SCALED divides the module's own parameters by N; WHOLE leaves it as it is;
- a parameter rule (attention sinks, per head: "colwise") cuts that
  parameter in place along the dimension its kind cuts: the output one for
  the column kinds (a matrix's rows, a vector's only dimension), the last
  one for the row kinds (a `bias` stays whole); a kind that needs a forward
  of its own (a gather, a reduction, an embedding's lookup) cannot apply to
  a bare parameter.

Beyond the plan, the input embedding, when the plan does not name it, is
vocab-parallel (rank r keeps the same vocab rows as its LM-head shard,
looks up the ids it holds, zeros for the others, and the ranks all-reduce),
so that every rank holds about 1/N of the weights, as the sizing
(`weights / tensor_parallel_size`) assumes. A tied LM head and embedding
share their shard. The KV heads a rank's attention sees follow from its key
projection's kind (`kv_heads_per_rank`): Phi-3's gathered qkv_proj leaves
every rank all heads (and a whole KV pool), as transformers runs it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

from pagedinfer.engine.distributed import plan_styles
from pagedinfer.engine.distributed.group import TPGroup
from pagedinfer.engine.distributed.plan_styles import EMBEDDING_KINDS, LINEAR_KINDS, Cut, Kind, chunk
from pagedinfer.engine.distributed.sharded_layers import (
    GatherOutputLinear,
    HiddenParallelEmbedding,
    RowParallelLinear,
    VocabParallelEmbedding,
    cut_linear,
    reduce_output_hook,
    take,
)

__all__ = [
    "GatherOutputLinear",
    "HiddenParallelEmbedding",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "check_divisible",
    "kv_heads_per_rank",
    "planned",
    "planned_parameter_bytes",
    "shard_model",
]

_DEFAULT_EMBEDDING_STYLE = "embedding_rowwise"  # the input embedding when the plan leaves it out
# kinds a parameter rule can apply (a cut, a scale or nothing: no forward of its own)
_CUT_PARAMETER_KINDS = (
    Kind.COLUMN,
    Kind.PACKED_COLUMN,
    Kind.UNIT_COLUMN,
    Kind.ROW,
    Kind.SPLIT_ROW,
    Kind.UNIT_ROW,
    Kind.PARTIAL_ROW,
    Kind.PACKED_PARTIAL_ROW,
)
_PARAMETER_KINDS = _CUT_PARAMETER_KINDS + (Kind.SCALED, Kind.WHOLE)


def check_divisible(num_attention_heads: int, num_kv_heads: int, tensor_parallel_size: int) -> None:
    """ValueError unless N divides both head counts (each rank holds whole heads)."""
    n = tensor_parallel_size
    if num_attention_heads % n or num_kv_heads % n:
        raise ValueError(
            f"tensor_parallel_size: {n} must divide both num_attention_heads ({num_attention_heads}) and"
            f" num_key_value_heads ({num_kv_heads}): each GPU holds whole heads"
        )


def model_plan(model: nn.Module) -> dict[str, str]:
    """Rule globs under the model's own names -> style: the base model's (under its prefix), then the head's."""
    prefix = getattr(model, "base_model_prefix", "model")
    plan = {
        f"{prefix}.{glob}": style for glob, style in (getattr(model.config, "base_model_tp_plan", None) or {}).items()
    }
    plan.update(getattr(type(model), "_tp_plan", None) or {})
    return plan


def _pattern(glob: str) -> re.Pattern:
    return re.compile("^" + re.escape(glob).replace(r"\*", r"\d+") + "$")


@dataclass(frozen=True)
class Planned:
    """What the plan changes: `modules` in the order they are sharded (the input embedding last, after
    the LM head it may share a shard with), `parameters` named by a rule of their own."""

    modules: tuple[tuple[str, str], ...]  # (module name, style), WHOLE styles left out
    parameters: tuple[tuple[str, str], ...]  # (parameter name, style), WHOLE styles left out


def planned(model: nn.Module) -> Planned:
    rules = [(_pattern(glob), style) for glob, style in model_plan(model).items()]

    def rule(name: str) -> str | None:
        return next((style for pattern, style in rules if pattern.match(name)), None)

    def changes(style: str | None) -> bool:
        return style is not None and plan_styles.STYLES.get(style) is not Kind.WHOLE

    modules = [(name, rule(name)) for name, _ in model.named_modules() if changes(rule(name))]
    parameters = [(name, rule(name)) for name, _ in model.named_parameters() if changes(rule(name))]
    embedding = model.get_input_embeddings()
    name = next((n for n, m in model.named_modules() if m is embedding), None)
    if name is not None:
        named = [entry for entry in modules if entry[0] == name]
        modules = [entry for entry in modules if entry[0] != name] + named
        # after sharding (planned_parameter_bytes) the default is already a VocabParallelEmbedding
        if modules and rule(name) is None and type(embedding) in (nn.Embedding, VocabParallelEmbedding):
            modules.append((name, _DEFAULT_EMBEDDING_STYLE))
    return Planned(tuple(modules), tuple(parameters))


def kv_heads_per_rank(model: nn.Module, num_kv_heads: int, tensor_parallel_size: int) -> int:
    """The KV heads each rank's attention computes (and its KV pool holds) under the model's plan."""
    if tensor_parallel_size == 1:
        return num_kv_heads
    return plan_styles.kv_heads_per_rank(model_plan(model), num_kv_heads, tensor_parallel_size)


def _head_dim(model: nn.Module) -> int:
    cfg = model.config.get_text_config()
    return int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)


def _divides(name: str, size: int, what: str, n: int) -> None:
    if size % n:
        raise ValueError(f"tensor_parallel_size: {n} does not divide {name}'s {size} {what} features")


def _linear_shard(name: str, module: nn.Linear, kind: Kind, group: TPGroup, head_dim: int) -> nn.Module:
    n, r = group.world_size, group.rank
    out_features, in_features = module.out_features, module.in_features
    if kind in (Kind.COLUMN, Kind.ROW, Kind.SPLIT_ROW, Kind.PARTIAL_ROW):
        _divides(
            name, out_features if kind is Kind.COLUMN else in_features, "output" if kind is Kind.COLUMN else "input", n
        )
    if kind is Kind.COLUMN:
        return cut_linear(module, rows=chunk(out_features, r, n))
    if kind is Kind.PACKED_COLUMN:
        return cut_linear(module, rows=plan_styles.packed_chunk(out_features, r, n, name))
    if kind is Kind.UNIT_COLUMN:
        return cut_linear(module, rows=plan_styles.unit_chunk(out_features, head_dim, r, n, name))
    if kind is Kind.GATHER_COLUMN:
        return GatherOutputLinear(module, group)
    if kind in (Kind.ROW, Kind.SPLIT_ROW):
        return RowParallelLinear(module, group, split_input=kind is Kind.SPLIT_ROW)
    if kind is Kind.UNIT_ROW:
        cols = plan_styles.unit_chunk(in_features, head_dim, r, n, name)
        replicas = plan_styles.unit_groups(in_features // head_dim, n)[1]
        return RowParallelLinear(module, group, cols=cols, replicas=replicas)
    if kind is Kind.PARTIAL_ROW:
        return cut_linear(module, cols=chunk(in_features, r, n))
    return cut_linear(module, cols=plan_styles.packed_chunk(in_features, r, n, name))  # PACKED_PARTIAL_ROW


def _parameter_cut(name: str, param: nn.Parameter, kind: Kind, group: TPGroup, head_dim: int) -> tuple[int, Cut] | None:
    """(dim, cut) of a parameter under a parameter rule; None: kept whole."""
    n, r = group.world_size, group.rank
    leaf = name.rsplit(".", 1)[-1]
    if kind in (Kind.COLUMN, Kind.PACKED_COLUMN, Kind.UNIT_COLUMN):
        dim = max(param.dim() - 2, 0)
    elif leaf == "bias" or (kind is Kind.PACKED_PARTIAL_ROW and param.dim() == 1):
        return None
    else:
        dim = param.dim() - 1
    size = param.shape[dim]
    if kind in (Kind.PACKED_COLUMN, Kind.PACKED_PARTIAL_ROW):
        return dim, plan_styles.packed_chunk(size, r, n, name)
    if kind in (Kind.UNIT_COLUMN, Kind.UNIT_ROW):
        return dim, plan_styles.unit_chunk(size, head_dim, r, n, name)
    _divides(name, size, f"dimension-{dim}", n)
    return dim, chunk(size, r, n)


def _set(model: nn.Module, name: str, value: nn.Module | nn.Parameter) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, value)


def shard_model(model: nn.Module, group: TPGroup) -> list[str]:
    """Apply the plan to this rank's copy of the model, in place; returns the module and parameter names changed."""
    plan = planned(model)
    if not plan.modules and not plan.parameters:
        raise ValueError(
            f"tensor_parallel_size: {type(model).__name__} declares no tensor-parallel plan"
            " (config.base_model_tp_plan); it can only run with tensor_parallel_size 1"
        )
    n, head_dim = group.world_size, _head_dim(model)
    head = model.get_output_embeddings()
    tied_weight = head.weight if head is not None else None  # the embedding's own table when tied
    module_rules = dict(plan.modules)
    parameter_rules = dict(plan.parameters)
    for name, style in plan.parameters:  # first: a parameter rule inside a replaced module would be lost
        owner = name.rpartition(".")[0]
        owner_kind = plan_styles.STYLES.get(module_rules.get(owner, ""))
        if owner_kind in LINEAR_KINDS or owner_kind in EMBEDDING_KINDS:
            raise ValueError(
                f"tensor_parallel_size: {name} has a plan rule ({style!r}) of its own inside"
                f" {owner}, which its rule ({module_rules[owner]!r}) replaces"
            )
        kind = plan_styles.kind_of(style, name)
        if kind not in _PARAMETER_KINDS:
            raise ValueError(
                f"tensor_parallel_size: plan style {style!r} of parameter {name} needs a forward"
                f" of its own ({kind.value}); a parameter has none"
            )
        param = model.get_parameter(name)
        if kind is Kind.SCALED:
            _set(model, name, nn.Parameter(param.data / n, requires_grad=False))
            continue
        cut = _parameter_cut(name, param, kind, group, head_dim)
        if cut is not None:
            _set(model, name, nn.Parameter(take(param.data, cut[0], cut[1]), requires_grad=False))
    for name, style in plan.modules:
        kind = plan_styles.kind_of(style, name)
        module = model.get_submodule(name)
        if kind in LINEAR_KINDS:
            if type(module) is not nn.Linear:
                raise ValueError(
                    f"tensor_parallel_size: plan style {style!r} for {name}, a"
                    f" {type(module).__name__}, is not supported (only nn.Linear layers are sharded)"
                )
            _set(model, name, _linear_shard(name, module, kind, group, head_dim))
        elif kind in EMBEDDING_KINDS:
            if type(module) is not nn.Embedding:
                raise ValueError(
                    f"tensor_parallel_size: plan style {style!r} for {name}, a"
                    f" {type(module).__name__}, is not supported (only nn.Embedding tables)"
                )
            if kind is Kind.HIDDEN_EMBEDDING:
                _set(model, name, HiddenParallelEmbedding(module, group))
                continue
            head = model.get_output_embeddings()
            tied = (
                isinstance(head, GatherOutputLinear)
                and head.weight.shape[1] == module.embedding_dim
                and module.weight is tied_weight
            )
            _set(model, name, VocabParallelEmbedding(module, group, head.weight if tied else None))
        elif kind is Kind.REDUCE_OUTPUT:
            module.register_forward_hook(reduce_output_hook(group))
        else:  # SCALED: the module's own parameters without a rule of their own
            for leaf, param in list(module.named_parameters(recurse=False)):
                if f"{name}.{leaf}" not in parameter_rules:
                    setattr(module, leaf, nn.Parameter(param.data / n, requires_grad=False))
    return [name for name, _ in plan.modules + plan.parameters]


def planned_parameter_bytes(model: nn.Module) -> int:
    """Bytes of the parameters the plan cuts (after sharding: this rank's shards); unknown styles count nothing."""
    plan = planned(model)
    cutting = LINEAR_KINDS + EMBEDDING_KINDS
    params = {
        id(p): p
        for name, style in plan.modules
        if plan_styles.STYLES.get(style) in cutting
        for p in model.get_submodule(name).parameters(recurse=False)
    }
    params.update(
        {
            id(p): p
            for name, style in plan.parameters
            if plan_styles.STYLES.get(style) in _CUT_PARAMETER_KINDS
            for p in (model.get_parameter(name),)
        }
    )
    return sum(p.numel() * p.element_size() for p in params.values())  # a tied head and embedding count once
