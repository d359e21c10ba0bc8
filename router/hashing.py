"""The engine's block hashes of a token sequence, computed on the router (no torch).

One definition: `pagedinfer.contracts.kv_events.block_hash.hash_block_tokens`, chained over
full blocks. A prompt's i-th full block is cached on an engine iff its hash is
in that engine's set, and because the hash chains over every earlier block,
the longest cached prefix is the first miss.
"""

from __future__ import annotations

from collections.abc import Sequence

from pagedinfer.contracts.kv_events.block_hash import hash_block_tokens


def prefix_block_hashes(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """Chained hashes of every full block of token_ids (a partial last block has none)."""
    hashes: list[bytes] = []
    parent = None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes


def num_cached_blocks(block_hashes: Sequence[bytes], cached: set[bytes] | frozenset[bytes]) -> int:
    """How many leading blocks are cached (the longest cached prefix, in blocks)."""
    n = 0
    for h in block_hashes:
        if h not in cached:
            break
        n += 1
    return n
