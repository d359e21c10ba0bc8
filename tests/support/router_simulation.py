"""A router's decisions over a fixed request sequence: 16 tenants' growing conversations on 4 engines.

Each decision sees the in-flight counts and the blocks each engine reported
after serving, as a router fed by KV events would. Used to check that two
router processes agree.
"""

from __future__ import annotations

import random

from pagedinfer.router.hashing import prefix_block_hashes
from pagedinfer.router.policy import EngineView, pick

BLOCK_SIZE = 4
ENGINES = ("a", "b", "c", "d")


def requests(num_requests: int = 400, seed: int = 1) -> list[list[int]]:
    rng = random.Random(seed)
    tenants = [[rng.randrange(1000) for _ in range(32)] for _ in range(16)]
    out = []
    for _ in range(num_requests):
        t = rng.randrange(16)
        tenants[t] = tenants[t] + [rng.randrange(1000) for _ in range(rng.randrange(4, 12))]
        out.append(list(tenants[t]))
    return out


def choices(policy: str = "prefix") -> list[str]:
    caches: dict[str, set[bytes]] = {n: set() for n in ENGINES}
    inflight = {n: 0 for n in ENGINES}
    out = []
    for i, prompt in enumerate(requests()):
        hashes = prefix_block_hashes(prompt, BLOCK_SIZE)
        views = [EngineView(n, inflight[n], caches[n]) for n in ENGINES]
        engine = pick(policy, views, hashes, BLOCK_SIZE, hashes[0], i).engine
        out.append(engine)
        caches[engine].update(hashes)
        inflight[engine] += 1
        if i % 3 == 0:  # one request finishes everywhere
            for n in inflight:
                inflight[n] = max(0, inflight[n] - 1)
    return out
