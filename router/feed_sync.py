"""What a KV feed does with each message, and when its publisher counts as silent: pure, the clock passed in.

`router/kv_feed.py` does the I/O (replay, snapshot); these decide it, so the
rules are tested without sockets (`tests/router/test_feed_sync.py`):

- a batch numbered one above the feed's is applied; above that is a gap
  (replay the missing ones, else snapshot); 0 after a higher number is an
  engine that restarted (snapshot); anything else is already reflected;
- a heartbeat (`contracts/kv_events/heartbeat.py`) naming a batch above the
  feed's is a gap, as a batch would be: the lost LAST batch before a quiet
  spell, which no later batch reveals, is found within one interval; another
  epoch than the one the feed's snapshot came from is a restarted engine;
- a publisher that has announced a heartbeat interval and sent nothing (no
  batch, no heartbeat) for one interval plus `STALE_SLACK_SECONDS` since the
  last message it sent is silent: the router stops scoring its blocks until a
  message arrives and the feed has caught up with it. Since the last message
  before a silence came less than one interval before it began, the silence
  is noticed at most one interval plus the slack after it began (the feed
  wakes at that deadline, `Liveness.seconds_until_silent`, not on a timer). An engine that announces no interval (one from before
  heartbeats, or `--kv-events-heartbeat-seconds 0`) is never silent: it is
  followed as before.
"""

from __future__ import annotations

from typing import Literal

from pagedinfer.contracts.kv_events.heartbeat import Heartbeat

# How late a heartbeat may arrive before its publisher counts as silent: the publisher's 5 ms flush, its
# thread's and the router's event loop's scheduling on a busy machine. A lost heartbeat (a dropped message)
# is indistinguishable from silence: it marks the feed stale until the next one, one interval at most.
STALE_SLACK_SECONDS = 0.1

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
        """How long the publisher may send nothing: one interval and the slack (None: no heartbeats)."""
        return None if self.interval_seconds is None else self.interval_seconds + STALE_SLACK_SECONDS

    def silent_at_seconds(self) -> float | None:
        """When the publisher counts as silent unless a message arrives first (None: never)."""
        limit = self.quiet_limit_seconds
        return None if limit is None else self.last_heard_seconds + limit

    def seconds_until_silent(self, now_seconds: float) -> float | None:
        """How long a quiet feed may wait for a message before it must look again (None: for ever)."""
        at = self.silent_at_seconds()
        return None if at is None else max(0.0, at - now_seconds)

    def is_silent(self, now_seconds: float) -> bool:
        at = self.silent_at_seconds()
        return at is not None and now_seconds >= at
