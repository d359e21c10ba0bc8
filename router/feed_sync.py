"""What a KV feed does with each message, and when its publisher counts as silent: pure, the clock passed in.

`router/kv_feed.py` does the I/O (replay, snapshot); these decide it, so the
rules are tested without sockets (`tests/router/test_feed_sync.py`):

- a batch numbered one above the feed's is applied; above that is a gap
  (replay the missing ones, else snapshot); 0 after a higher number is an
  engine that restarted (snapshot); anything else is already reflected;
- a heartbeat (`engine/kv_events/heartbeat.py`) naming a batch above the
  feed's is a gap, as a batch would be: the lost LAST batch before a quiet
  spell, which no later batch reveals, is found within one interval; another
  epoch than the one the feed's snapshot came from is a restarted engine;
- a publisher that has announced a heartbeat interval and sent nothing (no
  batch, no heartbeat) for `STALE_AFTER_INTERVALS` intervals is silent: the
  router stops scoring its blocks until a message arrives and the feed has
  caught up with it. An engine that announces no interval (one from before
  heartbeats, or `--kv-events-heartbeat-seconds 0`) is never silent: it is
  followed as before.
"""

from __future__ import annotations

from typing import Literal

from pagedinfer.engine.kv_events.heartbeat import Heartbeat

STALE_AFTER_INTERVALS = 2.0  # one heartbeat missed, and as long again of grace for a busy machine

BatchStep = Literal["apply", "gap", "restart", "old"]
HeartbeatStep = Literal["in-sync", "gap", "restart"]


def expected_seq(known_seq: int | None) -> int:
    return 0 if known_seq is None else known_seq + 1


def on_batch(known_seq: int | None, batch_seq: int) -> BatchStep:
    """known_seq: the newest batch the feed's state reflects (None: none)."""
    expected = expected_seq(known_seq)
    if batch_seq == expected:
        return "apply"
    if batch_seq > expected:
        return "gap"
    if batch_seq == 0 and known_seq:
        return "restart"  # the engine's numbers began again
    return "old"  # already reflected (a snapshot's), or a heartbeat's HEARTBEAT_SEQ to a feed that reads it so


def on_heartbeat(known_seq: int | None, known_epoch: str | None, beat: Heartbeat) -> HeartbeatStep:
    """known_epoch: the epoch of the snapshot the feed's state came from (None: unknown, an older engine)."""
    if known_epoch is not None and beat.epoch != known_epoch:
        return "restart"
    if beat.last_seq is not None and (known_seq is None or beat.last_seq > known_seq):
        return "gap"
    return "in-sync"


def is_contiguous(seqs: list[int], first: int, last: int) -> bool:
    """Exactly first..last, in order: what a replay must return to fill a gap (else: snapshot)."""
    return seqs == list(range(first, last + 1))


class Liveness:
    """When the feed last heard its publisher, and whether that is longer ago than it may stay quiet."""

    def __init__(self, interval_seconds: float | None, now_seconds: float) -> None:
        self.interval_seconds = interval_seconds  # None: the publisher sends no heartbeats
        self.last_heard_seconds = now_seconds

    def heard(self, now_seconds: float, interval_seconds: float | None = None) -> None:
        """A message arrived; a heartbeat also says its interval (which wins over discovery's)."""
        self.last_heard_seconds = now_seconds
        if interval_seconds is not None:
            self.interval_seconds = interval_seconds

    @property
    def quiet_limit_seconds(self) -> float | None:
        return None if self.interval_seconds is None else STALE_AFTER_INTERVALS * self.interval_seconds

    def is_silent(self, now_seconds: float) -> bool:
        limit = self.quiet_limit_seconds
        return limit is not None and now_seconds - self.last_heard_seconds > limit
