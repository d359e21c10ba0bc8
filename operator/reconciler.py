"""One reconcile of an InferenceService.

reconcile(): parse the spec (invalid: Valid=False and Sized=False InvalidSpec, an Event, no children) ->
plan the KV cache (cannot: Sized=False with the numbers, an Event, no
children; retried later when waiting can help; an invalid model config is
also a counted reconcile error, `model_config_invalid`) -> build the Deployment and
Service, and the router's children with `spec.router.enabled` (`routing`; pure) -> apply them (`apply.apply_children`: a name clash is
Applied=False ChildConflict, and a full ResourceQuota Applied=False
QuotaExceeded, both retried; a manifest the API server refuses is
Applied=False ApplyFailed with its message, and a kopf.PermanentError, so it
is tried again on the next spec change or operator restart) -> write status.

Idempotent apply: an unchanged service costs GETs only; a restarted
operator finds its children by name, creates no duplicates, and patches
back what was edited by hand while it was away. Every child the reconcile
applies is remembered by its fingerprint (`Runtime.child_fingerprints`) as
soon as it is applied, also when the other child then fails, so the child
events (`child_events`) can tell the operator's own writes from anyone
else's. The Deployment records the generation it was built from
(`builders.OWNER_GENERATION_ANNOTATION`) for the rollout report.

Whenever an update is not applied and a Deployment exists, that Deployment
keeps serving the last applied spec: status.kvCache keeps its plan and the
failing condition says so. With nothing deployed, Applied, Available and
Ready say NotDeployed and kvCache is removed.

With the router off, its children are deleted after the status write
(`routing.children`); the apply has already pointed the Service back at the engines.

Status is written through `status.writer` (merge patches guarded by the
resourceVersion); reconcile() owns Valid, Sized, Applied, kvCache, url,
selector, routing and observedGeneration. It never writes `spec.replicas`: HPA, KEDA
or the autoscaler own it through the scale subresource, and the next
reconcile carries it to the Deployment.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import kopf

from pagedinfer.operator.children import apply, builders
from pagedinfer.operator.children.drift import fingerprint
from pagedinfer.operator.children.labels import selector_string
from pagedinfer.operator.kube_api import DEPLOYMENTS, KubeApi, KubeApiError
from pagedinfer.operator.kv_plan import resolver
from pagedinfer.operator.routing import builders as routing_builders
from pagedinfer.operator.routing.children import remove_router_children
from pagedinfer.operator.routing.status import routing_status
from pagedinfer.operator.settings import Runtime
from pagedinfer.operator.spec.crd_model import InferenceServiceSpec, SpecError
from pagedinfer.operator.spec.parser import parse_spec
from pagedinfer.operator.status import conditions
from pagedinfer.operator.status.writer import is_news, write_conditions

APPLIED = conditions.true(
    conditions.APPLIED, conditions.REASON_CHILDREN_APPLIED, "The Deployment and Service match the spec."
)


async def reconcile(runtime: Runtime, body: Mapping[str, Any], logger: Any, nodes: Iterable[Mapping[str, Any]]) -> None:
    """One reconcile of `body`; `nodes` are the cluster's nodes as the node index holds them."""
    started = time.monotonic()
    api = runtime.kube
    calls_before = api.calls
    result = "retry"
    try:
        result = await _reconcile(runtime, api, body, logger, nodes)
    except KubeApiError as exc:
        runtime.metrics.errors.labels(reason=f"api_{exc.status or 'network'}").inc()
        raise kopf.TemporaryError(
            f"Kubernetes API error, will retry: {exc}", delay=runtime.config.retry_delay_seconds
        ) from exc
    except kopf.TemporaryError:
        runtime.metrics.errors.labels(reason="temporary").inc()
        raise
    except kopf.PermanentError:
        runtime.metrics.errors.labels(reason="permanent").inc()
        result = "failed"
        raise
    except Exception:  # a bug: kopf logs it and retries; the error alert must see it too
        runtime.metrics.errors.labels(reason="unexpected").inc()
        raise
    finally:
        runtime.metrics.reconciles.labels(result=result).inc()
        runtime.metrics.duration.observe(time.monotonic() - started)
        runtime.metrics.api_requests.inc(api.calls - calls_before)


def autoscaling_enabled(spec: InferenceServiceSpec) -> bool:
    """Whether the autoscaler owns spec.replicas (the daemon in autoscaling.daemon runs)."""
    return spec.autoscaling is not None and spec.autoscaling.enabled


async def _reconcile(
    runtime: Runtime, api: KubeApi, body: Mapping[str, Any], logger: Any, nodes: Iterable[Mapping[str, Any]]
) -> str:
    meta = body["metadata"]
    name, namespace, uid, generation = meta["name"], meta["namespace"], meta["uid"], meta.get("generation")
    try:
        spec = parse_spec(name, body.get("spec"), allow_host_path_models=runtime.config.allow_host_path_models)
    except SpecError as exc:
        deployed = await _deployed(api, namespace, name, uid)
        message = f"Invalid spec: {exc}" + (conditions.KEEPS_SERVING if deployed else "")
        invalid = conditions.false(conditions.VALID, conditions.REASON_INVALID_SPEC, message)
        await _report_failure(api, body, [conditions.not_sized(invalid)], invalid, deployed, logger)
        return "invalid"
    valid = conditions.true(conditions.VALID, conditions.REASON_SPEC_VALID, "The spec is valid.")
    try:
        plan, sized_note = await resolver.plan(runtime, spec, namespace, nodes)
    except resolver.SizingFailure as failure:
        deployed = await _deployed(api, namespace, name, uid)
        message = failure.message + (conditions.KEEPS_SERVING if deployed else "")
        if failure.reason == conditions.REASON_INVALID_SPEC:  # known only from the model's config
            invalid = conditions.false(conditions.VALID, failure.reason, f"Invalid spec: {message}")
            await _report_failure(api, body, [conditions.not_sized(invalid)], invalid, deployed, logger)
            return "invalid"
        await _report_failure(
            api, body, [valid], conditions.false(conditions.SIZED, failure.reason, message), deployed, logger
        )
        if failure.reason == conditions.REASON_MODEL_CONFIG_INVALID:
            runtime.metrics.errors.labels(reason="model_config_invalid").inc()
        if failure.retry_seconds is not None:
            raise kopf.TemporaryError(failure.message, delay=failure.retry_seconds)
        return "unsized"
    sized = conditions.true(conditions.SIZED, conditions.SIZED_REASONS[plan.source], sized_note)
    owner = builders.Owner(name=name, namespace=namespace, uid=uid, generation=generation)

    def remember(child: Mapping[str, Any]) -> None:
        runtime.child_fingerprints[child["metadata"]["uid"]] = fingerprint(child)

    try:
        ownership = apply.Ownership(
            owner_uid=uid,
            owner_name=name,
            keep_replicas=autoscaling_enabled(spec),
            wait_retry_seconds=runtime.config.no_nodes_retry_seconds,
        )
        router = (
            routing_builders.router_children(owner, spec, runtime.config.router_image) if spec.router.enabled else []
        )
        applied = await apply.apply_children(
            api,
            ownership,
            builders.build_deployment(owner, spec, plan, runtime.config.engine_images),
            routing_builders.build_front_service(owner, spec),
            logger,
            on_applied=remember,
            extra=router,
        )
    except apply.NotApplied as failure:
        await _report_failure(
            api,
            body,
            [valid, sized],
            conditions.false(conditions.APPLIED, failure.reason, failure.message),
            failure.deployed,
            logger,
        )
        if failure.retry_seconds is None:
            raise kopf.PermanentError(failure.message) from failure
        raise kopf.TemporaryError(failure.message, delay=failure.retry_seconds) from failure
    await write_conditions(
        api,
        body,
        [valid, sized, APPLIED],
        generation,
        observedGeneration=generation,
        kvCache=plan.to_status(),
        selector=selector_string(name),
        url=builders.service_url(owner),
        routing=routing_status(spec.router, applied[-1]),
    )
    if not spec.router.enabled:  # after the status write: the Service already selects the engines
        await remove_router_children(api, namespace, name, uid, logger)
    return "applied"


async def _deployed(api: KubeApi, namespace: str, name: str, uid: str) -> bool:
    """Whether this InferenceService's Deployment exists (and so keeps serving what was last applied)."""
    deployment = await api.get(DEPLOYMENTS, namespace, name)
    return deployment is not None and (apply.owned_by(deployment, uid) or apply.adoptable(deployment, name))


async def _report_failure(
    api: KubeApi,
    body: Mapping[str, Any],
    others: list[conditions.Condition],
    failed: conditions.Condition,
    deployed: bool,
    logger: Any,
) -> None:
    """Write why this generation is not applied (a Warning Event when that is news).

    `others`: the conditions decided before `failed` (or, for an invalid spec, the Sized it blocks).
    With a Deployment, kvCache stays (the plan it serves); without one,
    Applied/Available/Ready say NotDeployed and kvCache goes.
    """
    generation = body["metadata"].get("generation")
    not_deployed: list[conditions.Condition] = []
    fields: dict[str, Any] = {}
    if not deployed:
        not_deployed = [
            conditions.false(conditions.APPLIED, conditions.REASON_NOT_DEPLOYED, "Nothing is applied."),
            *conditions.rollout_conditions(None),
        ]
        fields = {"kvCache": None, **conditions.rollout_status(None)}
    if is_news(body, failed):
        kopf.warn(dict(body), reason=failed.reason, message=failed.message)
        logger.warning(f"{failed.reason}: {failed.message}")
    await write_conditions(
        api, body, [*not_deployed, *others, failed], generation, observedGeneration=generation, **fields
    )
