"""The autoscaler reads the exposition our server really renders: gauges as
they are, counters as deltas with reset detection, aggregated over ready pods."""

from __future__ import annotations

import math

import pytest

from pagedinfer.engine.outputs import EngineStats
from pagedinfer.engine.server.metrics import ServerMetrics
from pagedinfer.operator.autoscaling.readings import (
    MetricsParseError,
    PodReading,
    PodScrape,
    aggregate,
    counter_delta,
    parse_pod_metrics,
    pod_reading,
)

ALL = ("kvCacheUsage", "prefixCacheHitRate", "requestsWaiting")


def exposition(kv_usage=0.25, waiting=3, queries=1000, hits=400, model_name="tiny") -> str:
    """/metrics text from the server's own registry."""
    metrics = ServerMetrics(model_name)
    used = round(kv_usage * 64)
    metrics.on_stats(
        EngineStats(
            num_total_blocks=64,
            num_used_blocks=used,
            num_free_blocks=64 - used,
            num_cached_free_blocks=2,
            kv_usage=kv_usage,
            prefix_cache_query_tokens=queries,
            prefix_cache_hit_tokens=hits,
            prefix_cache_preempted_query_tokens=50,
            prefix_cache_preempted_hit_tokens=48,
            num_allocation_failures=0,
            num_preemptions={"recompute": 1},
            num_running_reqs=2,
            num_waiting_reqs=waiting,
            num_swapped_reqs=0,
            num_waiting_seqs=2 * waiting,
            num_prompt_tokens=queries,
            num_generation_tokens=77,
        )
    )
    metrics.ttft.labels(model_name).observe(0.05)
    return metrics.render().decode()


def test_parses_the_servers_exposition():
    scrape = parse_pod_metrics(exposition())
    assert scrape == PodScrape(0.25, 3.0, 1000.0, 400.0, num_requests_running=2.0, sleeping=0.0)


def test_filters_by_model_name():
    text = exposition(kv_usage=0.5, model_name="a")
    assert parse_pod_metrics(text, "a").kv_cache_usage == 0.5
    assert parse_pod_metrics(text, "b") == PodScrape()


def test_a_server_still_loading_has_no_engine_series():
    # only the sleep gauge (0: awake) is there before the engine reports
    assert parse_pod_metrics(ServerMetrics("tiny").render().decode()) == PodScrape(sleeping=0.0)


@pytest.mark.parametrize(
    "text",
    [
        "<html><body>502 Bad Gateway</body></html>",
        'pagedinfer_kv_cache_usage_ratio{model_name="m"} lots\n',
        "\x00\xff\xfe",
    ],
)
def test_garbage_is_a_parse_error(text):
    with pytest.raises(MetricsParseError, match="not Prometheus text"):
        parse_pod_metrics(text)


def test_nan_and_negative_values_count_as_absent():
    text = 'pagedinfer_kv_cache_usage_ratio{model_name="m"} NaN\npagedinfer_num_requests_waiting{model_name="m"} -1\n'
    assert parse_pod_metrics(text) == PodScrape()


def test_counter_delta_detects_resets():
    assert counter_delta(100.0, 150.0) == 50.0
    assert counter_delta(100.0, 30.0) == 30.0  # restarted engine: 30 since the reset
    assert counter_delta(None, 30.0) is None


def test_first_scrape_of_a_pod_has_no_hit_rate_yet():
    reading = pod_reading(None, PodScrape(0.5, 1.0, 100.0, 50.0))
    assert reading == PodReading(0.5, 1.0, None, None)


def test_aggregate_averages_gauges_and_weights_hit_rate_by_tokens():
    readings = {
        "a": pod_reading(PodScrape(0.1, 0, 100, 10), PodScrape(0.8, 4, 1100, 210)),  # 1000 queries, 200 hits
        "b": pod_reading(PodScrape(0.1, 0, 500, 0), PodScrape(0.4, 2, 600, 100)),  # 100 queries, 100 hits
        "c": pod_reading(PodScrape(0.0, 0, 50, 5), PodScrape(0.0, 0, 50, 5)),  # idle: no queries
        "d": None,  # scrape failed
    }
    samples, num_failed = aggregate(readings, ALL)
    assert num_failed == 1
    assert samples["kvCacheUsage"].num_pods_with_data == 3
    assert math.isclose(samples["kvCacheUsage"].value, 0.4)
    assert math.isclose(samples["requestsWaiting"].value, 2.0)
    assert samples["prefixCacheHitRate"].num_pods_with_data == 2
    assert math.isclose(samples["prefixCacheHitRate"].value, 300 / 1100)


def test_a_reset_between_scrapes_still_gives_a_sane_hit_rate():
    reading = pod_reading(PodScrape(0.2, 0, 5000, 4000), PodScrape(0.2, 0, 200, 50))
    samples, _ = aggregate({"a": reading}, ("prefixCacheHitRate",))
    assert samples["prefixCacheHitRate"].value == 0.25


def test_no_traffic_anywhere_means_no_hit_rate():
    readings = {"a": pod_reading(PodScrape(0, 0, 10, 5), PodScrape(0, 0, 10, 5))}
    samples, num_failed = aggregate(readings, ("prefixCacheHitRate",))
    assert samples["prefixCacheHitRate"].value is None and num_failed == 0
