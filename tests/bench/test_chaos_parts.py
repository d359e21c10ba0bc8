"""bench/chaos.py's pure parts: what counts as a phantom hit, and when the router's view has converged.
Cheap: synthetic answers and samples; the script itself (engine processes, a router, proxies) is run by hand."""

from __future__ import annotations

from chaos import Run, Sample, convergence_seconds, stale_outside_silence, summarize

A, B = "http://127.0.0.12:1", "http://127.0.0.13:2"


def test_a_phantom_hit_is_a_routed_hit_answered_with_no_cached_token_and_a_partial_one_is_counted_apart():
    run = Run("eviction", heartbeats=True, answers=[(0, 0), (0, 32), (64, 64), (64, 0), (64, 16), (32, 48)])
    row = summarize(run)
    assert (row["requests"], row["routed_hits"], row["phantom_hits"], row["partial_hits"]) == (6, 4, 1, 1)
    assert row["phantom_fraction"] == 0.25


def test_convergence_waits_for_every_engine_to_reach_its_target_unstale_and_says_none_when_it_never_does():
    samples = [
        Sample(10.0, {A: (4, False), B: (6, False)}),
        Sample(10.2, {A: (5, True), B: (7, False)}),
        Sample(10.5, {A: (5, False), B: (7, False)}),
        Sample(11.0, {A: (9, False), B: (9, False)}),
    ]
    run = Run("silence", heartbeats=True, samples=samples)
    assert abs(convergence_seconds(run, 10.1, {A: 5, B: 7}, until=20.0) - 0.4) < 1e-9  # 10.2 was still stale
    assert convergence_seconds(run, 10.1, {A: 5, B: 7}, until=10.4) is None  # not by the window's end
    assert convergence_seconds(run, 10.1, {A: 12, B: 7}, until=20.0) is None


def test_the_silence_is_noticed_at_the_first_sample_showing_a_stale_engine():
    samples = [Sample(1.0, {A: (1, False)}), Sample(2.2, {A: (1, True)}), Sample(3.0, {A: (2, False)})]
    run = Run("silence", heartbeats=True, samples=samples, fault_ends=[(2.5, {A: 2})], silenced_at=1.5)
    row = summarize(run)
    assert abs(row["silence_noticed_s"] - 0.7) < 1e-9 and abs(row["convergence_max_s"] - 0.5) < 1e-9
    assert row["not_converged"] == 0


def test_stale_outside_a_silence_counts_each_turn_to_stale_except_the_silenced_engines_during_its_silence():
    samples = [
        Sample(1.0, {A: (1, False), B: (1, True)}),  # B: a lost heartbeat
        Sample(2.0, {A: (1, True), B: (1, True)}),  # A silenced at 1.5: not counted
        Sample(3.0, {A: (1, True), B: (2, False)}),
        Sample(4.0, {A: (2, False), B: (2, True)}),  # B again
        Sample(5.0, {A: (2, True), B: (2, False)}),  # A after the resume at 3.5: counted
    ]
    run = Run("silence", heartbeats=True, samples=samples, silenced_at=1.5, resumed_at=3.5, silenced_url=A)
    assert stale_outside_silence(run) == 3
