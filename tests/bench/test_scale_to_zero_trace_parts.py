"""bench/scale_to_zero_trace.py's pure parts (its full run takes minutes of real engines: run by hand for the
figures in docs/autoscaling.md): the trace, each configuration's spec, and the replica-second integral."""

import pytest
import scale_to_zero_trace as bench

from pagedinfer.operator.spec.parser import parse_spec


def test_the_trace_has_arrivals_inside_its_bursts_only_and_is_the_same_for_a_seed():
    bursts = bench.parse_bursts(bench.DEFAULT_BURSTS)
    times = bench.arrivals(bursts, seed=0)
    assert times == sorted(times) == bench.arrivals(bursts, seed=0)
    assert all(any(start <= t < start + duration for start, duration, _ in bursts) for t in times)
    gaps = [b[0] - (a[0] + a[1]) for a, b in zip(bursts, bursts[1:])]
    assert min(gaps) > bench.IDLE_SECONDS  # every gap outlasts the idle rule
    with pytest.raises(ValueError, match="--bursts"):
        bench.parse_bursts("0:0:1")


@pytest.mark.parametrize("run", bench.RUNS)
def test_every_configuration_is_a_valid_spec_scaling_to_zero_only_where_meant(run):
    autoscaling = parse_spec(bench.NAME, bench.service_spec(run, compression=4.0)).autoscaling
    assert autoscaling.enabled and autoscaling.scale_to_zero == (run in ("zero", "standby"))
    assert autoscaling.standby == (1 if run == "standby" else 0)
    if autoscaling.scale_to_zero:
        assert autoscaling.idle.after_seconds == bench.IDLE_SECONDS / 4


def test_replica_seconds_integrate_the_desired_count_over_the_window_only():
    history = [(0.0, 1), (10.0, 0), (30.0, 2)]
    assert bench.replica_seconds(history, 5.0, 40.0) == 5 * 1 + 20 * 0 + 10 * 2


def test_time_back_from_zero_counts_from_the_first_request_held():
    result = bench.RunResult(
        "zero",
        samples=[
            bench.Sample(t, r, e, 0) for t, r, e in [(0, 0, 0), (1, 1, 0), (2, 1, 0), (5, 1, 1), (9, 0, 0), (10, 1, 1)]
        ],
        requests=[bench.RequestRecord(0.5, True), bench.RequestRecord(3.0, True), bench.RequestRecord(9.5, True)],
    )
    assert bench.back_from_zero(result, ready=False) == [0.5, 0.5]
    assert bench.back_from_zero(result, ready=True) == [4.5, 0.5]
