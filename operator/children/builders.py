"""Pure builders: an InferenceService spec and its KV plan in, child manifests (dicts) out.

No I/O and no kopf here; the reconciler applies what these return. Every
manifest passes `kubernetes-validate --strict` (a test checks 1.28, 1.30 and the
newest schema the library ships).

Rollouts: the Deployment controller rolls the pods when the pod template
changes, and everything that changes the engine process (command line,
image, env, resources, volumes) is in it; `spec.replicas` is not, so a
replica change rolls nothing. No annotation hashes the template into
itself (that would roll nothing the template change does not).

Placement: the pod gets exactly the constraints sizing looked at
(`planning.placement_for`); a plan sized from node labels also requires
`nvidia.com/gpu.memory` of at least the memory it was sized for, so the pod
never lands on an unlabelled or smaller node the plan does not hold on.

Termination: Kubernetes takes a terminating pod out of the Service's
endpoints while it sends SIGTERM, not before, and kube-proxy, ingress
controllers and service meshes learn of it seconds later: until then they
still send new connections to the pod. The engine container's preStop hook
sleeps PRE_STOP_SLEEP_SECONDS first (with a router in front, the router's
discovery poll plus a margin instead: routing/engine_flags.py), so the
server keeps accepting and serving them; then SIGTERM starts its drain
(`pagedinfer serve --shutdown-grace-seconds`, 30 s by default), and the
pod's terminationGracePeriodSeconds covers both with room to exit. The
hook is an exec of `sleep` (coreutils, in every engine image's base), not
Kubernetes' native `sleep` action: that needs 1.30, and the manifests
must validate on 1.28.

Bookkeeping: each child carries `serving.pagedinfer.dev/spec-hash` (of its
desired spec and labels: `drift.with_spec_hash`, which also diffs a live child
against what is built here), and the Deployment
`serving.pagedinfer.dev/owner-generation`, the InferenceService generation
it was built from (a metadata change: it rolls nothing). Both are the
operator's; other annotations on a child are not. Labels and selectors:
`labels`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pagedinfer.contracts.config.engine_config import EngineConfig
from pagedinfer.contracts.config.options import command_line
from pagedinfer.contracts.config.serve_args import ServeArgs
from pagedinfer.contracts.inference_service import API_GROUP, API_VERSION, KIND
from pagedinfer.operator.children.drift import with_spec_hash
from pagedinfer.operator.children.labels import common_labels, selector_labels
from pagedinfer.operator.kv_plan.node_memory import GPU_RESOURCE, MIB, require_gpu_memory
from pagedinfer.operator.kv_plan.offload import offloading_size_gib
from pagedinfer.operator.kv_plan.planning import (
    SOURCE_NODE_LABELS,
    KVCachePlan,
    cpu_memory,
    placement_for,
    pod_memory_bytes,
)
from pagedinfer.operator.routing.engine_flags import (
    engine_pre_stop_wait_seconds,
    engine_readiness_gates,
    engine_router_args,
    engine_router_ports,
)
from pagedinfer.operator.spec.crd_model import HF_TOKEN_ENV, EngineImages, InferenceServiceSpec

HTTP_PORT = 8000
# On the Deployment: the InferenceService's metadata.generation it was built from, which the
# rollout report states as Available's and Ready's observedGeneration (child_events).
OWNER_GENERATION_ANNOTATION = f"{API_GROUP}/owner-generation"
MODEL_CACHE_PATH = "/cache"
PVC_MODEL_ROOT = "/mnt/models"
RUN_AS_USER = 1000
# Generous: a 70B model can take many minutes to load from a cold cache.
STARTUP_PROBE_SECONDS = 1800
# How long a terminating engine keeps serving before SIGTERM, while endpoints are removed.
PRE_STOP_SLEEP_SECONDS = 10
ENGINE_DRAIN_SECONDS = round(ServeArgs.__dataclass_fields__["shutdown_grace_seconds"].default)  # serve's default
ENGINE_EXIT_SECONDS = 20  # after the drain, for the process to exit


def termination_grace_period_seconds(pre_stop_seconds: int) -> int:
    """preStop + the engine's drain + time to exit: SIGKILL never cuts a drain short."""
    return pre_stop_seconds + ENGINE_DRAIN_SECONDS + ENGINE_EXIT_SECONDS


@dataclass(frozen=True)
class Owner:
    """The InferenceService that owns the children (for ownerReferences and names)."""

    name: str
    namespace: str
    uid: str
    generation: int | None = None  # its metadata.generation: OWNER_GENERATION_ANNOTATION on the Deployment


def service_url(owner: Owner) -> str:
    return f"http://{owner.name}.{owner.namespace}.svc:{HTTP_PORT}"


def owner_reference(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def model_arg_and_mounts(spec: InferenceServiceSpec) -> tuple[list[str], list[dict], list[dict], list[dict]]:
    """(--model args, volumes, volumeMounts, env) for spec.model.uri."""
    uri = spec.model.uri
    if uri is None:
        return [], [], [], []
    if uri.scheme == "hf":
        env = [] if spec.model.allow_download else [{"name": "HF_HUB_OFFLINE", "value": "1"}]
        token = spec.model.hf_token_secret_ref
        if token is not None:  # a reference only: the token itself never enters a manifest or the status
            env.append({"name": HF_TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": token.name, "key": token.key}}})
        revision = None if spec.model.revision == "main" else spec.model.revision
        return serve_flags(model=uri.repo_id or "", revision=revision), [], [], env
    if uri.scheme == "pvc":
        volume = {"name": "model", "persistentVolumeClaim": {"claimName": uri.claim_name, "readOnly": True}}
        mount = {"name": "model", "mountPath": PVC_MODEL_ROOT, "readOnly": True}
        path = f"{PVC_MODEL_ROOT}/{uri.path}" if uri.path else PVC_MODEL_ROOT
        return serve_flags(model=path), [volume], [mount], []
    if uri.scheme == "file":
        volume = {"name": "model", "hostPath": {"path": uri.path, "type": "Directory"}}
        mount = {"name": "model", "mountPath": uri.path, "readOnly": True}
        return serve_flags(model=uri.path or ""), [volume], [mount], []
    return serve_flags(model=uri.raw), [], [], []


def serve_flags(**values: str | bool | None) -> list[str]:
    """`pagedinfer serve` flags by their fields' names (EngineConfig, ServeArgs): the options' one definition
    names each flag (`contracts/config/options.py` `command_line`); texts are formatted here, as they always were, so a
    built pod template does not change (a change would roll every engine pod on an operator upgrade)."""
    return command_line((EngineConfig, ServeArgs), values)


def _text(value: int | None) -> str | None:
    return None if value is None else str(value)


def engine_args(spec: InferenceServiceSpec, plan: KVCachePlan) -> list[str]:
    """The `pagedinfer serve` command line (after the executable)."""
    e = spec.engine
    model_args = model_arg_and_mounts(spec)[0]
    return [
        "serve",
        *model_args,
        *serve_flags(
            host="0.0.0.0",
            port=str(HTTP_PORT),
            block_size=str(e.block_size),
            gpu_memory_utilization=repr(e.gpu_memory_utilization),
            cpu_memory_budget_bytes=_text(plan.cpu_memory_budget_bytes),
            num_gpu_blocks_override=_text(plan.num_gpu_blocks),
            max_model_len=_text(e.max_model_len),
            max_num_seqs=str(e.max_num_seqs),
            max_num_batched_tokens=str(e.max_num_batched_tokens),
            enable_prefix_caching=e.enable_prefix_caching,
            enable_chunked_prefill=e.enable_chunked_prefill,
            swap_space=f"{e.swap_space_gib:g}",
            kv_offloading_size=offloading_size_gib(plan.offload_bytes or 0),
            tensor_parallel_size=str(e.tensor_parallel_size),
            max_cudagraph_capture_size=_text(e.max_cudagraph_capture_size or None),
            dtype=spec.model.dtype,
            served_model_name=spec.served_model_name,
        ),
        *engine_router_args(spec.router),
        *e.extra_args,
    ]


def _resources(spec: InferenceServiceSpec, plan: KVCachePlan) -> dict[str, Any]:
    """Requests and limits. Memory is requested and limited alike; a CPU engine always gets
    the memory its --cpu-memory-budget was derived from (`planning.cpu_memory`). The prefix cache's
    host tier (plan.offload_bytes per rank) adds to the memory: to the request and limit where there is
    one, else it is the request alone (a GPU pod without spec.resources.memory)."""
    r = spec.resources
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if r.cpu:
        requests["cpu"] = r.cpu
    memory = cpu_memory(spec)[0] if r.gpus == 0 else r.memory
    tier = (plan.offload_bytes or 0) * spec.engine.tensor_parallel_size
    if tier and memory:
        memory = f"{-(-(pod_memory_bytes(spec) + tier) // MIB)}Mi"
    elif tier:
        requests["memory"] = f"{-(-tier // MIB)}Mi"
    if memory:
        requests["memory"] = limits["memory"] = memory
    if r.gpus:
        limits[GPU_RESOURCE] = str(r.gpus)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _shm_size_limit(spec: InferenceServiceSpec) -> str:
    """The memory-backed /dev/shm: 1 GiB for the process plus 1 GiB per rank for NCCL's shared-memory
    transport buffers between the ranks of a tensor-parallel replica (2Gi for one rank)."""
    return f"{1 + spec.engine.tensor_parallel_size}Gi"


def _env(spec: InferenceServiceSpec, model_env: list[dict]) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "HOME", "value": "/tmp"},  # the root filesystem is read-only
        {"name": "HF_HOME", "value": f"{MODEL_CACHE_PATH}/huggingface"},
        *model_env,
    ]
    ref = spec.engine.api_key_secret_ref
    if ref is not None:
        env.append({"name": "PAGEDINFER_API_KEY", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    env.extend(dict(item) for item in spec.engine.env)
    return env


def probe(path: str, period_seconds: int, failure_threshold: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period_seconds,
        "timeoutSeconds": 5,
        "failureThreshold": failure_threshold,
    }


def container_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def build_pod_spec(
    spec: InferenceServiceSpec, plan: KVCachePlan, images: EngineImages = EngineImages()
) -> dict[str, Any]:
    """The engine pod; its image is spec.engine.image, else `images`' for the pod's GPU count."""
    _, model_volumes, model_mounts, model_env = model_arg_and_mounts(spec)
    placement = placement_for(spec)
    pre_stop_seconds = engine_pre_stop_wait_seconds(spec.router, PRE_STOP_SLEEP_SECONDS)
    cache_volume: dict[str, Any] = (
        {"name": "model-cache", "persistentVolumeClaim": {"claimName": spec.model.cache_claim_name}}
        if spec.model.cache_claim_name
        else {"name": "model-cache", "emptyDir": {}}
    )
    container = {
        "name": "engine",
        "image": spec.engine.image or images.for_gpus(spec.resources.gpus),
        "command": ["pagedinfer"],
        "args": engine_args(spec, plan),
        "ports": [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}, *engine_router_ports(spec.router)],
        "env": _env(spec, model_env),
        "resources": _resources(spec, plan),
        "volumeMounts": [
            {"name": "model-cache", "mountPath": MODEL_CACHE_PATH},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "shm", "mountPath": "/dev/shm"},
            *model_mounts,
        ],
        "startupProbe": probe("/health", 10, STARTUP_PROBE_SECONDS // 10),
        "readinessProbe": probe("/health", 5, 3),
        "livenessProbe": probe("/health", 15, 4),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(pre_stop_seconds)]}}},
        "securityContext": container_security_context(),
    }
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": termination_grace_period_seconds(pre_stop_seconds),
        "securityContext": pod_security_context(),
        "containers": [container],
        "volumes": [
            cache_volume,
            {"name": "tmp", "emptyDir": {}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": _shm_size_limit(spec)}},
            *model_volumes,
        ],
    }
    if gates := engine_readiness_gates(spec.router):
        pod["readinessGates"] = gates
    if placement.node_selector:
        pod["nodeSelector"] = dict(placement.node_selector)
    if placement.tolerations:
        pod["tolerations"] = [dict(t) for t in placement.tolerations]
    affinity = placement.affinity
    if plan.source == SOURCE_NODE_LABELS and plan.gpu_memory_bytes is not None:
        affinity = require_gpu_memory(affinity, plan.gpu_memory_bytes // MIB)
    if affinity:
        pod["affinity"] = dict(affinity)
    return pod


def build_deployment(
    owner: Owner, spec: InferenceServiceSpec, plan: KVCachePlan, images: EngineImages = EngineImages()
) -> dict[str, Any]:
    pod_spec = build_pod_spec(spec, plan, images)
    labels = common_labels(owner.name)
    strategy = (
        {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
        if spec.resources.gpus
        else {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    )
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": owner.name,
            "namespace": owner.namespace,
            "labels": labels,
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": {
            "replicas": spec.effective_replicas,
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": STARTUP_PROBE_SECONDS + 600,
            "selector": {"matchLabels": selector_labels(owner.name)},
            "strategy": strategy,
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(HTTP_PORT),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": pod_spec,
            },
        },
    }
    with_spec_hash(deployment)
    if owner.generation is not None:
        deployment["metadata"]["annotations"][OWNER_GENERATION_ANNOTATION] = str(owner.generation)
    return deployment


def built_for_generation(deployment: Mapping[str, Any]) -> int | None:
    """The owner generation a live Deployment was built from (None: not recorded, or not a number)."""
    value = ((deployment.get("metadata") or {}).get("annotations") or {}).get(OWNER_GENERATION_ANNOTATION)
    return int(value) if isinstance(value, str) and value.isdigit() else None


def build_service(owner: Owner) -> dict[str, Any]:
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": owner.name,
            "namespace": owner.namespace,
            "labels": common_labels(owner.name),
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(owner.name),
            "ports": [{"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    return with_spec_hash(service)
