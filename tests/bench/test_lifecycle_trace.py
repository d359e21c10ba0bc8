"""bench/lifecycle_trace.py's pure parts: the trace is the same for a seed, and what the summary counts."""

from __future__ import annotations

from lifecycle_trace import Record, summarize_trace, trace


def test_the_trace_is_the_same_prompts_in_the_same_order_for_a_seed_and_popular_tenants_come_more():
    prefixes = [[t] * 8 for t in range(10)]
    first, again = trace(prefixes, 300, seed=7, question_tokens=4), trace(prefixes, 300, seed=7, question_tokens=4)
    assert first == again and first != trace(prefixes, 300, seed=8, question_tokens=4)
    assert all(len(p) == 12 and p[:8] in prefixes for p in first)
    tenants = [p[0] for p in first]
    assert tenants.count(0) > tenants.count(9)  # Zipf(1): the first tenant about ten times the last


def test_the_summary_counts_recomputed_tokens_after_the_event_and_the_first_quarter_apart():
    before = [Record(0.0, 100, 0, True), Record(1.0, 100, 90, True)]  # the second half: the caches filled
    after = [Record(2.0, 100, 0, True), *[Record(3.0, 100, 100, True)] * 6, Record(4.0, 100, 0, False)]
    row = summarize_trace("scale-up", "a", before, after)
    assert row.hit_rate_before == 0.9 and row.requests == 8 and row.aborted == 1
    assert (row.prompt_tokens, row.recomputed_tokens, row.recomputed_first_quarter) == (700, 100, 100)
