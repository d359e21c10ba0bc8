"""The hold queue: requests that found no ready engine wait here, first in, first out, each until its deadline.

Invariants:
- at most `max_length` tickets are held; one more is refused at once (`QueueFull`);
- a ticket is held from `enter` until its holder calls `leave` (it always does, in a `finally`:
  released, timed out, or its client gone), so the length and the oldest wait are the requests still
  waiting, never a leaked one;
- `close()` (the router is stopping) wakes every held ticket and refuses new ones: held requests are
  answered at once (503 `shutting_down`) rather than keeping the process up until their deadlines;
- `release()` wakes every held ticket in arrival order (asyncio runs woken waiters in the order woken), so
  when an engine becomes ready the queued requests are picked in the order they came. A released holder
  that finds no engine after all (it went again) waits on, in its place, until its own deadline.

One owner: the router's event loop (no locks). The clock is injectable for the pure tests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pagedinfer.contracts import validators

DEFAULT_QUEUE_TIMEOUT_SECONDS = 60.0  # a held request's deadline, from its arrival
DEFAULT_MAX_QUEUED_REQUESTS = 256
DEFAULT_KEEPALIVE_SECONDS = 5.0  # a held stream's SSE comment interval


@dataclass(frozen=True)
class HoldSettings:
    """The hold queue's bounds (`pagedinfer router --queue-*`, `--max-queued-requests`)."""

    timeout_seconds: float = DEFAULT_QUEUE_TIMEOUT_SECONDS
    max_length: int = DEFAULT_MAX_QUEUED_REQUESTS
    keepalive_seconds: float = DEFAULT_KEEPALIVE_SECONDS

    def __post_init__(self) -> None:
        validators.positive_seconds("--queue-timeout-seconds", self.timeout_seconds)
        validators.positive_int("--max-queued-requests", self.max_length)
        validators.positive_seconds("--queue-keepalive-seconds", self.keepalive_seconds)


class QueueFull(Exception):
    """The queue already holds `max_length` requests."""


@dataclass(eq=False)
class Ticket:
    enqueued_at: float  # the clock's seconds
    deadline: float
    released: asyncio.Event = field(default_factory=asyncio.Event)


class HoldQueue:
    def __init__(self, settings: HoldSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.clock = clock
        self._tickets: dict[Ticket, None] = {}  # insertion-ordered: arrival order
        self.entered = asyncio.Event()  # set on each entry; the capacity task clears it
        self.closed = False

    def __len__(self) -> int:
        return len(self._tickets)

    def enter(self) -> Ticket:
        if self.closed:
            raise QueueFull("the router is shutting down")
        if len(self._tickets) >= self.settings.max_length:
            raise QueueFull(f"the hold queue is full ({self.settings.max_length} requests wait for an engine)")
        now = self.clock()
        ticket = Ticket(now, now + self.settings.timeout_seconds)
        self._tickets[ticket] = None
        self.entered.set()
        return ticket

    def leave(self, ticket: Ticket) -> None:
        self._tickets.pop(ticket, None)

    def close(self) -> None:
        self.closed = True
        self.release()

    def release(self) -> None:
        """Wake every held ticket, oldest first."""
        for ticket in self._tickets:
            ticket.released.set()

    def oldest_wait_seconds(self) -> float:
        """How long the oldest held request has waited; 0 with none held."""
        oldest = next(iter(self._tickets), None)
        return 0.0 if oldest is None else max(0.0, self.clock() - oldest.enqueued_at)

    async def wait(self, ticket: Ticket, at_most_seconds: float | None = None) -> bool:
        """Wait for a release (True) or the ticket's deadline, or `at_most_seconds` first (False).

        A release is consumed: the next wait waits for the next release."""
        remaining = ticket.deadline - self.clock()
        if at_most_seconds is not None:
            remaining = min(remaining, at_most_seconds)
        if not ticket.released.is_set() and remaining <= 0:
            return False
        try:
            async with asyncio.timeout(max(0.0, remaining)):
                await ticket.released.wait()
        except TimeoutError:
            return False
        ticket.released.clear()
        return True

    def expired(self, ticket: Ticket) -> bool:
        return self.clock() >= ticket.deadline
