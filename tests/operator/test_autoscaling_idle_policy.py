"""The idle rule as a pure function (operator/autoscaling/idle.py): the timer, zero, standby, and what it
never does on partial data."""

from __future__ import annotations

import pytest

from pagedinfer.operator.autoscaling.idle import (
    SCALED_FROM_ZERO,
    SCALED_TO_ZERO,
    STANDBY,
    IdleObservation,
    IdleState,
    decide_idle,
)
from pagedinfer.operator.autoscaling.idle_spec import IdleRule

RULE = IdleRule(after_seconds=60)


def seen(current=1, in_flight=0, queued=0, awake=None, asleep=0):
    return IdleObservation(current, in_flight, queued, current - asleep if awake is None else awake, asleep)


def run(observations, standby=0, rule=RULE, step_seconds=10.0):
    """Decisions of consecutive rounds, `step_seconds` apart, each seeing its observation."""
    state, out = IdleState(), []
    for i, obs in enumerate(observations):
        decision = decide_idle(rule, standby, obs, state, i * step_seconds)
        state = decision.state
        out.append(decision)
    return out


def test_idle_for_the_whole_window_scales_to_zero_once_and_says_why():
    decisions = run([seen(2)] * 8)
    assert [d.desired_replicas for d in decisions] == [None] * 6 + [0, 0]
    assert decisions[5].reason == "idle for 50 s of 60 s"
    last = decisions[6]
    assert last.event == SCALED_TO_ZERO and not last.sleep_engines
    assert last.reason == (
        "idle for 60 s (afterSeconds 60): no request running or waiting at the engines, none"
        " queued at the router: 2 -> 0 replicas"
    )


@pytest.mark.parametrize("busy", [seen(in_flight=1), seen(queued=3), seen(in_flight=None), seen(queued=None)])
def test_any_request_or_any_unread_source_restarts_the_window(busy):
    decisions = run([seen()] * 5 + [busy] + [seen()] * 7)  # idle again from 60 s: down at 120 s
    assert [d.desired_replicas for d in decisions] == [None] * 12 + [0]
    assert decisions[5].reason.startswith("busy: ") and decisions[5].state == IdleState()


def test_the_busy_reason_names_each_source():
    (decision,) = run([seen(in_flight=None, queued=2)])
    assert decision.reason == "busy: an engine's requests could not be read; 2 requests queued at the router"


def test_at_zero_a_queued_request_brings_one_replica_back_at_once():
    (hold, back) = run([seen(current=0), seen(current=0, queued=2)])
    assert hold.desired_replicas == 0 and hold.event == ""
    assert (back.desired_replicas, back.event) == (1, SCALED_FROM_ZERO)
    assert back.reason == "2 requests queued at the router: 0 -> 1 replica"


def test_at_zero_an_unread_router_holds_at_zero_and_says_so():
    (decision,) = run([seen(current=0, queued=None)])
    assert decision.desired_replicas == 0 and "could not be read" in decision.reason


def test_a_service_brought_back_from_zero_waits_a_whole_window_again():
    """The timer runs only above zero: the round after 0 -> 1 starts it afresh, so the replica is never
    taken away before afterSeconds of idleness (here the queued requests were served at once)."""
    decisions = run([seen(2)] * 7 + [seen(0, queued=1)] + [seen(1)] * 7)
    assert [d.desired_replicas for d in decisions] == [None] * 6 + [0, 1] + [None] * 6 + [0]


def test_standby_scales_to_k_and_puts_the_awake_engines_to_sleep():
    decisions = run([seen(3)] * 7 + [seen(2, asleep=1), seen(2, asleep=2)], standby=2)
    down = decisions[6]
    assert (down.desired_replicas, down.sleep_engines, down.event) == (2, True, STANDBY)
    assert down.reason.endswith(": 3 -> 2 replicas, 3 awake engines put to sleep (standby 2)")
    again = decisions[7]  # one engine still awake (woken, or started while idle): back to sleep
    assert (again.desired_replicas, again.sleep_engines, again.event) == (2, True, STANDBY)
    assert again.reason.endswith(": 1 awake engines put to sleep (standby 2)")
    parked = decisions[8]
    assert (parked.desired_replicas, parked.sleep_engines, parked.event) == (2, False, "")
    assert parked.reason.endswith(": 2 standby replicas, 2 asleep")


def test_a_woken_engine_serving_a_request_hands_the_decision_back_to_the_metric_rules():
    decisions = run([seen(2)] * 7 + [seen(2, in_flight=1, asleep=1)], standby=2)
    assert decisions[6].desired_replicas == 2 and decisions[7].desired_replicas is None


@pytest.mark.parametrize(
    "field, value",
    [("current_replicas", -1), ("requests_in_flight", -2), ("router_queue_length", -1), ("num_asleep", -1)],
)
def test_an_impossible_observation_is_refused(field, value):
    with pytest.raises(ValueError, match=field):
        IdleObservation(
            **{
                "current_replicas": 1,
                "requests_in_flight": 0,
                "router_queue_length": 0,
                "num_awake": 1,
                "num_asleep": 0,
                field: value,
            }
        )
