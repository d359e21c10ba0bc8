"""Block pool: reference counts, the prefix cache, and its eviction order."""

import pytest

from pagedinfer.contracts.kv_events.block_hash import hash_block_tokens
from pagedinfer.engine.block_pool import Block, BlockPool, FreeBlockQueue


def test_hash_is_chained_seeded_and_pure():
    a = hash_block_tokens(None, [1, 2, 3])
    assert a == hash_block_tokens(None, [1, 2, 3])
    assert a != hash_block_tokens(None, [1, 2, 4])
    assert hash_block_tokens(a, [5]) != hash_block_tokens(None, [5])
    assert hash_block_tokens(None, [1], ("lora", 1)) != hash_block_tokens(None, [1])


def test_free_queue_removes_from_the_middle_and_rejects_double_free():
    blocks = [Block(i) for i in range(4)]
    q = FreeBlockQueue(blocks)
    q.remove(blocks[2])
    assert [b.block_id for b in q] == [0, 1, 3]
    with pytest.raises(RuntimeError, match="already free"):
        q.append(blocks[0])
    assert q.popleft() is blocks[0]


def test_allocate_and_free_round_trip():
    pool = BlockPool(4)
    got = pool.allocate(3)
    assert pool.num_free_blocks == 1 and pool.num_used_blocks == 3
    with pytest.raises(RuntimeError):
        pool.allocate(2)
    pool.free(got)
    assert pool.num_free_blocks == 4
    with pytest.raises(RuntimeError, match="freed twice"):
        pool.free([got[0]])
    pool.check_invariants()


def test_freed_block_keeps_its_hash_until_reallocated():
    pool = BlockPool(2)
    (b,) = pool.allocate(1)
    h = hash_block_tokens(None, [1, 2])
    pool.cache_block(b, h, [1, 2])
    pool.free([b])
    assert pool.num_cached_free_blocks == 1
    assert pool.lookup(h, [1, 2]) is b  # still reusable while free
    pool.touch(b)
    assert b.ref_cnt == 1 and pool.num_cached_free_blocks == 0
    pool.free([b])
    pool.allocate(2)  # reallocation evicts the hash
    assert pool.lookup(h, [1, 2]) is None
    pool.check_invariants()


def test_hash_collision_is_never_reused():
    pool = BlockPool(2)
    (b,) = pool.allocate(1)
    h = hash_block_tokens(None, [1, 2])
    pool.cache_block(b, h, [1, 2])
    assert pool.lookup(h, [9, 9]) is None  # same hash, other tokens: a miss


def test_eviction_is_lru_and_tail_first_within_a_chain():
    pool = BlockPool(6)
    chain_a = pool.allocate(3)
    chain_b = pool.allocate(3)
    parent = None
    for i, b in enumerate(chain_a + chain_b):
        parent = hash_block_tokens(parent, [i])
        pool.cache_block(b, parent, [i])
    pool.free(reversed(chain_a))  # freed first: evicted first, tail before head
    pool.free(reversed(chain_b))
    order = [pool.allocate(1)[0] for _ in range(6)]
    assert order == list(reversed(chain_a)) + list(reversed(chain_b))
