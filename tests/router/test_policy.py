"""The picker, table by table: pure decisions over engine views."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedinfer.router.hashing import prefix_block_hashes
from pagedinfer.router.policy import SATURATION_SLACK, EngineView, bounded_load_capacity, pick

BS = 4
SUPPORT = Path(__file__).resolve().parents[1] / "support"
PROMPT = list(range(20))  # 5 full blocks
H = prefix_block_hashes(PROMPT, BS)


def views(*specs):
    """specs: (name, inflight, number of the prompt's leading blocks cached)."""
    return [EngineView(name, load, frozenset(H[:cached])) for name, load, cached in specs]


@pytest.mark.parametrize(
    "specs, engine, matched, reason",
    [
        ([("a", 0, 0), ("b", 0, 3)], "b", 12, "prefix-hit"),  # the longest cached prefix wins
        ([("a", 0, 2), ("b", 1, 5)], "b", 20, "prefix-hit"),  # a little load does not move a hit
        ([("a", 0, 2), ("b", 0, 2)], "a", 8, "prefix-hit"),  # equal match and load: ring order, deterministic
        ([("a", 0, 0), ("b", SATURATION_SLACK + 1, 5)], "a", 0, "prefix-spread"),  # saturated: spread
        ([("a", 0, 1), ("b", SATURATION_SLACK + 1, 5)], "a", 4, "prefix-spread"),  # spread to the next best match
    ],
)
def test_prefix_policy(specs, engine, matched, reason):
    d = pick("prefix", views(*specs), H, BS, H[0], 0)
    assert (d.engine, d.matched_tokens, d.reason) == (engine, matched, reason)


def test_an_unknown_prefix_goes_by_consistent_hashing_and_the_same_key_meets_the_same_engine():
    engines = views(("a", 0, 0), ("b", 0, 0), ("c", 0, 0), ("d", 0, 0))
    chosen = {pick("prefix", engines, [], BS, bytes([k]), 0).engine for k in range(64)}
    assert chosen == {"a", "b", "c", "d"}  # keys spread over the ring
    for k in range(64):
        assert len({pick("prefix", engines, [], BS, bytes([k]), t).engine for t in range(5)}) == 1


def test_consistent_hashing_skips_an_engine_over_its_bounded_load():
    key = b"tenant-7"
    idle = views(("a", 0, 0), ("b", 0, 0), ("c", 0, 0))
    home = pick("prefix", idle, [], BS, key, 0).engine
    loaded = [EngineView(v.name, 10 if v.name == home else 0) for v in idle]
    assert 10 >= bounded_load_capacity([10, 0, 0])
    assert pick("prefix", loaded, [], BS, key, 0).engine != home


def test_removing_an_engine_moves_only_its_keys():
    four = views(("a", 0, 0), ("b", 0, 0), ("c", 0, 0), ("d", 0, 0))
    three = [v for v in four if v.name != "d"]
    for k in range(200):
        before = pick("prefix", four, [], BS, k.to_bytes(2, "big"), 0).engine
        after = pick("prefix", three, [], BS, k.to_bytes(2, "big"), 0).engine
        assert before == "d" or before == after


@pytest.mark.parametrize(
    "policy, loads, turn, engine",
    [
        ("round-robin", (0, 0, 0), 0, "a"),
        ("round-robin", (0, 0, 0), 4, "b"),
        ("least-load", (3, 1, 2), 0, "b"),
    ],
)
def test_load_policies(policy, loads, turn, engine):
    d = pick(policy, [EngineView(n, load) for n, load in zip("abc", loads)], H, BS, H[0], turn)
    assert (d.engine, d.reason) == (engine, policy)


def test_bad_policy_and_no_engine_are_value_errors():
    with pytest.raises(ValueError, match="policy"):
        pick("random", views(("a", 0, 0)), H, BS, H[0], 0)
    with pytest.raises(ValueError, match="no healthy engine"):
        pick("prefix", [], H, BS, H[0], 0)


def test_two_routers_fed_the_same_requests_agree_on_at_least_99_percent_of_choices():
    """Two router processes (different hash seeds, so nothing may hang on Python's hash()) replay the same
    requests, each applying the cache its chosen engines report and the same finishes."""
    import json
    import subprocess
    import sys

    code = "import json, router_simulation; print(json.dumps(router_simulation.choices()))"
    runs = [
        subprocess.run(
            [sys.executable, "-P", "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            cwd="/",
            env={"PYTHONHASHSEED": seed, "PYTHONPATH": str(SUPPORT)},
        )
        for seed in ("1", "2")
    ]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr + runs[1].stderr
    first, second = (json.loads(r.stdout) for r in runs)
    agree = sum(a == b for a, b in zip(first, second)) / len(first)
    assert len(first) == 400 and agree >= 0.99
    assert len(set(first)) == 4  # and the tenants spread over every engine


def tiered(name, load, device, tier):
    """An engine holding the prompt's leading blocks: indices in `device` on its device, in `tier` in its tier."""
    return EngineView(name, load, frozenset(H[i] for i in device), frozenset(H[i] for i in tier))


@pytest.mark.parametrize(
    "device, tier, cost, score",
    [
        ((0, 1, 2), (), 0.25, 3.0),  # all on the device
        ((), (0, 1, 2), 0.25, 2.25),  # all in the tier: each block less its copy
        ((0,), (1, 2), 0.25, 2.5),  # the head on the device, the tail in the tier
        ((0, 2), (), 0.25, 1.0),  # a gap ends the prefix: the chain cannot skip a block
        ((), (0, 1), 1.0, 0.0),  # a copy as dear as the compute gains nothing
    ],
)
def test_a_tier_hit_scores_below_a_device_hit_by_its_copy_cost(device, tier, cost, score):
    from pagedinfer.router.policy import score_tiered_prefix

    v = tiered("a", 0, device, tier)
    assert score_tiered_prefix(H, v.cached_hashes, v.tier_hashes, cost) == score


def test_the_tier_hit_cost_is_copy_over_compute_capped_at_one():
    from pagedinfer.router.policy import tier_hit_cost

    assert tier_hit_cost(0.001, 0.01) == pytest.approx(0.1)
    assert tier_hit_cost(0.02, 0.01) == 1.0
    with pytest.raises(ValueError):
        tier_hit_cost(0.001, 0)


@pytest.mark.parametrize(
    "a, b, engine, matched",
    [
        (((0, 1, 2), ()), ((), (0, 1, 2)), "a", 12),  # the same blocks: the device holder wins
        (((0, 1), ()), ((), (0, 1, 2, 3)), "b", 16),  # two more blocks in b's tier outweigh the copies
        (((0,), (1, 2)), ((0, 1), ()), "a", 12),  # a third block, even from the tier, beats a shorter device hit
    ],
)
def test_the_picker_weighs_tier_hits(a, b, engine, matched):
    decision = pick("prefix", [tiered("a", 0, *a), tiered("b", 0, *b)], H, BS, H[0], 0)
    assert (decision.engine, decision.matched_tokens, decision.reason) == (engine, matched, "prefix-hit")


def _tenant(t, turns):
    """Tenant t's prompt after `turns` turns: a 3-block system prompt, then 2 blocks per turn."""
    return [1000 * (t + 1) + i for i in range(3 * BS)] + [100 * (t + 1) + i for i in range(2 * BS * turns)]


def test_a_warmed_idle_engine_takes_a_share_of_saturated_engines_hot_tenants_each_as_a_hit():
    """Engines a and b hold 8 tenants' conversations between them and are saturated; c has just been warmed with
    every tenant's system prompt (router/warmup). Requests to a saturated holder go to c, each matching the warmed
    prefix (a hit, no recompute of the system prompt), until c is as loaded as the others: a share moves, not all."""
    convs = {t: prefix_block_hashes(_tenant(t, 3), BS) for t in range(8)}
    system = {t: h[:3] for t, h in convs.items()}
    load = {"a": 6, "b": 6, "c": 0}
    held = {
        "a": {x for t in range(0, 8, 2) for x in convs[t]},
        "b": {x for t in range(1, 8, 2) for x in convs[t]},
        "c": {x for t in range(8) for x in system[t]},
    }
    moved = []
    for t in range(8):
        engines = [EngineView(n, load[n], frozenset(held[n])) for n in ("a", "b", "c")]
        d = pick("prefix", engines, convs[t], BS, convs[t][0], 0)
        if d.engine == "c":
            assert (d.matched_tokens, d.reason) == (3 * BS, "prefix-spread")  # the warmed system prompt
            moved.append(t)
        else:
            assert d.matched_tokens == len(convs[t]) * BS  # stays where its whole conversation is
        load[d.engine] += 1
    assert 0 < len(moved) < 8 and load["c"] <= min(load["a"], load["b"]) + SATURATION_SLACK


def test_no_tenant_moves_to_a_warmed_engine_while_its_holder_is_within_the_slack():
    convs = {t: prefix_block_hashes(_tenant(t, 3), BS) for t in range(4)}
    a = EngineView("a", SATURATION_SLACK, frozenset(x for h in convs.values() for x in h))
    c = EngineView("c", 0, frozenset(x for h in convs.values() for x in h[:3]))
    for _t, hashes in convs.items():
        d = pick("prefix", [a, c], hashes, BS, hashes[0], 0)
        assert (d.engine, d.reason) == ("a", "prefix-hit")  # a longer match on a holder not saturated: no move
