"""Every transformers tensor-parallel plan style, at the sharding level: the weights each rank keeps, and
that the ranks' sharded math equals the whole layer's (ranks as threads: tests/support/thread_ranks.py).

Whole tiny models and the installed transformers' styles: tests/engine/test_tp_sharded_models.py; the
end-to-end runs (N processes, greedy output equal to transformers' generate, Phi-3 among them):
tests/engine/test_tensor_parallel.py.
"""

from __future__ import annotations

import pytest
import torch
from thread_ranks import ThreadRanks
from thread_ranks import shard_on_ranks as sharded
from torch import nn

from pagedinfer.engine.distributed import plan_styles
from pagedinfer.engine.distributed.plan_styles import chunk, packed_chunk, unit_chunk
from pagedinfer.engine.distributed.sharded_layers import (
    GatherOutputLinear,
    HiddenParallelEmbedding,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from pagedinfer.engine.distributed.sharding import planned_parameter_bytes

CLOSE = dict(rtol=1e-5, atol=1e-5)


# ----- the cuts ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "size, n, want",
    [
        (8, 2, [((0, 4),), ((4, 8),)]),
        (7, 2, [((0, 4),), ((4, 7),)]),  # torch's Shard: ceil chunks, the last shorter
        (5, 4, [((0, 2),), ((2, 4),), ((4, 5),), ((5, 5),)]),
    ],
)
def test_chunk_is_torch_shard(size, n, want):
    assert [chunk(size, r, n).ranges for r in range(n)] == want


def test_packed_chunk_takes_the_same_chunk_of_each_half():
    assert [packed_chunk(8, r, 2, "w").ranges for r in range(2)] == [((0, 2), (4, 6)), ((2, 4), (6, 8))]
    with pytest.raises(ValueError, match="packed half of w"):
        packed_chunk(6, 0, 2, "w")


@pytest.mark.parametrize(
    "heads, n, groups",
    [
        (2, 4, [0, 0, 1, 1]),  # fewer heads than ranks: h0 h0 h1 h1
        (6, 4, [0, 0, 1, 1]),  # gcd 2: h0h1h2 on ranks 0 and 1, h3h4h5 on 2 and 3
        (8, 4, [0, 1, 2, 3]),  # plain colwise
    ],
)
def test_unit_chunk_keeps_whole_heads_in_gcd_groups(heads, n, groups):
    head_dim, g = 3, len(set(groups))
    per = heads // g * head_dim
    assert [unit_chunk(heads * head_dim, head_dim, r, n, "k").ranges for r in range(n)] == [
        ((grp * per, (grp + 1) * per),) for grp in groups
    ]


@pytest.mark.parametrize(
    "plan, kv, n, want",
    [
        ({"model.layers.*.self_attn.k_proj": "colwise"}, 4, 2, 2),  # llama
        ({"model.layers.*.self_attn.qkv_proj": "colwise_gather_output"}, 4, 2, 4),  # phi3 5.x: gathered
        ({"model.layers.*.self_attn.qkv_proj": "colwise_rep"}, 4, 2, 4),  # phi3 4.56
        ({"model.layers.*.self_attn.k_proj": "unit_colwise"}, 2, 4, 1),  # minicpm5_moe
        ({"model.layers.*.mlp.up_proj": "colwise"}, 4, 2, 4),  # keys not in the plan
        ({"model.layers.*.attention.query_key_value": "colwise"}, 8, 4, 2),  # gpt_neox
    ],
)
def test_kv_heads_per_rank_follow_the_key_projection(plan, kv, n, want):
    assert plan_styles.kv_heads_per_rank(plan, kv, n) == want


# ----- a toy model with a plan ---------------------------------------------------------------------------------


class _Config:
    def __init__(self, plan: dict[str, str], head_dim: int) -> None:
        self.base_model_tp_plan, self.head_dim = plan, head_dim

    def get_text_config(self) -> _Config:
        return self


class Toy(nn.Module):
    """Modules under `model.`, planned by `plan` (globs without the prefix, as a config's)."""

    base_model_prefix = "model"

    def __init__(self, plan: dict[str, str], head_dim: int = 4, **modules: nn.Module) -> None:
        super().__init__()
        self.config = _Config(plan, head_dim)
        self.model = nn.Module()
        for name, module in modules.items():
            setattr(self.model, name, module)

    def get_input_embeddings(self):
        return None

    def get_output_embeddings(self):
        return None


def _linear(i: int, o: int, bias: bool = True) -> nn.Linear:
    return nn.Linear(i, o, bias=bias)


def on_ranks(ranks: ThreadRanks, copies: list[nn.Module], fn) -> list:
    with torch.no_grad():
        return ranks.run(lambda group: fn(copies[group.rank].model))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("style", ["colwise", "local_colwise"])
def test_colwise_keeps_its_output_rows_and_the_chunks_are_the_whole_output(style):
    up = _linear(6, 8)
    x = torch.randn(3, 6)
    ranks, copies = sharded(Toy({"up": style}, up=up), 2)
    for r, c in enumerate(copies):
        assert type(c.model.up) is nn.Linear
        torch.testing.assert_close(c.model.up.weight, up.weight[4 * r : 4 * (r + 1)])
        torch.testing.assert_close(c.model.up.bias, up.bias[4 * r : 4 * (r + 1)])
    outs = on_ranks(ranks, copies, lambda m: m.up(x))
    torch.testing.assert_close(torch.cat(outs, -1), up(x))


def test_packed_colwise_keeps_its_chunk_of_gate_and_of_up_and_the_mlp_sums_to_the_whole():
    gate_up, down = _linear(6, 16), _linear(8, 6)

    def mlp(m_gate_up, m_down, x):
        gate, up = m_gate_up(x).chunk(2, dim=-1)
        return m_down(nn.functional.silu(gate) * up)

    x = torch.randn(3, 6)
    ranks, copies = sharded(Toy({"gate_up": "packed_colwise", "down": "rowwise"}, gate_up=gate_up, down=down), 2)
    rows = [list(range(0, 4)) + list(range(8, 12)), list(range(4, 8)) + list(range(12, 16))]
    for r, c in enumerate(copies):
        torch.testing.assert_close(c.model.gate_up.weight, gate_up.weight[rows[r]])
        torch.testing.assert_close(c.model.gate_up.bias, gate_up.bias[rows[r]])  # cut like the rows
    outs = on_ranks(ranks, copies, lambda m: mlp(m.gate_up, m.down, x))
    for out in outs:
        torch.testing.assert_close(out, mlp(gate_up, down, x), **CLOSE)


def test_unit_colwise_replicates_too_few_heads_and_unit_rowwise_divides_the_replicas_out():
    # 2 heads of 4 over 4 ranks: ranks 0, 1 hold head 0 and ranks 2, 3 head 1; o sums over the 2 groups
    v, o = _linear(6, 8), _linear(8, 6)
    x = torch.randn(3, 6)
    ranks, copies = sharded(Toy({"v": "unit_colwise", "o": "unit_rowwise"}, head_dim=4, v=v, o=o), 4)
    for r, c in enumerate(copies):
        head = slice(4 * (r // 2), 4 * (r // 2 + 1))
        torch.testing.assert_close(c.model.v.weight, v.weight[head])
        torch.testing.assert_close(c.model.o.weight, o.weight[:, head])
        assert c.model.o.replicas == 2
    for out in on_ranks(ranks, copies, lambda m: m.o(m.v(x))):
        torch.testing.assert_close(out, o(v(x)), **CLOSE)


@pytest.mark.parametrize("style", ["colwise_rep", "colwise_gather_output"])
def test_gathered_columns_give_every_rank_the_whole_output(style):
    qkv = _linear(6, 7)  # odd: the last rank's chunk is shorter, padded for the gather
    x = torch.randn(2, 5, 6)
    ranks, copies = sharded(Toy({"qkv": style}, qkv=qkv), 2)
    assert all(isinstance(c.model.qkv, GatherOutputLinear) and c.model.qkv.weight.shape == (4, 6) for c in copies)
    torch.testing.assert_close(copies[1].model.qkv.weight[:3], qkv.weight[4:])
    for out in on_ranks(ranks, copies, lambda m: m.qkv(x)):
        torch.testing.assert_close(out, qkv(x), **CLOSE)


@pytest.mark.parametrize("style", ["rowwise_rep", "rowwise_split_input"])
def test_split_input_rows_take_their_chunk_of_a_whole_input_and_add_the_bias_once(style):
    o = _linear(8, 6)
    x = torch.randn(3, 8)  # whole on every rank, as a gathered qkv leaves it
    ranks, copies = sharded(Toy({"o": style}, o=o), 2)
    for r, c in enumerate(copies):
        assert isinstance(c.model.o, RowParallelLinear) and c.model.o.split_input
        torch.testing.assert_close(c.model.o.weight, o.weight[:, 4 * r : 4 * (r + 1)])
    for out in on_ranks(ranks, copies, lambda m: m.o(x)):
        torch.testing.assert_close(out, o(x), **CLOSE)


def test_rowwise_takes_a_column_chunk_as_it_is_and_adds_the_bias_once():
    up, down = _linear(6, 8), _linear(8, 6)
    x = torch.randn(3, 6)
    ranks, copies = sharded(Toy({"up": "colwise", "down": "rowwise"}, up=up, down=down), 2)
    assert not copies[0].model.down.split_input
    for out in on_ranks(ranks, copies, lambda m: m.down(m.up(x))):
        torch.testing.assert_close(out, down(up(x)), **CLOSE)


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = _linear(6, 8), _linear(8, 6, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


@pytest.mark.parametrize("reduce", ["gather", "all_reduce", "moe_tp_experts"])
def test_local_rowwise_leaves_a_partial_sum_that_a_reducing_parent_completes(reduce):
    # transformers 4.56's MoE plans: local_colwise / local_rowwise inside a module whose output is gathered
    mlp = _Mlp()
    x = torch.randn(3, 6)
    plan = {"mlp": reduce, "mlp.up": "local_colwise", "mlp.down": "local_rowwise"}
    ranks, copies = sharded(Toy(plan, mlp=mlp), 2)
    for r, c in enumerate(copies):
        assert type(c.model.mlp.down) is nn.Linear
        torch.testing.assert_close(c.model.mlp.down.weight, mlp.down.weight[:, 4 * r : 4 * (r + 1)])
    for out in on_ranks(ranks, copies, lambda m: m.mlp(x)):
        torch.testing.assert_close(out, mlp(x), **CLOSE)


def test_local_rowwise_keeps_the_whole_bias_on_every_rank_and_reduces_nothing():
    down = _linear(8, 6)
    x = torch.randn(3, 8)
    _, copies = sharded(Toy({"down": "local_rowwise"}, down=down), 2)
    assert all(torch.equal(c.model.down.bias, down.bias) for c in copies)
    with torch.no_grad():  # no collective: each rank's partial sum plus the whole bias
        parts = [c.model.down(x[:, 4 * r : 4 * (r + 1)]) for r, c in enumerate(copies)]
    torch.testing.assert_close(sum(p - down.bias for p in parts) + down.bias, down(x), **CLOSE)


class _Experts(nn.Module):
    """Llama 4's experts: bmm with [experts, hidden, 2*inter] (gate and up packed last) and [experts, inter, hidden]."""

    def __init__(self, experts: int = 3, hidden: int = 6, inter: int = 4) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.randn(experts, hidden, 2 * inter))
        self.down_proj = nn.Parameter(torch.randn(experts, inter, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [experts, tokens, hidden]
        gate, up = torch.bmm(x, self.gate_up_proj).chunk(2, dim=-1)
        return torch.bmm(nn.functional.silu(gate) * up, self.down_proj)


@pytest.mark.parametrize("packed, reduce", [("packed_rowwise", "moe_tp_experts"), ("local_packed_rowwise", "gather")])
def test_packed_rowwise_expert_parameters_sum_to_the_whole_under_their_reducing_module(packed, reduce):
    experts = _Experts()
    x = torch.randn(3, 5, 6)
    plan = {"experts": reduce, "experts.gate_up_proj": packed, "experts.down_proj": "colwise"}
    ranks, copies = sharded(Toy(plan, experts=experts), 2)
    for r, c in enumerate(copies):
        keep = [2 * r, 2 * r + 1, 4 + 2 * r, 4 + 2 * r + 1]  # the rank's chunk of gate and of up
        torch.testing.assert_close(c.model.experts.gate_up_proj, experts.gate_up_proj[..., keep])
        torch.testing.assert_close(c.model.experts.down_proj, experts.down_proj[:, 2 * r : 2 * (r + 1)])
    for out in on_ranks(ranks, copies, lambda m: m.experts(x)):
        torch.testing.assert_close(out, experts(x), **CLOSE)


def test_packed_rowwise_linear_takes_its_chunk_of_each_packed_input_half():
    gate_up, fused_down = _linear(6, 8), _linear(8, 6)
    x = torch.randn(3, 6)
    ranks, copies = sharded(
        Toy({"gate_up": "packed_colwise", "fused_down": "packed_rowwise"}, gate_up=gate_up, fused_down=fused_down), 2
    )
    for r, c in enumerate(copies):
        keep = [2 * r, 2 * r + 1, 4 + 2 * r, 4 + 2 * r + 1]
        torch.testing.assert_close(c.model.fused_down.weight, fused_down.weight[:, keep])
        assert torch.equal(c.model.fused_down.bias, fused_down.bias)  # whole: a reducing parent sums the ranks
    with torch.no_grad():
        parts = [c.model.fused_down(c.model.gate_up(x)) - fused_down.bias for c in copies]
    torch.testing.assert_close(sum(parts) + fused_down.bias, fused_down(gate_up(x)), **CLOSE)


def test_local_divides_a_replicated_module_so_its_gathered_copies_sum_to_one():
    block = nn.Sequential(_linear(6, 6))
    x = torch.randn(3, 6)
    ranks, copies = sharded(Toy({"block": "gather", "block.0": "local"}, block=block), 2)
    torch.testing.assert_close(copies[0].model.block[0].weight, block[0].weight / 2)
    torch.testing.assert_close(copies[1].model.block[0].bias, block[0].bias / 2)
    for out in on_ranks(ranks, copies, lambda m: m.block(x)):
        torch.testing.assert_close(out, block(x), **CLOSE)


def test_embedding_rowwise_is_vocab_parallel():
    table = nn.Embedding(7, 4)
    ids = torch.tensor([[0, 3, 4, 6, 1]])
    ranks, copies = sharded(Toy({"embed": "embedding_rowwise"}, embed=table), 2)
    assert all(isinstance(c.model.embed, VocabParallelEmbedding) for c in copies)
    torch.testing.assert_close(copies[1].model.embed.weight[:3], table.weight[4:])
    for out in on_ranks(ranks, copies, lambda m: m.embed(ids)):
        torch.testing.assert_close(out, table(ids))


def test_embedding_colwise_gathers_every_ranks_hidden_columns():
    table = nn.Embedding(7, 5)  # odd hidden: the last rank's columns are padded for the gather
    ids = torch.tensor([[0, 3, 6]])
    ranks, copies = sharded(Toy({"embed": "embedding_colwise"}, embed=table), 2)
    assert all(isinstance(c.model.embed, HiddenParallelEmbedding) for c in copies)
    torch.testing.assert_close(copies[0].model.embed.weight, table.weight[:, :3])
    for out in on_ranks(ranks, copies, lambda m: m.embed(ids)):
        torch.testing.assert_close(out, table(ids))


@pytest.mark.parametrize(
    "style", ["replicate", "replicated_with_grad_allreduce", "mla_kv_a_proj", "local_params", "sequence_parallel"]
)
def test_styles_acting_on_gradients_only_leave_the_module_whole(style):
    norm, up = nn.LayerNorm(6), _linear(6, 8)
    ranks, copies = sharded(Toy({"norm": style, "up": "colwise"}, norm=norm, up=up), 2)
    for c in copies:
        assert type(c.model.norm) is nn.LayerNorm and torch.equal(c.model.norm.weight, norm.weight)
        assert not c.model.norm._forward_hooks


def test_a_parameter_rule_cuts_that_parameter_and_a_row_bias_stays_whole():
    # gpt-oss / granite_swa attention sinks: one value per head, cut like the heads ("colwise", 4.56's
    # "local_rowwise"); a parameter without a rule of its own is left as its module is
    attn = nn.Module()
    attn.sinks, attn.gates = nn.Parameter(torch.arange(4.0)), nn.Parameter(torch.arange(4.0))
    attn.proj = _linear(4, 3)
    plan = {
        "attn": "local_params",
        "attn.sinks": "colwise",
        "attn.gates": "local_rowwise",
        "attn.proj.weight": "rowwise",
        "attn.proj.bias": "rowwise",
    }
    _, copies = sharded(Toy(plan, attn=attn), 2)
    for r, c in enumerate(copies):
        assert c.model.attn.sinks.tolist() == c.model.attn.gates.tolist() == [2.0 * r, 2.0 * r + 1]
        torch.testing.assert_close(c.model.attn.proj.weight, attn.proj.weight[:, 2 * r : 2 * (r + 1)])
        assert torch.equal(c.model.attn.proj.bias, attn.proj.bias)


@pytest.mark.parametrize("style", plan_styles.EXPERT_PARALLEL + ("no_such_style",))
def test_expert_parallel_and_unknown_styles_are_value_errors_naming_module_style_and_the_supported(style):
    with pytest.raises(
        ValueError,
        match=rf"plan style '{style}' of model\.experts is not supported .*"
        r"supported: colwise, local_colwise, .*rowwise_split_input",
    ):
        sharded(Toy({"experts": style, "up": "colwise"}, experts=nn.Linear(4, 4), up=_linear(4, 4)), 2)


def test_a_linear_style_on_another_module_or_a_forward_style_on_a_parameter_is_a_value_error():
    with pytest.raises(ValueError, match=r"'rowwise' for model\.norm, a LayerNorm, is not supported"):
        sharded(Toy({"norm": "rowwise"}, norm=nn.LayerNorm(4)), 2)
    attn = nn.Module()
    attn.sinks = nn.Parameter(torch.zeros(4))
    with pytest.raises(ValueError, match=r"'colwise_gather_output' of parameter model\.attn\.sinks needs a forward"):
        sharded(Toy({"attn.sinks": "colwise_gather_output"}, attn=attn), 2)


def test_planned_parameter_bytes_count_the_cut_weights_only():
    up, norm = _linear(6, 8), nn.LayerNorm(6)
    toy = Toy({"up": "colwise", "norm": "replicate"}, up=up, norm=norm)
    assert planned_parameter_bytes(toy) == (6 * 8 + 8) * 4
    _, copies = sharded(toy, 2)
    assert planned_parameter_bytes(copies[0]) == (6 * 8 + 8) * 4 // 2
