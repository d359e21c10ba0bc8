"""kopf handlers: thin wrappers that hand the body to the reconciler.

- create / update / resume of an InferenceService -> reconciler.reconcile
  (update fires on spec, label and annotation changes, including
  `spec.replicas` written through the scale subresource; status writes do
  not fire it);
- every event of a Deployment, Service, ServiceAccount, Role or RoleBinding the operator manages ->
  child_events.on_child_event (a deleted child is recreated, one edited by
  someone else is patched back; a Deployment's readiness goes into the
  owner's status);
- every event of a ConfigMap some InferenceService reads its model config
  from -> config_map_events.on_config_map_event (those services are
  reconciled: a fixed config is sized without a retry loop);
- a change of the router's `pagedinfer.io/demand-at` annotation on an
  InferenceService -> autoscaling.demand.on_demand (0 -> 1 at once when it
  is scaled to zero).

Sizing reads the nodes from the `gpu_nodes` index and the ConfigMap
handler its services from `model_config_maps` (both in `indexes`).

All handlers register into `REGISTRY` (pagedinfer.operator.registry); the
startup and login handlers live in `settings`, the autoscaler's daemon in
`autoscaling.daemon`, the daemon that opens engine pods' warm-up readiness
gates while no router pod is ready in `routing.gate_daemon`; importing this
module registers them all.
"""

from __future__ import annotations

from typing import Any

import kopf

from pagedinfer.contracts.inference_service import API_GROUP, API_VERSION, PLURAL
from pagedinfer.operator import child_events, config_map_events, reconciler, settings  # noqa: F401  (startup/login)
from pagedinfer.operator.autoscaling import daemon, demand  # noqa: F401  (registers the autoscaler's daemon, demand)
from pagedinfer.operator.children.labels import MANAGED_BY, MANAGED_BY_LABEL
from pagedinfer.operator.indexes import nodes_in, referencing
from pagedinfer.operator.registry import REGISTRY
from pagedinfer.operator.routing import gate_daemon  # noqa: F401  (registers the warm-up gate's fallback)


@kopf.on.resume(API_GROUP, API_VERSION, PLURAL, registry=REGISTRY)
@kopf.on.create(API_GROUP, API_VERSION, PLURAL, registry=REGISTRY)
@kopf.on.update(API_GROUP, API_VERSION, PLURAL, registry=REGISTRY)
async def reconcile_inference_service(body: kopf.Body, memo: Any, logger: Any, gpu_nodes: kopf.Index, **_: Any) -> None:
    await reconciler.reconcile(settings.runtime_of(memo), body, logger, nodes_in(gpu_nodes))


MANAGED = {MANAGED_BY_LABEL: MANAGED_BY}


@kopf.on.event("apps", "v1", "deployments", labels=MANAGED, registry=REGISTRY)
async def deployment_event(
    body: kopf.Body, type: str | None, memo: Any, logger: Any, gpu_nodes: kopf.Index, **_: Any
) -> None:
    await child_events.on_child_event(settings.runtime_of(memo), "Deployment", body, type, logger, nodes_in(gpu_nodes))


@kopf.on.event("", "v1", "services", labels=MANAGED, registry=REGISTRY)
async def service_event(
    body: kopf.Body, type: str | None, memo: Any, logger: Any, gpu_nodes: kopf.Index, **_: Any
) -> None:
    await child_events.on_child_event(settings.runtime_of(memo), "Service", body, type, logger, nodes_in(gpu_nodes))


@kopf.on.event("", "v1", "serviceaccounts", labels=MANAGED, registry=REGISTRY)
@kopf.on.event("rbac.authorization.k8s.io", "v1", "roles", labels=MANAGED, registry=REGISTRY)
@kopf.on.event("rbac.authorization.k8s.io", "v1", "rolebindings", labels=MANAGED, registry=REGISTRY)
async def router_rbac_event(
    body: kopf.Body, type: str | None, memo: Any, logger: Any, gpu_nodes: kopf.Index, **_: Any
) -> None:
    """The router's ServiceAccount, Role and RoleBinding (operator/routing): repaired as the other children."""
    await child_events.on_child_event(
        settings.runtime_of(memo), body.get("kind", "RBAC object"), body, type, logger, nodes_in(gpu_nodes)
    )


def _referenced(name: str, namespace: str, model_config_maps: kopf.Index, logger: Any, **_: Any) -> bool:
    if referencing(model_config_maps, namespace, name):
        return True
    logger.debug("No InferenceService reads its model config from this ConfigMap: its event is not handled.")
    return False


@kopf.on.event("", "v1", "configmaps", when=_referenced, registry=REGISTRY)
async def config_map_event(
    body: kopf.Body,
    type: str | None,
    name: str,
    namespace: str,
    memo: Any,
    logger: Any,
    model_config_maps: kopf.Index,
    gpu_nodes: kopf.Index,
    **_: Any,
) -> None:
    await config_map_events.on_config_map_event(
        settings.runtime_of(memo),
        body,
        type,
        referencing(model_config_maps, namespace, name),
        nodes_in(gpu_nodes),
        logger,
    )
