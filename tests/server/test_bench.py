"""`pagedinfer bench serve`: seeded workloads, percentile maths, and a short run against a real server."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from pagedinfer.engine.bench.workload import (
    LengthDistribution,
    RequestResult,
    build_workload,
    percentile,
    summarize,
)


def test_workload_is_reproducible_from_its_seed():
    a = build_workload("sharegpt-like", 20, 5.0, 32, 16, 50, seed=3)
    b = build_workload("sharegpt-like", 20, 5.0, 32, 16, 50, seed=3)
    c = build_workload("sharegpt-like", 20, 5.0, 32, 16, 50, seed=4)
    assert a == b
    assert a != c


def test_shared_prefix_is_one_system_prompt_for_every_request():
    workload = build_workload("synthetic", 10, math.inf, 8, 4, 40, seed=0)
    assert len({r.system_prompt for r in workload}) == 1
    assert len(workload[0].system_prompt.split()) >= 40
    assert len({r.user_prompt for r in workload}) == 10
    assert all(r.send_offset_seconds == 0.0 for r in workload)  # infinite rate: all at once
    assert build_workload("synthetic", 3, math.inf, 8, 4, 0, seed=0)[0].system_prompt is None


def test_poisson_arrivals_average_the_requested_rate():
    workload = build_workload("synthetic", 2000, 10.0, 4, 4, 0, seed=1)
    offsets = [r.send_offset_seconds for r in workload]
    assert offsets == sorted(offsets)
    assert offsets[-1] / len(offsets) == pytest.approx(0.1, rel=0.1)


def test_sharegpt_like_lengths_vary_within_bounds():
    workload = build_workload("sharegpt-like", 300, 1.0, 50, 20, 0, seed=2)
    outputs = [r.max_tokens for r in workload]
    assert len(set(outputs)) > 10
    assert min(outputs) >= 4 and max(outputs) <= 80


def test_a_length_distribution_by_its_median_or_its_mean_draws_around_it_within_its_bounds():
    rng = random.Random(0)
    by_median = [LengthDistribution.with_median(100, 0.5, 4, 400).draw(rng) for _ in range(4001)]
    assert 4 <= min(by_median) and max(by_median) <= 400
    assert statistics.median(by_median) == pytest.approx(100, rel=0.05)
    by_mean = [LengthDistribution.with_mean(100, 0.5, 1, 10_000).draw(rng) for _ in range(4001)]
    assert statistics.mean(by_mean) == pytest.approx(100, rel=0.05)
    with pytest.raises(ValueError, match="median"):
        LengthDistribution.with_median(3, 1.0, 4, 10)
    with pytest.raises(ValueError, match="sigma"):
        LengthDistribution.with_mean(10, -1.0, 4, 10)


@pytest.mark.parametrize("field, value", [("dataset", "tweets"), ("num_prompts", 0), ("request_rate", 0.0)])
def test_bad_workload_flags_are_named(field, value):
    kwargs = dict(
        dataset="synthetic",
        num_prompts=5,
        request_rate=1.0,
        input_words=4,
        output_tokens=4,
        shared_prefix_words=0,
        seed=0,
    )
    kwargs[field] = value
    with pytest.raises(ValueError, match=field):
        build_workload(**kwargs)


def test_word_count_flags_are_named_for_words_and_the_old_names_are_deprecated_aliases(capsys):
    from pagedinfer.engine.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["bench", "serve", "--input-words", "7", "--shared-prefix-words", "30"])
    assert (args.input_words, args.shared_prefix_words) == (7, 30)
    assert capsys.readouterr().err == ""
    workload = build_workload("synthetic", 2, math.inf, args.input_words, 4, args.shared_prefix_words, seed=0)
    assert len(workload[0].user_prompt.split(": ", 1)[1].split()) == 7  # words, whatever the tokenizer makes of them
    old = parser.parse_args(["bench", "serve", "--input-tokens", "7", "--shared-prefix-tokens", "30"])
    assert (old.input_words, old.shared_prefix_words) == (7, 30)
    err = capsys.readouterr().err
    assert "--input-tokens is deprecated" in err and "use --input-words" in err
    assert "--shared-prefix-tokens is deprecated" in err and "use --shared-prefix-words" in err


@pytest.mark.parametrize("field", ["input_words", "output_tokens", "shared_prefix_words"])
def test_bad_lengths_name_their_field(field):
    kwargs = dict(
        dataset="synthetic",
        num_prompts=5,
        request_rate=1.0,
        input_words=4,
        output_tokens=4,
        shared_prefix_words=0,
        seed=0,
    )
    kwargs[field] = -1
    with pytest.raises(ValueError, match=f"^{field}: must be >= "):
        build_workload(**kwargs)


def test_server_counters_are_read_by_the_prometheus_parser():
    """A timestamp, a label value with a space or a quote, and `# HELP` text are exposition syntax, not values
    (the hand-written line splitter this replaced read the timestamp as the value)."""
    from pagedinfer.engine.bench.scrape import sample_totals

    text = (
        "# HELP pagedinfer_prefix_cache_hits Prompt tokens found in the prefix cache.\n"
        "# TYPE pagedinfer_prefix_cache_hits counter\n"
        'pagedinfer_prefix_cache_hits_total{model_name="a b"} 5.0 1700000000000\n'
        'pagedinfer_prefix_cache_hits_total{model_name="say \\"hi\\" 9"} 2.0\n'
    )
    totals = sample_totals(text, ["pagedinfer_prefix_cache_hits_total", "pagedinfer_prefix_cache_queries_total"])
    assert totals == {"pagedinfer_prefix_cache_hits_total": 7.0, "pagedinfer_prefix_cache_queries_total": None}
    with pytest.raises(ValueError, match="not Prometheus text exposition"):
        sample_totals("<html>not metrics</html>", ["x"])


def test_percentile_interpolates_between_order_statistics():
    assert percentile([], 50) is None
    assert percentile([5.0], 99) == 5.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile(list(range(101)), 90) == 90
    with pytest.raises(ValueError, match="q"):
        percentile([1.0], 101)


def test_summary_counts_only_successful_requests():
    results = [
        RequestResult(
            ok=True,
            ttft_seconds=0.1,
            itl_seconds=(0.01, 0.03),
            latency_seconds=0.2,
            prompt_tokens=100,
            completion_tokens=3,
            cached_tokens=64,
        ),
        RequestResult(ok=False, error="HTTP 503"),
    ]
    s = summarize(results, 2.0, cache_queries_delta=100, cache_hits_delta=64)
    assert (s.num_ok, s.num_failed) == (1, 1)
    assert s.output_token_throughput_per_second == 1.5
    assert s.ttft_ms["p50"] == pytest.approx(100.0)
    assert s.itl_ms["p50"] == pytest.approx(20.0)
    assert s.prefix_cache_hit_rate == 0.64 and s.cached_token_share == 0.64


def test_bench_serve_against_a_real_server_reports_cache_hits(server, capsys):
    from pagedinfer.engine.cli import build_parser

    args = build_parser().parse_args(
        [
            "bench",
            "serve",
            "--url",
            server.url,
            "--num-prompts",
            "6",
            "--request-rate",
            "inf",
            "--dataset",
            "synthetic",
            "--input-words",
            "4",
            "--output-tokens",
            "3",
            "--shared-prefix-words",
            "40",
            "--no-progress",
            "--max-concurrency",
            "1",
        ]
    )
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "ok 6, failed 0" in out
    assert "TTFT (ms)" in out and "p99" in out
    rate = float(out.split("hit rate ")[1].split("%")[0])
    assert rate > 0  # requests after the first reuse the shared system prompt's blocks
