"""The KV feed's rules, without sockets: gaps, restarts, heartbeats and silence (`router/feed_sync.py`)."""

from __future__ import annotations

import msgpack
import pytest

from pagedinfer.contracts.kv_events.events import decode_batch
from pagedinfer.contracts.kv_events.frames import HEARTBEAT_SEQ
from pagedinfer.contracts.kv_events.heartbeat import Heartbeat, decode_heartbeat, encode_heartbeat
from pagedinfer.router.feed_sync import STALE_SLACK_SECONDS, Liveness, is_contiguous, on_batch, on_heartbeat


@pytest.mark.parametrize(
    "known, seq, step",
    [
        (None, 0, "apply"),
        (4, 5, "apply"),  # the next one
        (None, 3, "gap"),
        (4, 7, "gap"),  # numbers skipped: a dropped batch
        (4, 0, "restart"),  # the engine's numbers began again
        (4, 4, "old"),
        (4, 2, "old"),
        (0, 0, "old"),  # a snapshot already reflects it
        (None, HEARTBEAT_SEQ, "old"),
        (4, HEARTBEAT_SEQ, "old"),  # what a feed that predates heartbeats does with one
    ],
)
def test_a_batch_is_applied_taken_as_a_gap_a_restart_or_already_reflected(known, seq, step):
    assert on_batch(known, seq) == step


@pytest.mark.parametrize(
    "known, known_epoch, last_seq, epoch, step",
    [
        (7, "e1", 7, "e1", "in-sync"),
        (7, "e1", 6, "e1", "in-sync"),  # the snapshot sealed a batch the publisher had not sent yet
        (None, "e1", None, "e1", "in-sync"),  # nothing published yet
        (7, "e1", 8, "e1", "gap"),  # the LAST batch was lost: no later batch would ever reveal it
        (None, "e1", 0, "e1", "gap"),
        (7, "e1", 7, "e2", "restart"),  # another publisher behind the same address
        (7, None, 7, "e2", "in-sync"),  # an engine whose snapshot had no epoch: no restart claimed from it
    ],
)
def test_a_heartbeat_names_a_gap_or_a_restart_or_nothing_to_do(known, known_epoch, last_seq, epoch, step):
    assert on_heartbeat(known, known_epoch, Heartbeat(last_seq, epoch, 0.5)) == step


def test_a_replay_fills_a_gap_only_with_every_missing_batch_in_order():
    assert is_contiguous([5, 6, 7], 5, 7)
    assert not is_contiguous([6, 7], 5, 7)  # the buffer no longer has 5: snapshot
    assert not is_contiguous([5, 7], 5, 7)
    assert not is_contiguous([], 5, 7)
    assert is_contiguous([], 5, 4)  # nothing was missing


def test_a_publisher_is_silent_one_interval_and_the_slack_after_its_last_message_and_not_before():
    live = Liveness(0.5, now_seconds=100.0)
    limit = 0.5 + STALE_SLACK_SECONDS
    assert live.quiet_limit_seconds == limit
    assert not live.is_silent(100.0 + limit - 0.001)
    assert live.is_silent(100.0 + limit)
    live.heard(101.2)  # any message (a batch or a heartbeat) counts
    assert live.seconds_until_silent(101.2) == pytest.approx(limit)  # the feed's poll wakes at the deadline
    assert not live.is_silent(101.2 + limit - 0.001)
    assert live.is_silent(101.2 + limit) and live.seconds_until_silent(101.2 + limit + 5) == 0.0


@pytest.mark.parametrize("phase", [0.0, 0.001, 0.1, 0.25, 0.4, 0.499])
def test_a_silence_is_noticed_within_one_interval_and_the_slack_whatever_its_phase(phase):
    """Heartbeats every 0.5 s from t=0, batches in between; the publisher goes silent at 3.0 + phase.

    The feed wakes exactly at `silent_at_seconds` (its poll times out there), so that is when it notices."""
    interval = 0.5
    live = Liveness(interval, now_seconds=0.0)
    silent_from = 3.0 + phase
    messages = sorted([k * interval for k in range(1, 20)] + [0.77, 1.31, 2.95, 3.02, 3.3])
    for t in messages:
        if t >= silent_from:
            break
        assert not live.is_silent(t)  # every message came before its deadline: never stale while it talks
        live.heard(t)
    noticed = live.silent_at_seconds()
    assert silent_from < noticed <= silent_from + interval + STALE_SLACK_SECONDS


def test_a_heartbeat_late_by_less_than_the_slack_keeps_the_publisher_live():
    interval = 0.5
    live = Liveness(interval, now_seconds=0.0)
    t = 0.0
    for _ in range(50):
        t += interval + 0.9 * STALE_SLACK_SECONDS  # every heartbeat late, each within the slack
        assert not live.is_silent(t)
        live.heard(t)


def test_a_heartbeats_interval_wins_and_an_engine_without_heartbeats_is_never_silent():
    old = Liveness(None, now_seconds=0.0)
    assert not old.is_silent(1e9) and old.quiet_limit_seconds is None and old.seconds_until_silent(5.0) is None
    learned = Liveness(None, now_seconds=0.0)
    learned.heard(1.0, interval_seconds=0.25)  # discovery said nothing; the first heartbeat says 0.25 s
    assert learned.is_silent(1.0 + 0.25 + STALE_SLACK_SECONDS)


def test_a_heartbeat_round_trips_and_reads_as_an_empty_batch_to_a_consumer_that_predates_it():
    payload = encode_heartbeat(1.5, Heartbeat(41, "abcd", 0.5))
    assert decode_heartbeat(payload) == Heartbeat(41, "abcd", 0.5)
    assert decode_heartbeat(encode_heartbeat(1.5, Heartbeat(None, "abcd", 2))) == Heartbeat(None, "abcd", 2.0)
    batch = decode_batch(HEARTBEAT_SEQ, payload)  # vLLM's batch shape: [ts, events, dp_rank, ...]
    assert batch.events == () and batch.seq == HEARTBEAT_SEQ


@pytest.mark.parametrize(
    "payload, what",
    [
        (b"\xc1", "not msgpack"),
        (encode_heartbeat(0.0, Heartbeat(1, "e", 0.5))[:-3], "not msgpack"),
        (msgpack.packb([0.0, [], 0]), "expected"),
        (msgpack.packb([0.0, [], 0, {"epoch": "e", "last_seq": "x", "interval_seconds": 1}]), "bad"),
        (msgpack.packb([0.0, [], 0, {"epoch": "e", "last_seq": 1, "interval_seconds": 0}]), "bad"),
    ],
)
def test_a_malformed_heartbeat_is_a_value_error_naming_it(payload, what):
    with pytest.raises(ValueError, match=what):
        decode_heartbeat(payload)
