"""What an engine gains when a router follows it (pure; builders.py adds it to the engine's pod).

`--kv-events` publishes the prefix cache's events on KV_EVENTS_PORT (replay on
the port above). The router finds both through the engine's `GET /kv_events`
and connects to the pod's IP (router/kv_feed.py), so no Service carries them;
the container declares them for readers and NetworkPolicies.

The engine's preStop wait: with a router the engines are reached only
through it (the front Service selects the router pods), so the wait is sized
from the router's discovery poll (contracts/routing/lifecycle.py, the same definition
as the router's flag default); without one, kube-proxy and ingress
controllers must learn of the terminating pod, which takes seconds
(`builders.PRE_STOP_SLEEP_SECONDS`).

The readiness gate: with the router's warm-up on, the engine pods carry
`readinessGates: [{conditionType: pagedinfer.io/warmed}]`; the router sets
that condition once it has replayed its hot prefixes to the pod (or after
`WARMUP_GATE_TIMEOUT_SECONDS`), so a rollout's new pod counts as ready only
warm (contracts/routing/lifecycle.py); while no router pod is ready the
operator sets it after that timeout itself (gate_daemon.py).
"""

from __future__ import annotations

from typing import Any

from pagedinfer.contracts.config.options import command_line
from pagedinfer.contracts.config.serve_args import ServeArgs
from pagedinfer.contracts.routing.lifecycle import WARMED_CONDITION, engine_pre_stop_seconds
from pagedinfer.operator.routing.spec import RouterSpec

KV_EVENTS_PORT = 5557  # `serve --kv-events-port`


def engine_router_args(router: RouterSpec) -> list[str]:
    if not router.enabled:
        return []
    return command_line((ServeArgs,), {"kv_events": True, "kv_events_port": str(KV_EVENTS_PORT)})


def engine_router_ports(router: RouterSpec) -> list[dict[str, Any]]:
    if not router.enabled:
        return []
    return [
        {"name": "kv-events", "containerPort": KV_EVENTS_PORT, "protocol": "TCP"},
        {"name": "kv-replay", "containerPort": KV_EVENTS_PORT + 1, "protocol": "TCP"},
    ]


def engine_pre_stop_wait_seconds(router: RouterSpec, without_router_seconds: int) -> int:
    """How long the engine's preStop hook sleeps before the kubelet sends SIGTERM."""
    return engine_pre_stop_seconds() if router.enabled else without_router_seconds


def engine_readiness_gates(router: RouterSpec) -> list[dict[str, str]]:
    """The engine pod's readinessGates: the router's warm-up condition while the router warms new engines."""
    if not router.enabled or not router.warmup.enabled:
        return []
    return [{"conditionType": WARMED_CONDITION}]
