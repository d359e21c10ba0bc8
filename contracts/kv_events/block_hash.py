"""The prefix cache's block hash: the key a KV event names a block by, one definition for engine and router.

A full block's hash chains over its parent's hash (the seed for a first block) and its token ids, so
equal prefixes hash equally in every process and a block's hash stands for its whole prefix: the
engine's block pool keys its cache by it, the router recomputes it from a prompt to find the longest
cached prefix. The algorithm is named in the KV-event discovery answer (`HASH_ALGORITHM`).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

ROOT_HASH_SEED = b"pagedinfer-prefix-cache-v1"
HASH_ALGORITHM = "blake2b-128(parent or seed, int64-le token ids)"  # named in the KV-event discovery answer


def hash_block_tokens(parent_hash: bytes | None, token_ids: Sequence[int], extra_keys: tuple = ()) -> bytes:
    """Hash of one full block, chained to its parent (None for the first block).

    A pure function of (parent hash, token ids, extra keys) with a seeded root,
    so equal prefixes hash equally in every process.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(parent_hash if parent_hash is not None else ROOT_HASH_SEED)
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    if extra_keys:
        h.update(repr(extra_keys).encode())
    return h.digest()
