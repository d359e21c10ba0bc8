"""The KV feed's rules, without sockets: gaps, restarts, heartbeats and silence (`router/feed_sync.py`)."""

from __future__ import annotations

import msgpack
import pytest

from pagedinfer.engine.kv_events.events import decode_batch
from pagedinfer.engine.kv_events.heartbeat import HEARTBEAT_SEQ, Heartbeat, decode_heartbeat, encode_heartbeat
from pagedinfer.router.feed_sync import STALE_AFTER_INTERVALS, Liveness, is_contiguous, on_batch, on_heartbeat


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


def test_a_publisher_is_silent_after_the_stated_intervals_without_a_message_and_not_before():
    live = Liveness(0.5, now_seconds=100.0)
    limit = STALE_AFTER_INTERVALS * 0.5
    assert not live.is_silent(100.0 + limit)
    assert live.is_silent(100.0 + limit + 0.001)
    live.heard(101.2)  # any message (a batch or a heartbeat) counts
    assert not live.is_silent(101.2 + limit)
    assert live.is_silent(101.2 + limit + 0.001)


def test_a_heartbeats_interval_wins_and_an_engine_without_heartbeats_is_never_silent():
    old = Liveness(None, now_seconds=0.0)
    assert not old.is_silent(1e9) and old.quiet_limit_seconds is None
    learned = Liveness(None, now_seconds=0.0)
    learned.heard(1.0, interval_seconds=0.25)  # discovery said nothing; the first heartbeat says 0.25 s
    assert learned.is_silent(1.0 + STALE_AFTER_INTERVALS * 0.25 + 0.001)


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
