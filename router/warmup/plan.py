"""Which hot prefixes to replay to which engine (pure).

- A new engine (scale-up, a rollout's new pod): the K hottest prefixes it
  does not already hold, hottest first, while their tokens fit the budget.
- A scale-in (or rollout) victim: each of the K hottest prefixes the victim
  holds (at least its first block) and no survivor holds whole goes to the
  survivor the prefix policy would send that tenant to next (`policy.pick`
  over the survivors: the ring from its first block, bounded load), each
  survivor's list within the budget. The tenant's next request is then a hit
  where it lands.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pagedinfer.router.hashing import num_cached_blocks, prefix_block_hashes
from pagedinfer.router.policy import EngineView, pick
from pagedinfer.router.warmup.hotness import HotPrefix
from pagedinfer.router.warmup.settings import WarmupSettings


@dataclass(frozen=True)
class Replay:
    """One warm-up prefill: `token_ids` to `engine`, under `model`."""

    engine: str
    model: str
    token_ids: tuple[int, ...]


def _within_budget(replays: list[Replay], settings: WarmupSettings) -> list[Replay]:
    """The longest head of `replays` (hottest first) with at most K entries and token_budget tokens."""
    kept, tokens = [], 0
    for r in replays[: settings.prefixes]:
        if tokens + len(r.token_ids) > settings.token_budget:
            break
        kept.append(r)
        tokens += len(r.token_ids)
    return kept


def for_new_engine(
    hot: Sequence[HotPrefix], engine: EngineView, block_size: int, settings: WarmupSettings
) -> list[Replay]:
    """The replays that warm a new engine (hot: hottest first)."""
    replays = []
    for entry in hot:
        hashes = prefix_block_hashes(entry.token_ids, block_size)
        if num_cached_blocks(hashes, engine.cached_hashes) < len(hashes):
            replays.append(Replay(engine.name, entry.key[0], tuple(entry.token_ids)))
    return _within_budget(replays, settings)


def for_victim(
    hot: Sequence[HotPrefix],
    victim: EngineView,
    survivors: Sequence[EngineView],
    block_size: int,
    settings: WarmupSettings,
) -> list[Replay]:
    """The replays that hand a leaving engine's hot prefixes to the survivors, grouped by survivor in order."""
    if not survivors:
        return []
    by_engine: dict[str, list[Replay]] = {s.name: [] for s in survivors}
    for entry in hot[: settings.prefixes]:
        hashes = prefix_block_hashes(entry.token_ids, block_size)
        if num_cached_blocks(hashes, victim.cached_hashes) == 0:
            continue
        if any(num_cached_blocks(hashes, s.cached_hashes) == len(hashes) for s in survivors):
            continue
        target = pick("prefix", survivors, hashes, block_size, hashes[0], 0).engine
        by_engine[target].append(Replay(target, entry.key[0], tuple(entry.token_ids)))
    return [r for name in by_engine for r in _within_budget(by_engine[name], settings)]
