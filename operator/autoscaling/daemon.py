"""The autoscaler's kopf daemon: one loop per InferenceService with
`spec.autoscaling.enabled: true` (kopf stops it when that turns false, and
then `spec.replicas` is left to the user, an HPA or KEDA).

Every `intervalSeconds` (read afresh from the live body each round) it:
1. lists the InferenceService's pods by its selector labels and keeps the
   ready ones (Ready condition True, a podIP, not terminating);
2. reads their metrics: scrapes each one's /metrics (port `http`, else 8000)
   or asks Prometheus (`source.type: prometheus`);
3. turns them into per-metric samples (counter deltas against the pod's
   previous scrape, kept per pod uid) and calls the pure policy
   (autoscaling_policy.decide);
4. before lowering the count, marks each ready pod with the prefix-cache hits
   it served (`routing.deletion_cost`), so the Deployment removes the coldest;
   when the decision changes the count, patches `spec.replicas` through the
   InferenceService's scale subresource (the field an HPA would drive; the
   reconciler carries it to the Deployment) and records a Kubernetes Event
   with the reason;
5. writes `status.autoscaling` {currentMetrics, desiredReplicas,
   lastScaleTime, lastScaleReason} when it differs from what it last wrote.

With scale to zero (`minReplicas: 0`, autoscaling.spec) each round also
reads the router pods' queue (scrape.scrape_router_queue) and the engines'
running requests and sleep gauge, and asks the idle rule
(autoscaling.idle); when it decides, its count replaces the metric rules'
(to zero, to standby, or 0 -> 1 for a queued request), the Event's reason
is its own (ScaledToZero, ScaledFromZero, Standby), standby engines are
put to sleep (autoscaling.sleep), and status.autoscaling also says
idleSince, requestsInFlight, routerQueueLength and asleepReplicas. The
demand annotation's handler (autoscaling.demand) scales 0 -> 1 between
rounds, at once.

Per-object state (the policy's history, the last scrapes, the last status)
lives in kopf's per-object memo, never in module globals. The history moves
forward only after the scale patch succeeded. API errors and bad specs are
logged (a bad spec also as a Warning Event, once per distinct error) and the
loop carries on at the next interval: the autoscaler never crashes the
operator and never scales on a failed read.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import kopf

from pagedinfer.contracts.inference_service import API_GROUP, API_VERSION, PLURAL
from pagedinfer.operator.autoscaling.idle import IdleDecision, IdleObservation, IdleState, decide_idle
from pagedinfer.operator.autoscaling.policy import AutoscalerState, Observation, ScalingDecision, decide
from pagedinfer.operator.autoscaling.readings import (
    IdleCounts,
    PodReading,
    PodScrape,
    aggregate,
    idle_counts,
    pod_reading,
)
from pagedinfer.operator.autoscaling.scrape import PodTarget, query_prometheus, scrape_pods, scrape_router_queue
from pagedinfer.operator.autoscaling.sleep import EngineTarget, put_to_sleep
from pagedinfer.operator.autoscaling.spec import AutoscalingSpec, parse_autoscaling_spec
from pagedinfer.operator.children.builders import HTTP_PORT
from pagedinfer.operator.children.labels import selector_string
from pagedinfer.operator.kube_api import INFERENCESERVICES, PODS, KubeApiError
from pagedinfer.operator.registry import REGISTRY
from pagedinfer.operator.routing.builders import router_selector_string
from pagedinfer.operator.routing.deletion_cost import annotate_deletion_costs, deletion_costs
from pagedinfer.operator.settings import runtime_of
from pagedinfer.operator.stopping import sleep_unless_stopped

INVALID_SPEC_RETRY_SECONDS = 15.0


@dataclasses.dataclass
class AutoscalingMemory:
    """What one InferenceService's autoscaler carries between rounds."""

    state: AutoscalerState = dataclasses.field(default_factory=AutoscalerState)
    scrapes: dict[str, PodScrape] = dataclasses.field(default_factory=dict)  # pod uid -> last good scrape
    written_status: dict[str, Any] | None = None
    spec_error: str | None = None
    idle_state: IdleState = dataclasses.field(default_factory=IdleState)  # the idle rule's timer
    idle_since: str | None = None  # RFC 3339: since when the service has been idle (None: busy)
    # lastScaleTime/lastScaleReason as last decided here or by the demand handler (which shares this memo): the
    # body's status can lag a write the handler has just made, and must not overwrite it with the one before
    last_scale: dict[str, str] | None = None


def memory_of(memo: Any) -> AutoscalingMemory:
    memory = getattr(memo, "autoscaling", None)
    if not isinstance(memory, AutoscalingMemory):
        memory = AutoscalingMemory()
        memo.autoscaling = memory
    return memory


def _enabled(spec: Mapping[str, Any], **_: Any) -> bool:
    autoscaling = spec.get("autoscaling")
    return isinstance(autoscaling, Mapping) and autoscaling.get("enabled") is True


@kopf.daemon(API_GROUP, API_VERSION, PLURAL, registry=REGISTRY, when=_enabled, cancellation_timeout=10.0)
async def autoscale(
    stopped: kopf.DaemonStopped, body: kopf.Body, name: str, namespace: str, memo: Any, logger: logging.Logger, **_: Any
) -> None:
    runtime = runtime_of(memo)
    memory = memory_of(memo)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        while not stopped:
            interval = await autoscale_once(runtime.kube, session, body, name, namespace, memory, logger)
            await sleep_unless_stopped(stopped, interval)


async def autoscale_once(
    kube: Any,
    session: aiohttp.ClientSession,
    body: kopf.Body,
    name: str,
    namespace: str,
    memory: AutoscalingMemory,
    logger: logging.Logger,
) -> float:
    """One round; returns the seconds until the next."""
    raw_spec = dict(body.get("spec") or {})
    try:
        spec = parse_autoscaling_spec(raw_spec)
    except ValueError as e:
        if str(e) != memory.spec_error:
            memory.spec_error = str(e)
            kopf.event(body, type="Warning", reason="InvalidAutoscaling", message=str(e))
        logger.warning("autoscaling spec is invalid: %s", e)
        return INVALID_SPEC_RETRY_SECONDS
    memory.spec_error = None
    if not spec.enabled:
        return spec.interval_seconds
    try:
        pods = await kube.list(PODS, namespace, label_selector=selector_string(name))
    except KubeApiError as e:
        logger.warning("autoscaling: cannot list pods: %s", e)
        return spec.interval_seconds
    ready = [p for p in pods if is_ready(p)]
    readings = await _read_metrics(session, spec, namespace, ready, memory)
    samples, num_failed = aggregate(readings, tuple(m.name for m in spec.metrics))
    current = raw_spec.get("replicas", 1)
    if not isinstance(current, int) or isinstance(current, bool) or current < 0:
        logger.warning("autoscaling: spec.replicas is not a count: %r", current)
        return spec.interval_seconds
    observation = Observation(current, len(ready), num_failed, samples)
    monotonic_now = time.monotonic()
    decision = decide(spec, observation, memory.state, monotonic_now)
    now = _now_iso()
    idle: IdleDecision | None = None
    idle_status: dict[str, Any] = {}
    if spec.scale_to_zero:
        counts = idle_counts(readings)
        queued = await _router_queue(kube, session, spec, name, namespace, logger)
        idle_obs = IdleObservation(current, counts.requests_in_flight, queued, counts.num_awake, counts.num_asleep)
        idle = decide_idle(spec.idle, spec.standby, idle_obs, memory.idle_state, monotonic_now)
        memory.idle_state = idle.state
        memory.idle_since = (memory.idle_since or now) if idle_obs.idle or (current == 0 and not queued) else None
        idle_status = _idle_status(memory.idle_since, counts, queued)
        if idle.desired_replicas is not None:  # the idle rule decides this round: the metric rules' history waits
            state = AutoscalerState() if idle.desired_replicas == 0 else memory.state
            decision = ScalingDecision(current, idle.desired_replicas, None, decision.metrics, idle.reason, state)
    if decision.changed and decision.desired_replicas < current:  # the coldest engine goes first
        await annotate_deletion_costs(kube, namespace, ready, deletion_costs(readings))
    if decision.changed:
        try:
            await kube.patch(
                INFERENCESERVICES,
                namespace,
                name,
                {"spec": {"replicas": decision.desired_replicas}},
                subresource="scale",
            )
        except KubeApiError as e:
            logger.warning("autoscaling: cannot scale to %d: %s", decision.desired_replicas, e)
            return spec.interval_seconds
    acted = decision.changed or (idle is not None and idle.sleep_engines)
    if acted:
        reason = (
            idle.event
            if idle is not None and idle.event
            else "ScaledUp"
            if decision.desired_replicas > current
            else "ScaledDown"
        )
        kopf.event(body, type="Normal", reason=reason, message=decision.reason)
        logger.info("autoscaling: %s", decision.reason)
    if idle is not None and idle.sleep_engines:
        awake = [p for p in ready if not _asleep(readings.get(p["metadata"]["name"]))]
        await put_to_sleep(
            session, [EngineTarget(p["metadata"]["name"], pod_url(p)) for p in awake], spec.scrape_timeout_seconds
        )
    memory.state = decision.state
    status = (
        build_status(decision, memory.last_scale or (body.get("status") or {}).get("autoscaling"), now, acted)
        | idle_status
    )
    if acted:
        memory.last_scale = {"lastScaleTime": status["lastScaleTime"], "lastScaleReason": status["lastScaleReason"]}
    if status != memory.written_status:
        try:
            await kube.patch(
                INFERENCESERVICES, namespace, name, {"status": {"autoscaling": status}}, subresource="status"
            )
            memory.written_status = status
        except KubeApiError as e:
            logger.warning("autoscaling: cannot write status: %s", e)
    return spec.interval_seconds


async def _router_queue(
    kube: Any, session: aiohttp.ClientSession, spec: AutoscalingSpec, name: str, namespace: str, logger: logging.Logger
) -> int | None:
    """Requests held by the InferenceService's ready router pods; None when unknown (no ready router pod,
    a failed read, or the pods could not be listed)."""
    try:
        pods = await kube.list(PODS, namespace, label_selector=router_selector_string(name))
    except KubeApiError as e:
        logger.warning("autoscaling: cannot list the router's pods: %s", e)
        return None
    targets = [PodTarget(p["metadata"]["name"], metrics_url(p)) for p in pods if is_ready(p)]
    return await scrape_router_queue(session, targets, spec.scrape_timeout_seconds)


def _asleep(reading: PodReading | None) -> bool:
    return reading is not None and bool(reading.sleeping)


def _idle_status(idle_since: str | None, counts: IdleCounts, queued: int | None) -> dict[str, Any]:
    """The idle rule's part of status.autoscaling (fields it could not read are left out)."""
    status: dict[str, Any] = {"asleepReplicas": counts.num_asleep}
    for key, value in (
        ("idleSince", idle_since),
        ("requestsInFlight", counts.requests_in_flight),
        ("routerQueueLength", queued),
    ):
        if value is not None:
            status[key] = value
    return status


async def _read_metrics(
    session: aiohttp.ClientSession,
    spec: AutoscalingSpec,
    namespace: str,
    ready: list[dict[str, Any]],
    memory: AutoscalingMemory,
) -> dict[str, PodReading | None]:
    names = [p["metadata"]["name"] for p in ready]
    if spec.source.type == "prometheus":
        return await query_prometheus(
            session,
            spec.source.url or "",
            namespace,
            names,
            max(spec.interval_seconds, 30.0),
            spec.scrape_timeout_seconds,
            with_idle=spec.scale_to_zero,
        )
    targets = [PodTarget(p["metadata"]["name"], metrics_url(p)) for p in ready]
    scrapes = await scrape_pods(session, targets, spec.scrape_timeout_seconds, spec.scrape_concurrency)
    readings: dict[str, PodReading | None] = {}
    kept: dict[str, PodScrape] = {}
    for pod in ready:
        uid, pod_name = pod["metadata"].get("uid") or pod["metadata"]["name"], pod["metadata"]["name"]
        scrape = scrapes.get(pod_name)
        if scrape is None:
            readings[pod_name] = None
            if uid in memory.scrapes:
                kept[uid] = memory.scrapes[uid]
            continue
        readings[pod_name] = pod_reading(memory.scrapes.get(uid), scrape)
        kept[uid] = scrape
    memory.scrapes = kept
    return readings


def is_ready(pod: Mapping[str, Any]) -> bool:
    """Running, Ready condition True, an IP, and not being deleted."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") != "Running" or not status.get("podIP"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def pod_url(pod: Mapping[str, Any]) -> str:
    """http://<podIP>:<port named http, else 8000>: the pod's server."""
    port = HTTP_PORT
    for container in (pod.get("spec") or {}).get("containers") or []:
        for p in container.get("ports") or []:
            if p.get("name") == "http" and isinstance(p.get("containerPort"), int):
                port = p["containerPort"]
    ip = pod["status"]["podIP"]
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}"


def metrics_url(pod: Mapping[str, Any]) -> str:
    """http://<podIP>:<port named http, else 8000>/metrics."""
    return pod_url(pod) + "/metrics"


def build_status(
    decision: ScalingDecision, previous: Mapping[str, Any] | None, now_iso: str, acted: bool | None = None
) -> dict[str, Any]:
    """status.autoscaling for this round; lastScale* carry over until the next action (by default a change
    of the count; `acted` also counts the idle rule putting engines to sleep)."""
    previous = previous or {}
    current_metrics = []
    for m in decision.metrics:
        entry: dict[str, Any] = {"name": m.name, "target": m.target}
        if m.value is not None:
            entry["value"] = round(m.value, 4)
        current_metrics.append(entry)
    status: dict[str, Any] = {"currentMetrics": current_metrics, "desiredReplicas": decision.desired_replicas}
    if decision.changed if acted is None else acted:
        status["lastScaleTime"], status["lastScaleReason"] = now_iso, decision.reason
    else:
        for key in ("lastScaleTime", "lastScaleReason"):
            if key in previous:
                status[key] = previous[key]
    return status


def _now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
