"""Warm-up, the pure parts: the hotness table the router keeps from its own traffic, and which prefixes are
replayed to a new engine and, when an engine leaves, to which survivor."""

import pytest

from pagedinfer.router.hashing import prefix_block_hashes
from pagedinfer.router.policy import EngineView, pick
from pagedinfer.router.warmup import plan
from pagedinfer.router.warmup.hotness import HotnessTable
from pagedinfer.router.warmup.settings import WarmupSettings

B = 4  # block size


def tenant(t, turn=0, system_blocks=3):
    """Tenant t's prompt at `turn`: its system prompt (system_blocks blocks) and the turns so far."""
    return [1000 * (t + 1) + i for i in range(system_blocks * B)] + [7 * t + i for i in range(turn * B + 2)]


def held(*prompts):
    return frozenset(h for p in prompts for h in prefix_block_hashes(p, B))


def test_a_tenants_entry_is_the_blocks_its_requests_share_and_its_score_counts_them():
    table = HotnessTable(B)
    table.observe("m", tenant(0, turn=2))
    assert table.hottest()[0].token_ids == tenant(0, turn=2)[:20]  # whole blocks only
    table.observe("m", tenant(0, turn=3))
    assert table.hottest()[0].token_ids == tenant(0, turn=2)[:20]  # turn 3 extends turn 2: still shared
    table.observe("m", tenant(0, turn=0) + [5, 5, 5, 5, 5])
    assert table.hottest()[0].token_ids == tenant(0)[:12]  # the system prompt: what all three share
    for _ in range(2):
        table.observe("m", tenant(1))
    assert [e.key[1][0] for e in table.hottest()] == [1000, 2000]  # 3 requests before 2
    table.observe("m", [1, 2])  # shorter than a block: nothing to cache
    assert len(table.entries) == 2 and table.tick == 5


def test_scores_decay_so_a_tenant_that_stopped_fades_below_a_current_one():
    table = HotnessTable(B, half_life_requests=2)
    for _ in range(4):
        table.observe("m", tenant(0))
    for _ in range(3):
        table.observe("m", tenant(1))
    assert table.hottest()[0].key[1][0] == 2000  # 4 requests, 3 half-lives ago: 0.5 < 3 recent ones
    table.observe("other-model", tenant(1))
    assert len(table.entries) == 3  # the model is part of the key: a replay names it


def test_the_table_is_bounded_and_evicts_the_coldest():
    table = HotnessTable(B, max_entries=2, max_prefix_tokens=6)
    table.observe("m", tenant(0))
    table.observe("m", tenant(0))
    table.observe("m", tenant(1))
    table.observe("m", tenant(2))
    assert sorted(e.key[1][0] for e in table.entries.values()) == [1000, 3000]
    assert all(len(e.token_ids) == 4 for e in table.entries.values())  # capped to whole blocks
    with pytest.raises(ValueError):
        HotnessTable(0)


def hot_table(*counts):
    table = HotnessTable(B)
    for t, n in enumerate(counts):
        for _ in range(n):
            table.observe("m", tenant(t, turn=1))
    return table.hottest()


def test_a_new_engine_gets_the_k_hottest_it_lacks_within_the_token_budget():
    hot = hot_table(5, 4, 3, 2)  # each prefix 16 tokens (4 whole blocks of 18)
    new = EngineView("new", 0, held(tenant(1, turn=1)))
    replays = plan.for_new_engine(hot, new, B, WarmupSettings(prefixes=2, token_budget=1000))
    assert [r.token_ids[0] for r in replays] == [1000, 3000]  # tenant 1's it holds already
    assert all(r.engine == "new" and r.model == "m" for r in replays)
    assert len(plan.for_new_engine(hot, EngineView("new", 0), B, WarmupSettings(4, 40))) == 2  # 2 x 16 <= 40
    assert plan.for_new_engine(hot, EngineView("new", 0), B, WarmupSettings(4, 15)) == []


def test_a_victims_hot_prefixes_go_where_the_policy_will_send_those_tenants_next():
    hot = hot_table(5, 4, 3, 2)
    victim = EngineView("victim", 3, held(*(tenant(t, turn=1) for t in (0, 1, 2))))
    survivors = [EngineView("a", 1, held(tenant(2, turn=1))), EngineView("b", 1), EngineView("c", 1)]
    replays = plan.for_victim(hot, victim, survivors, B, WarmupSettings(prefixes=4, token_budget=1000))
    assert sorted(r.token_ids[0] for r in replays) == [1000, 2000]  # not 3: a survivor holds it; not 4: victim lacks it
    for r in replays:
        hashes = prefix_block_hashes(list(r.token_ids), B)
        assert r.engine == pick("prefix", survivors, hashes, B, hashes[0], 0).engine
    assert plan.for_victim(hot, victim, [], B, WarmupSettings()) == []
    assert plan.for_victim(hot, victim, survivors, B, WarmupSettings(prefixes=1)) != []  # the hottest only
    assert len(plan.for_victim(hot, victim, survivors, B, WarmupSettings(prefixes=1))) == 1


def test_warmup_settings_refuse_negative_values_and_zero_turns_it_off():
    assert not WarmupSettings(prefixes=0).enabled and not WarmupSettings(token_budget=0).enabled
    with pytest.raises(ValueError, match="prefixes"):
        WarmupSettings(prefixes=-1)
