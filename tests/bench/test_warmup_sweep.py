"""bench/warmup_sweep.py's pure parts: the settings it takes, and what its table compares against K 0."""

from __future__ import annotations

import pytest
from lifecycle_trace import warmup_tokens_in
from warmup_sweep import parse_settings, percentile, summary_table, sweep_table


def test_settings_are_k_and_budget_pairs_one_of_them_without_warm_up():
    assert [(s.prefixes, s.token_budget) for s in parse_settings("0:32768,8:16384")] == [(0, 32768), (8, 16384)]
    with pytest.raises(ValueError, match="K:BUDGET"):
        parse_settings("0:32768,8")
    with pytest.raises(ValueError, match="turn warm-up off"):
        parse_settings("4:32768,8:32768")


def test_percentile_is_the_nearest_rank():
    assert percentile(list(range(1, 11)), 0.9) == 9 and percentile([5.0], 0.9) == 5.0
    assert percentile(list(range(1, 11)), 0.5) == 5


def row(k: int, warmup: int, recomputed: int, ttft: list[float]) -> dict:
    return {
        "prefixes": k,
        "token_budget": 32768,
        "warmup_tokens": warmup,
        "recomputed_tokens": recomputed,
        "recomputed_first_quarter": 0,
        "event_seconds": 60.0,
        "probe_ttft_ms": ttft,
        "load_start": 2.0,
        "load_peak": 3.0,
    }


def test_the_table_gives_each_settings_saving_per_warm_up_token_and_ttft_against_k_0():
    lines = sweep_table([row(8, 8192, 20_000, [110.0, 130.0]), row(0, 0, 30_000, [100.0, 120.0])]).splitlines()
    assert lines[2].startswith("| 0 |") and "| - |" in lines[2]  # sorted by K; K 0 saves nothing
    assert "| 10,000 | 1.22 |" in lines[3] and "| +10 / +10 ms |" in lines[3]


def test_the_summary_compares_each_sweep_with_its_own_k_0_run():
    first = [row(0, 0, 30_000, [100.0]), row(8, 8192, 20_000, [110.0])]
    second = [row(0, 0, 25_000, [100.0]), row(8, 8192, 21_000, [130.0])]
    line = summary_table([first, second]).splitlines()[2]
    assert line == "| 8 | 32,768 | 2 | 8,192 | 7,000 (4,000 .. 10,000) | 0.85 | +20 / +20 ms |"


def test_the_routers_warm_up_tokens_are_summed_over_its_event_labels():
    text = (
        "# TYPE pagedinfer_router_warmup_prompt_tokens_total counter\n"
        'pagedinfer_router_warmup_prompt_tokens_total{event="new-engine"} 8192.0\n'
        'pagedinfer_router_warmup_prompt_tokens_total{event="hand-off"} 1024.0\n'
        'pagedinfer_router_warmup_prompt_tokens_created{event="hand-off"} 1.7e9\n'
    )
    assert warmup_tokens_in(text) == 9216 and warmup_tokens_in("") == 0
