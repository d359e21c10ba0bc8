"""The idle rule: when a service with `minReplicas: 0` goes to zero, or to standby, and back (pure).

A service is idle in a round when no request runs or waits at any ready
engine (`pagedinfer_num_requests_running` + `_waiting`, summed) and none is
held in the router's queue (`pagedinfer_router_queue_length`). Not knowing
is not idle: a ready engine whose scrape failed, or a router that could not
be read, keeps the service busy for that round (never scale to zero on
partial data, as the metric rules never scale down on it). Pods still
starting hold no request and count for nothing: what a client waits for is
in the router's queue.

The rule, per round (`decide_idle`):
- at zero replicas: any request in the router's queue brings one replica
  back at once (the demand annotation's handler does the same as soon as
  the router writes it, `autoscaling.demand`; this is the fallback if that
  write was lost); otherwise the service stays at zero.
- above zero and busy: the idle timer is cleared and the metric rules
  (autoscaling.policy) decide, as without scale to zero.
- above zero and idle for less than `afterSeconds`: the metric rules decide
  (they never go below max(1, standby)); the timer runs.
- idle for `afterSeconds` or more: the service goes to `standby` replicas
  (0 by default), and with standby every awake ready engine is put to
  sleep (the daemon POSTs its /sleep). It stays there while idle: engines
  that start (or are woken) while the service is idle are put back to
  sleep. The router wakes a sleeping engine when a request comes, which
  makes the service busy again.

The timer runs only above zero: a service brought back from zero is idle
for `afterSeconds` again before it can go back down.

Invariant: `desired_replicas` is None (the metric rules decide), 1 (from
zero, on demand only), 0 or `standby` (idle for the whole window, or
already at zero).
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedinfer.contracts import validators
from pagedinfer.operator.autoscaling.idle_spec import IdleRule

# Event reasons of the idle rule's decisions (the metric rules' are ScaledUp / ScaledDown).
SCALED_TO_ZERO = "ScaledToZero"
SCALED_FROM_ZERO = "ScaledFromZero"
STANDBY = "Standby"


@dataclass(frozen=True)
class IdleObservation:
    """What one round saw. None: could not be read (a ready engine's scrape failed, or the router's)."""

    current_replicas: int
    requests_in_flight: int | None  # running + waiting over the ready engines
    router_queue_length: int | None  # requests held by the router (all its pods)
    num_awake: int  # ready engines not asleep
    num_asleep: int  # ready engines that report being asleep

    def __post_init__(self) -> None:
        for name in ("current_replicas", "num_awake", "num_asleep"):
            validators.non_negative_int(name, getattr(self, name))
        for name in ("requests_in_flight", "router_queue_length"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 or None, got {value}")

    @property
    def idle(self) -> bool:
        """Known to hold no request, at the engines and at the router."""
        return self.requests_in_flight == 0 and self.router_queue_length == 0

    def busy_because(self) -> str:
        """Why the service is not idle, in words ("" when it is)."""
        parts = []
        if self.requests_in_flight is None:
            parts.append("an engine's requests could not be read")
        elif self.requests_in_flight:
            parts.append(f"{self.requests_in_flight} requests running or waiting at the engines")
        if self.router_queue_length is None:
            parts.append("the router's queue could not be read")
        elif self.router_queue_length:
            parts.append(f"{self.router_queue_length} requests queued at the router")
        return "; ".join(parts)


@dataclass(frozen=True)
class IdleState:
    """Carried between rounds: since when (monotonic seconds) the service has been idle above zero."""

    idle_since_seconds: float | None = None


@dataclass(frozen=True)
class IdleDecision:
    """The idle rule's verdict. `desired_replicas` None: the metric rules decide this round.
    `event`: the Event reason when this decision changes something ("" when it changes nothing)."""

    desired_replicas: int | None
    sleep_engines: bool  # POST /sleep to every awake ready engine
    reason: str
    event: str
    state: IdleState


def decide_idle(
    rule: IdleRule, standby: int, obs: IdleObservation, state: IdleState, now_seconds: float
) -> IdleDecision:
    """One round of the idle rule (see the module docstring). Pure."""
    current = obs.current_replicas
    if current == 0:
        queued = obs.router_queue_length
        if queued:
            return IdleDecision(
                1, False, f"{queued} requests queued at the router: 0 -> 1 replica", SCALED_FROM_ZERO, IdleState()
            )
        unknown = "; the router's queue could not be read" if queued is None else ""
        return IdleDecision(0, False, f"scaled to zero: no request queued at the router{unknown}", "", IdleState())
    if not obs.idle:
        return IdleDecision(None, False, f"busy: {obs.busy_because()}", "", IdleState())
    since = state.idle_since_seconds if state.idle_since_seconds is not None else now_seconds
    idle_for = now_seconds - since
    state = IdleState(since)
    if idle_for < rule.after_seconds:
        return IdleDecision(None, False, f"idle for {idle_for:.0f} s of {rule.after_seconds} s", "", state)
    what = (
        f"idle for {idle_for:.0f} s (afterSeconds {rule.after_seconds}): no request running or waiting at"
        " the engines, none queued at the router"
    )
    if standby == 0:
        return IdleDecision(0, False, f"{what}: {current} -> 0 replicas", SCALED_TO_ZERO, state)
    changes = []
    if current != standby:
        changes.append(f"{current} -> {standby} replicas")
    if obs.num_awake:
        changes.append(f"{obs.num_awake} awake engines put to sleep")
    if not changes:
        return IdleDecision(standby, False, f"{what}: {standby} standby replicas, {obs.num_asleep} asleep", "", state)
    return IdleDecision(standby, obs.num_awake > 0, f"{what}: {', '.join(changes)} (standby {standby})", STANDBY, state)
