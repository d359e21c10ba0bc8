"""The router's children as pure manifests, and what it changes in the engines' (no I/O).

With `spec.router.enabled` an InferenceService `NAME` gets, besides its engine Deployment:

- Deployment `NAME-router`: `spec.router.replicas` pods running
  `pagedinfer router --discover-service NAME-engines --policy P` on port 8000
  (named `http`, as the engines'), non-root, read-only root filesystem, all
  capabilities dropped; readiness and startup on `/health` (503 while no
  engine is healthy, so a router with no engine takes no traffic); liveness
  on the TCP port, not `/health`: a router must not be restarted because
  the engines are loading or scaled to zero. The API key comes from the
  engines' Secret (`spec.engine.apiKeySecretRef`) as `PAGEDINFER_API_KEY`.
  A pvc:// or file:// model is mounted read-only so the router tokenizes with
  the engines' own tokenizer (`--tokenizer`).
- ServiceAccount, Role and RoleBinding `NAME-router`: `list` on
  `discovery.k8s.io` EndpointSlices in the namespace (the router polls
  them, router/discovery.py; it never watches), with warm-up on `patch` on
  `pods/status` (the engine pods' readiness gate, contracts/routing/lifecycle.py), and, with scale to zero
  (`minReplicas: 0`, autoscaling.spec), `get` and `patch` on its own
  InferenceService only (`resourceNames: [NAME]`): it writes the demand
  annotation there (router/hold/demand.py, autoscaling.demand says why this
  way); the pod then gets PAGEDINFER_INFERENCESERVICE_NAME / _NAMESPACE,
  without which the router signals nothing. `spec.router.queue` becomes the
  router's hold-queue flags (only the fields set: else the router's defaults).
- Service `NAME-engines`: headless (clusterIP None), selecting the engine
  pods; its EndpointSlices are what the router follows.
- Service `NAME` (the one `status.url` names) selects the router pods
  instead of the engines.

The engines get `--kv-events` (`engine_flags`). Every child carries the owner
reference, labels and spec hash of the engine's children (`builders`).
"""

from __future__ import annotations

from typing import Any

from pagedinfer.contracts.inference_service import API_GROUP, PLURAL
from pagedinfer.contracts.routing.demand import INFERENCESERVICE_NAME_ENV, INFERENCESERVICE_NAMESPACE_ENV
from pagedinfer.operator.children import builders
from pagedinfer.operator.children.drift import with_spec_hash
from pagedinfer.operator.children.labels import common_labels, label_selector, selector_labels
from pagedinfer.operator.kube_api import DEPLOYMENTS, ROLE_BINDINGS, ROLES, SERVICE_ACCOUNTS, SERVICES, ResourceRef
from pagedinfer.operator.spec.crd_model import InferenceServiceSpec

ROUTER_SUFFIX = "-router"
ENGINES_SUFFIX = "-engines"
ROUTER_COMPONENT = "router"
RBAC_API_VERSION = "rbac.authorization.k8s.io/v1"
# What the router's service account may do: poll its engines' EndpointSlices (router/discovery.py).
ROUTER_RULES = ({"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]},)
# With warm-up on, also: set the engine pods' warmed condition, their readiness gate (contracts/routing/lifecycle.py).
WARMED_GATE_RULE = {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]}
# With scale to zero, also: read and annotate its own InferenceService (the demand signal).
DEMAND_VERBS = ("get", "patch")
# spec.router.queue's fields -> the router's flags (router/cli.py).
QUEUE_FLAGS = (("max_requests", "--max-queued-requests"), ("timeout_seconds", "--queue-timeout-seconds"))


def demand_rule(owner_name: str) -> dict[str, Any]:
    """`get`, `patch` on exactly one InferenceService: the router's own."""
    return {"apiGroups": [API_GROUP], "resources": [PLURAL], "verbs": list(DEMAND_VERBS), "resourceNames": [owner_name]}


def signals_demand(spec: InferenceServiceSpec) -> bool:
    """Whether the router writes the demand annotation: the service scales to zero."""
    return spec.autoscaling is not None and spec.autoscaling.enabled and spec.autoscaling.scale_to_zero


def router_name(owner_name: str) -> str:
    return owner_name + ROUTER_SUFFIX


def engines_service_name(owner_name: str) -> str:
    return owner_name + ENGINES_SUFFIX


def router_selector_labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "pagedinfer-router", "app.kubernetes.io/instance": name}


def router_selector_string(name: str) -> str:
    """The router pods' label selector, as a list call takes it."""
    return label_selector(router_selector_labels(name))


def router_labels(name: str) -> dict[str, str]:
    return {
        **common_labels(name),
        **router_selector_labels(name),
        "app.kubernetes.io/component": ROUTER_COMPONENT,
    }


def _metadata(owner: builders.Owner, name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels,
        "ownerReferences": [builders.owner_reference(owner)],
    }


def _tokenizer(spec: InferenceServiceSpec) -> tuple[list[str], list[dict], list[dict]]:
    """(--tokenizer args, volumes, mounts): the model's own directory when the pod can mount it."""
    uri = spec.model.uri
    if uri is None or uri.scheme not in ("pvc", "file"):
        return [], [], []
    model_args, volumes, mounts, _ = builders.model_arg_and_mounts(spec)
    return ["--tokenizer", model_args[1]], volumes, mounts


def router_args(owner: builders.Owner, spec: InferenceServiceSpec) -> list[str]:
    """The `pagedinfer router` command line (after the executable)."""
    queue = [
        arg
        for field, flag in QUEUE_FLAGS
        if (value := getattr(spec.router.queue, field)) is not None
        for arg in (flag, f"{value:g}" if isinstance(value, float) else str(value))
    ]
    return [
        "router",
        "--discover-service",
        engines_service_name(owner.name),
        "--engine-port-name",
        "http",
        "--policy",
        spec.router.policy,
        "--host",
        "0.0.0.0",
        "--port",
        str(builders.HTTP_PORT),
        *queue,
        *_tokenizer(spec)[0],
        *spec.router.warmup.router_args(),
    ]


def build_router_deployment(owner: builders.Owner, spec: InferenceServiceSpec, default_image: str) -> dict[str, Any]:
    name = router_name(owner.name)
    _, volumes, mounts = _tokenizer(spec)
    env: list[dict[str, Any]] = [{"name": "HOME", "value": "/tmp"}]
    ref = spec.engine.api_key_secret_ref
    if ref is not None:  # a reference only: the key never enters a manifest
        env.append({"name": "PAGEDINFER_API_KEY", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    if signals_demand(spec):
        env += [
            {"name": INFERENCESERVICE_NAME_ENV, "value": owner.name},
            {"name": INFERENCESERVICE_NAMESPACE_ENV, "value": owner.namespace},
        ]
    container = {
        "name": "router",
        "image": spec.router.image or default_image,
        "command": ["pagedinfer"],
        "args": router_args(owner, spec),
        "ports": [{"name": "http", "containerPort": builders.HTTP_PORT, "protocol": "TCP"}],
        "env": env,
        "resources": {key: dict(values) for key, values in spec.router.resources.items()},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, *mounts],
        "startupProbe": builders.probe("/health", 2, 150),
        "readinessProbe": builders.probe("/health", 2, 2),
        "livenessProbe": {
            "tcpSocket": {"port": "http"},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(builders.PRE_STOP_SLEEP_SECONDS)]}}},
        "securityContext": builders.container_security_context(),
    }
    pod = {
        "serviceAccountName": name,
        "automountServiceAccountToken": True,  # the router lists EndpointSlices with it
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": builders.PRE_STOP_SLEEP_SECONDS + 30,
        "securityContext": builders.pod_security_context(),
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}, *volumes],
    }
    labels = router_labels(owner.name)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(owner, name, labels),
        "spec": {
            "replicas": spec.router.replicas,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": router_selector_labels(owner.name)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": labels},
                "spec": pod,
            },
        },
    }
    return with_spec_hash(deployment)


def build_service_account(owner: builders.Owner) -> dict[str, Any]:
    return with_spec_hash(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _metadata(owner, router_name(owner.name), router_labels(owner.name)),
        }
    )


def build_role(owner: builders.Owner, spec: InferenceServiceSpec) -> dict[str, Any]:
    rules = [dict(rule) for rule in ROUTER_RULES]
    rules += [dict(WARMED_GATE_RULE)] if spec.router.warmup.enabled else []
    rules += [demand_rule(owner.name)] if signals_demand(spec) else []
    return with_spec_hash(
        {
            "apiVersion": RBAC_API_VERSION,
            "kind": "Role",
            "metadata": _metadata(owner, router_name(owner.name), router_labels(owner.name)),
            "rules": rules,
        }
    )


def build_role_binding(owner: builders.Owner) -> dict[str, Any]:
    name = router_name(owner.name)
    return with_spec_hash(
        {
            "apiVersion": RBAC_API_VERSION,
            "kind": "RoleBinding",
            "metadata": _metadata(owner, name, router_labels(owner.name)),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}],
        }
    )


def build_engines_service(owner: builders.Owner) -> dict[str, Any]:
    """The engines' headless Service: its EndpointSlices list the engine pods the router may use."""
    return with_spec_hash(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _metadata(owner, engines_service_name(owner.name), common_labels(owner.name)),
            "spec": {
                "clusterIP": "None",
                "selector": selector_labels(owner.name),
                "ports": [{"name": "http", "port": builders.HTTP_PORT, "targetPort": "http", "protocol": "TCP"}],
            },
        }
    )


def build_front_service(owner: builders.Owner, spec: InferenceServiceSpec) -> dict[str, Any]:
    """Service NAME (status.url): the router pods with the router on, else the engines."""
    service = builders.build_service(owner)
    if spec.router.enabled:
        service["spec"]["selector"] = router_selector_labels(owner.name)
        with_spec_hash(service)
    return service


def router_children(
    owner: builders.Owner, spec: InferenceServiceSpec, default_image: str
) -> list[tuple[ResourceRef, dict[str, Any]]]:
    """The router's own children, in apply order (its RBAC before the pods that use it)."""
    return [
        (SERVICE_ACCOUNTS, build_service_account(owner)),
        (ROLES, build_role(owner, spec)),
        (ROLE_BINDINGS, build_role_binding(owner)),
        (SERVICES, build_engines_service(owner)),
        (DEPLOYMENTS, build_router_deployment(owner, spec, default_image)),
    ]


def router_child_names(owner_name: str) -> list[tuple[ResourceRef, str]]:
    """Every child the router adds, by kind and name (what turning it off deletes)."""
    name = router_name(owner_name)
    return [
        (DEPLOYMENTS, name),
        (ROLE_BINDINGS, name),
        (ROLES, name),
        (SERVICE_ACCOUNTS, name),
        (SERVICES, engines_service_name(owner_name)),
    ]
