"""What the idle rule reads and does at its edges: the engines' running/waiting/sleeping gauges, the router's
queue (unknown is never "nothing queued"), POST /sleep that fails without raising, and the answer to the
router's demand annotation."""

from __future__ import annotations

import aiohttp
import pytest
from fake_engine_metrics import fake_engines

from pagedinfer.operator.autoscaling.demand import DEMAND_IGNORED, answer_demand
from pagedinfer.operator.autoscaling.idle import SCALED_FROM_ZERO
from pagedinfer.operator.autoscaling.readings import (
    IdleCounts,
    PodReading,
    idle_counts,
    parse_pod_metrics,
    parse_router_queue_length,
)
from pagedinfer.operator.autoscaling.scrape import PodTarget, scrape_router_queue
from pagedinfer.operator.autoscaling.sleep import EngineTarget, put_to_sleep
from pagedinfer.testing.kubelet_harness import ENGINE_PORT

ENGINE_TEXT = """\
pagedinfer_num_requests_running{model_name="m"} 2.0
pagedinfer_num_requests_waiting{model_name="m"} 1.0
pagedinfer_engine_sleeping{model_name="m"} 0.0
"""


def test_the_engines_gauges_and_the_routers_queue_are_read_from_their_exposition():
    scrape = parse_pod_metrics(ENGINE_TEXT)
    assert (scrape.num_requests_running, scrape.num_requests_waiting, scrape.sleeping) == (2.0, 1.0, 0.0)
    assert parse_router_queue_length("pagedinfer_router_queue_length 3.0\n") == 3
    assert parse_router_queue_length("pagedinfer_router_retries_total 3.0\n") is None


def test_requests_in_flight_are_unknown_when_any_ready_engine_is_unread_or_silent_about_them():
    busy, asleep = PodReading(num_requests_running=2, num_requests_waiting=1), PodReading(0, 0, None, None, 0, 1)
    assert idle_counts({"a": busy, "b": asleep}) == IdleCounts(3, 1, 1)
    assert idle_counts({"a": busy, "b": None}).requests_in_flight is None
    assert idle_counts({"a": PodReading(num_requests_waiting=0)}).requests_in_flight is None
    assert idle_counts({}) == IdleCounts(0, 0, 0)


async def test_the_router_queue_is_the_sum_over_its_pods_and_unknown_if_any_pod_is_unread():
    async with fake_engines(2) as (one, two), aiohttp.ClientSession() as session:
        one.router_queue_length, two.router_queue_length = 2, 3
        targets = [PodTarget(e.ip, f"http://{e.ip}:{ENGINE_PORT}/metrics") for e in (one, two)]
        assert await scrape_router_queue(session, targets, 2.0) == 5
        two.mode = "garbage"
        assert await scrape_router_queue(session, targets, 2.0) is None
        assert await scrape_router_queue(session, [], 2.0) is None  # no ready router pod: unknown


async def test_sleep_is_posted_to_each_engine_and_a_refusal_is_returned_not_raised():
    async with fake_engines(2) as (ok, refusing), aiohttp.ClientSession() as session:
        refusing.sleep_status = 409
        engines = [
            EngineTarget("ok", f"http://{ok.ip}:{ENGINE_PORT}"),
            EngineTarget("refusing", f"http://{refusing.ip}:{ENGINE_PORT}"),
            EngineTarget("gone", "http://127.0.0.1:9"),
        ]
        assert await put_to_sleep(session, engines, 2.0) == ["refusing", "gone"]
        assert ok.sleeping and not refusing.sleeping


ZERO = {
    "minReplicas": 0,
    "maxReplicas": 2,
    "autoscaling": {"enabled": True, "metrics": [{"name": "kvCacheUsage", "target": 0.5}]},
}


@pytest.mark.parametrize(
    "spec, replicas, event, says",
    [
        ({**ZERO, "replicas": 0}, 1, SCALED_FROM_ZERO, "0 -> 1 replica"),
        ({**ZERO, "replicas": 1}, None, "", "1 replicas already (starting, or asleep in standby"),
        ({**ZERO, "replicas": 0, "autoscaling": {"enabled": False}}, None, DEMAND_IGNORED, "scale to zero is off"),
        ({"replicas": 0, "maxReplicas": 2}, None, DEMAND_IGNORED, "scale to zero is off"),
        ({**ZERO, "replicas": 0, "maxReplicas": 1}, None, DEMAND_IGNORED, "the autoscaling spec is invalid"),
    ],
)
def test_a_demand_scales_from_zero_only_a_service_the_idle_rule_scaled_there(spec, replicas, event, says):
    answer = answer_demand(spec, "2026-12-04T17:00:00Z")
    assert (answer.replicas, answer.event) == (replicas, event) and says in answer.reason
    assert "2026-12-04T17:00:00Z" in answer.reason
