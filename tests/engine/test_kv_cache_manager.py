"""KV cache manager: prefix hits in tokens, copy-on-write forks, swapping."""

from pagedinfer.engine.kv_cache_manager import KVCacheManager
from pagedinfer.engine.sampling_params import SamplingParams
from pagedinfer.engine.sequence import Sequence


def seq(tokens):
    return Sequence(request_id="r", prompt_token_ids=list(tokens), params=SamplingParams(), arrival_time=0.0)


def run_prefill(kv, s):
    hits = kv.get_computed_blocks(s)
    kv.allocate(s, s.num_tokens - len(hits) * kv.block_size, hits)
    kv.record_admission(s, len(hits) * kv.block_size, readmitted=False)
    s.num_computed_tokens = s.num_tokens
    kv.cache_computed_blocks(s)
    return len(hits) * kv.block_size


def test_second_request_sharing_three_blocks_hits_48_tokens():
    kv = KVCacheManager(num_gpu_blocks=32, block_size=16)
    prefix = list(range(100, 148))  # 3 full blocks
    first = seq(prefix + [1, 2, 3])
    assert run_prefill(kv, first) == 0
    second = seq(prefix + [7, 8, 9, 10])
    assert run_prefill(kv, second) == 48
    assert kv.block_ids(first)[:3] == kv.block_ids(second)[:3]
    stats = kv.stats()
    assert stats.prefix_cache_hit_tokens == 48
    assert stats.prefix_cache_query_tokens == first.num_tokens + second.num_tokens
    kv.free(first)
    kv.free(second)
    assert kv.stats().num_free_blocks == 32
    kv.check_invariants()


def test_a_fully_cached_prompt_still_computes_its_last_token():
    kv = KVCacheManager(num_gpu_blocks=8, block_size=16)
    a = seq(range(32))
    run_prefill(kv, a)
    kv.free(a)
    b = seq(range(32))
    assert len(kv.get_computed_blocks(b)) == 1  # 31 tokens may hit: only the first full block


def test_fork_shares_blocks_and_copies_on_first_divergent_write():
    kv = KVCacheManager(num_gpu_blocks=8, block_size=4)
    parent = seq(range(6))  # blocks: [0..3], [4,5,_,_]
    run_prefill(kv, parent)
    child = seq(range(6))
    child.num_computed_tokens = parent.num_computed_tokens
    kv.fork(parent, child)
    assert kv.stats().num_used_blocks == 2  # shared, not duplicated
    parent.token_ids.append(1)
    child.token_ids.append(2)
    copies = kv.allocate(parent, 1)
    assert len(copies) == 1 and copies[0][0] == kv.block_ids(child)[1]
    assert kv.allocate(child, 1) == []  # the child now owns the old block alone
    assert kv.block_ids(parent)[0] == kv.block_ids(child)[0]
    kv.check_invariants()
    kv.free(parent)
    kv.free(child)
    assert kv.stats().num_free_blocks == 8


def test_swap_out_and_in_round_trip():
    kv = KVCacheManager(num_gpu_blocks=4, block_size=4, num_cpu_blocks=4)
    s = seq(range(7))
    run_prefill(kv, s)
    out = kv.swap_out(s)
    assert len(out) == 2 and kv.stats().num_free_blocks == 4
    assert kv.can_swap_in([(s, 1)])
    assert not kv.can_swap_in([(s, 10)])  # 17 tokens need 5 blocks of 4
    back = kv.swap_in(s)
    assert [c for c, _ in back] == [c for _, c in out]
    kv.check_invariants()
    kv.free(s)
    assert kv.stats().num_free_cpu_blocks == 4


def forked_beams(kv, num_beams):
    """A 6-token prompt (blocks [0..3], [4,5,_,_]) and num_beams beams forked from it, each with its own
    next token."""
    parent = seq(range(6))
    run_prefill(kv, parent)
    beams = [parent]
    for _ in range(num_beams - 1):
        child = seq(range(6))
        child.num_computed_tokens = parent.num_computed_tokens
        kv.fork(parent, child)
        beams.append(child)
    for i, b in enumerate(beams):
        b.token_ids.append(100 + i)
    return beams


def test_beams_writing_a_shared_last_block_copy_it_once_per_writer_but_one():
    kv = KVCacheManager(num_gpu_blocks=8, block_size=4)
    beams = forked_beams(kv, 3)
    writes = [(b, 1) for b in beams]
    assert kv.stats().num_free_blocks == 6
    assert kv.can_allocate_all(writes)
    kv.pool.reset_peak()
    copies = [c for b in beams for c in kv.allocate(b, 1)]
    assert len(copies) == 2  # the third writer owns the old block alone by then
    assert kv.stats().num_free_blocks == 4
    assert len({kv.block_ids(b)[0] for b in beams}) == 1  # the full first block stays shared
    tight = KVCacheManager(num_gpu_blocks=3, block_size=4)
    assert not tight.can_allocate_all([(b, 1) for b in forked_beams(tight, 3)])  # 2 copies, 1 free block
    kv.check_invariants()


def test_a_beam_group_swaps_out_and_in_with_its_blocks_still_shared():
    kv = KVCacheManager(num_gpu_blocks=8, block_size=4, num_cpu_blocks=4)
    beams = forked_beams(kv, 3)
    assert kv.can_swap_out(*beams)  # 2 distinct blocks, though the tables hold 6
    out = kv.swap_out(*beams)
    assert len(out) == 2 and kv.stats().num_free_cpu_blocks == 2 and kv.stats().num_free_blocks == 8
    kv.check_invariants()
    writes = [(b, 1) for b in beams]
    assert kv.can_swap_in(writes)
    back = kv.swap_in(*beams)
    assert len(back) == 2 and kv.stats().num_used_blocks == 2
    assert len({tuple(kv.block_ids(b)) for b in beams}) == 1  # one table, shared three times
    assert all(block.ref_cnt == 3 for block in kv.tables[beams[0].seq_id])
    kv.check_invariants()
    assert len([c for b in beams for c in kv.allocate(b, 1)]) == 2  # copy-on-write as before the swap
    for b in beams:
        kv.free(b)
    assert kv.stats().num_free_blocks == 8 and kv.stats().num_free_cpu_blocks == 4
    kv.check_invariants()


def test_freeing_swapped_beams_returns_each_host_block_once():
    kv = KVCacheManager(num_gpu_blocks=8, block_size=4, num_cpu_blocks=4)
    beams = forked_beams(kv, 2)
    kv.swap_out(*beams)
    kv.free(beams[0])
    assert kv.stats().num_free_cpu_blocks == 2  # the other beam still holds both
    kv.free(beams[1])
    assert kv.stats().num_free_cpu_blocks == 4
    kv.check_invariants()
