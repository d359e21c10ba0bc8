"""Tensor parallelism on CPU (gloo), N=2: same tokens as one process and as transformers.

Engines are shared per module (starting rank 1 costs a process and a model
load), one per architecture, each with prefix caching, chunked prefill and a
pool small enough to force preemption.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from greedy_reference import hf_greedy, mixed_prompts

from pagedinfer.engine import LLM, SamplingParams

ARCHS = ["llama", "qwen2", "qwen3", "mistral", "phi3"]  # GQA, q/k/v biases, q/k norms and head_dim != hidden/heads,
# sliding window; Phi-3: fused qkv and gate_up gathered whole (every rank attends over every head), o and down
# split from a whole input ("rowwise_split_input" in 5.x, "rowwise_rep" before)
MAX_TOKENS = 12
# 12 blocks of 8 tokens: one 87-token sequence fits, the batch does not -> preemption;
# 32-token steps chunk every prompt longer than that.
SETTINGS = dict(
    dtype="float32",
    device="cpu",
    block_size=8,
    num_gpu_blocks_override=12,
    max_model_len=96,
    max_num_batched_tokens=32,
    enable_prefix_caching=True,
    enable_chunked_prefill=True,
    swap_space=0.01,
)
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def engines(make_model):
    cache: dict = {}

    def get(arch: str, tp: int, mode: str = "recompute") -> LLM:
        key = (arch, tp, mode)
        if key not in cache:
            cache[key] = LLM(str(make_model(arch)), tensor_parallel_size=tp, preemption_mode=mode, **SETTINGS)
        return cache[key]

    yield get
    for llm in cache.values():
        llm.shutdown()


@pytest.fixture(scope="module")
def reference(make_model):
    cache: dict = {}

    def get(arch: str):
        if arch not in cache:
            d = make_model(arch)
            prompts = mixed_prompts(transformers.AutoConfig.from_pretrained(str(d)).vocab_size)
            cache[arch] = (prompts, hf_greedy(d, prompts, MAX_TOKENS))
        return cache[arch]

    return get


def greedy(llm: LLM, prompts) -> list[list[int]]:
    """Token ids; a second pass must hit the prefix cache and agree; no block may leak."""
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    again = llm.generate(prompts, GREEDY)
    assert sum(o.num_cached_tokens for o in again) > 0, "the second pass should hit the prefix cache"
    assert [o.outputs[0].token_ids for o in again] == got
    assert llm.get_stats().num_used_blocks == 0
    return got


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_tp2_greedy_equals_tp1_and_transformers(engines, reference, arch):
    prompts, want = reference(arch)
    tp2 = engines(arch, 2)
    assert greedy(tp2, prompts) == want
    assert greedy(engines(arch, 1), prompts) == want
    assert tp2.get_stats().num_preemptions["recompute"] > 0


@pytest.mark.slow
def test_tp2_greedy_equals_transformers_under_swap_preemption(engines, reference):
    prompts, want = reference("llama")
    tp2 = engines("llama", 2, "swap")
    assert greedy(tp2, prompts) == want
    assert tp2.get_stats().num_preemptions["swap"] > 0


@pytest.mark.slow
def test_tp2_seeded_sampling_reproduces_tp1(engines, reference):
    prompts, _ = reference("llama")
    params = [
        SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=100 + i, max_tokens=MAX_TOKENS, n=2)
        for i in range(len(prompts))
    ]
    outs = {
        tp: [[c.token_ids for c in o.outputs] for o in engines("llama", tp).generate(prompts, params)] for tp in (1, 2)
    }
    assert outs[1] == outs[2]
    assert any(a != b for a, b in outs[1]), "n=2 seeded samples should differ from each other"


@pytest.mark.slow
def test_tp2_each_rank_holds_half_of_the_sharded_weights_and_kv_heads(engines):
    one, two = engines("llama", 1).llm_engine, engines("llama", 2).llm_engine
    (rank1,) = two.runner.workers.reports
    half = one.runner.sharded_weight_bytes // 2
    assert one.runner.sharded_weight_bytes > 0.95 * one.runner.weight_bytes  # all but the norms
    assert two.runner.sharded_weight_bytes == half and rank1.sharded_weight_bytes == half
    # only the norms stay whole
    assert rank1.weight_bytes == two.runner.weight_bytes == one.runner.weight_bytes - half
    assert two.bytes_per_block * 2 == one.bytes_per_block
    assert two.runner.kv_cache.shape[-2] * 2 == one.runner.kv_cache.shape[-2]  # KV heads per rank


@pytest.mark.slow
def test_tp2_every_rank_packs_its_linear_shards_for_onednn(engines):
    """Rank 1 runs the same loader: its column shards fused (q/k/v, gate/up: engine/cpu/fused_projections.py),
    its row and LM-head shards packed too (engine/cpu/linear.py)."""
    from pagedinfer.engine.distributed import sharding

    runner = engines("llama", 2).llm_engine.runner
    (rank1,) = runner.workers.reports
    rows = [m for m in runner.model.modules() if isinstance(m, sharding.RowParallelLinear)]
    head = runner.model.get_output_embeddings()
    assert rows and all(m.weight.is_mkldnn for m in rows) and head.weight.is_mkldnn
    assert len(runner.fusion.qkv) == len(runner.fusion.gate_up) == 2
    assert len(runner.linear_packing.packed) == rank1.num_packed_linears == 2 * 4 + 1  # qkv o gate_up down, head


def test_tp_must_divide_the_head_counts(tiny_llama):
    with pytest.raises(ValueError, match=r"tensor_parallel_size: 3 must divide.*\(4\).*\(2\)"):
        LLM(str(tiny_llama), device="cpu", tensor_parallel_size=3)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        LLM(str(tiny_llama), device="cpu", tensor_parallel_size=0)


def test_tp_row_parallel_sum_matches_the_whole_layer():
    """The sharding arithmetic itself: column shards then a row shard summed over ranks = the whole MLP."""
    from pagedinfer.engine.distributed import sharding
    from pagedinfer.engine.distributed.plan_styles import chunk
    from pagedinfer.engine.distributed.sharded_layers import cut_linear

    torch.manual_seed(0)
    up, down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)
    x = torch.randn(3, 8)
    parts = []
    for rank in range(2):
        group = _FakeRanks(rank)
        col = cut_linear(up, rows=chunk(up.out_features, rank, 2))
        row = sharding.RowParallelLinear(down, group)
        row.group = _NoReduce()
        parts.append(row(col(x)) - down.bias)
    torch.testing.assert_close(sum(parts) + down.bias, down(up(x)))


class _FakeRanks:
    world_size = 2

    def __init__(self, rank: int) -> None:
        self.rank = rank


class _NoReduce:
    def all_reduce(self, t):
        return t


def test_tp_vocab_parallel_embedding_sums_to_the_whole_table():
    """Each id is looked up on the rank holding its row (odd vocabulary: the last shard is padded)."""
    from pagedinfer.engine.distributed import sharding

    torch.manual_seed(0)
    table = torch.nn.Embedding(7, 4)
    ids = torch.tensor([[0, 3, 4, 6, 1]])
    parts = []
    for rank in range(2):
        shard = sharding.VocabParallelEmbedding(table, _FakeRanks(rank))
        shard.group = _NoReduce()
        parts.append(shard(ids))
    torch.testing.assert_close(sum(parts), table(ids))
