"""Gather the sizing inputs from the cluster (nodes, ConfigMap, Hub) and plan the KV cache.

The only I/O around the pure `planning` module. The nodes are not read
here: they come from the operator's node index (`indexes.gpu_nodes`, kept
by kopf from one watch), so a reconcile costs no node LIST. Failures come
back as `SizingFailure(reason, message, retry_seconds)`: retry_seconds is
None when waiting will not help (the spec or the ConfigMap must change),
else the reconcile is retried after that long (new nodes may join, a
ConfigMap may appear).

A model config that cannot describe a model (not JSON, not an object, a
shape field that is not a positive integer within `sizing`'s bounds, a
dtype the engine cannot run) is ModelConfigInvalid, naming the field and
its value; it is not retried: the reconcile runs again when the spec
changes or the referenced ConfigMap does (`config_map_events`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from pagedinfer.contracts import sizing
from pagedinfer.contracts.embedded_model import default_model_dir
from pagedinfer.contracts.model_shape import ModelShape
from pagedinfer.operator.kube_api import CONFIGMAPS
from pagedinfer.operator.kv_plan import offload, planning
from pagedinfer.operator.kv_plan.hub_config import ModelConfigError
from pagedinfer.operator.kv_plan.node_memory import discover_gpu_memory
from pagedinfer.operator.settings import Runtime
from pagedinfer.operator.spec.crd_model import InferenceServiceSpec
from pagedinfer.operator.status import conditions

# The operator never guesses a GPU's memory, so without a matching node it creates no
# Deployment, and so no pending pod for cluster-autoscaler or Karpenter to add a node for.
SCALE_FROM_ZERO_HINT = (
    "For a node pool that scales from zero, set spec.resources.gpuMemory (memory per GPU "
    "of that pool): the operator then sizes from it and creates the Deployment, whose "
    "pending pod lets the cluster autoscaler add a node."
)


class SizingFailure(Exception):
    def __init__(self, reason: str, message: str, retry_seconds: float | None) -> None:
        super().__init__(message)
        self.reason, self.message, self.retry_seconds = reason, message, retry_seconds


def _embedded_default_config() -> dict[str, Any] | None:
    try:
        path = default_model_dir() / "config.json"
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, json.JSONDecodeError):
        return None


async def model_shape(runtime: Runtime, spec: InferenceServiceSpec, namespace: str) -> ModelShape:
    """Architecture inline, else the ConfigMap's config.json, else the Hub's, else the embedded model's.

    A config.json's dtype auto resolves as the engine will on the pod's device
    (`model_shape.resolve_dtype`).
    """
    model = spec.model
    retry = runtime.config.no_nodes_retry_seconds
    unavailable, invalid = conditions.REASON_MODEL_CONFIG_UNAVAILABLE, conditions.REASON_MODEL_CONFIG_INVALID
    if model.architecture is not None:
        return planning.shape_from_architecture(model.architecture, model.dtype, cpu=spec.resources.gpus == 0)
    config: dict[str, Any] | None
    if model.config_map_ref is not None:
        ref = model.config_map_ref
        cm = await runtime.kube.get(CONFIGMAPS, namespace, ref.name)
        text = ((cm or {}).get("data") or {}).get(ref.key)
        if text is None:
            what = "does not exist" if cm is None else f"has no key {ref.key!r}"
            raise SizingFailure(unavailable, f"ConfigMap {ref.name} (spec.model.configMapRef) {what}.", retry)
        try:
            config = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SizingFailure(invalid, f"ConfigMap {ref.name} key {ref.key} is not JSON: {exc}", None) from None
        source = f"ConfigMap {ref.name}"
    elif model.uri is not None and model.uri.scheme == "hf" and runtime.config.fetch_hf_config:
        assert runtime.fetcher is not None and model.uri.repo_id is not None
        try:
            config = await runtime.fetcher.get(model.uri.repo_id, model.revision)
        except ModelConfigError as exc:
            raise SizingFailure(
                unavailable,
                f"Cannot read config.json of {model.uri.raw}: {exc}. Set "
                f"spec.model.architecture or spec.model.configMapRef.",
                retry,
            ) from None
        source = model.uri.raw
    elif model.uri is None and (config := _embedded_default_config()) is not None:
        source = "the embedded default model"
    else:
        where = model.uri.raw if model.uri else "the embedded default model"
        gpu_only = " (or spec.engine.numGpuBlocksOverride, or spec.resources.gpus: 0)" if spec.resources.gpus else ""
        raise SizingFailure(
            unavailable,
            f"The operator cannot read the config of {where}: set "
            f"spec.model.architecture or spec.model.configMapRef{gpu_only}.",
            None,
        )
    try:
        return planning.shape_from_config(config, model.dtype, cpu=spec.resources.gpus == 0)
    except ValueError as exc:
        raise SizingFailure(invalid, f"The model config from {source} is invalid: {exc}", None) from None


def _check_heads_divide(spec: InferenceServiceSpec, shape: ModelShape) -> None:
    """tensorParallelSize must divide the KV and attention heads of the model's config (Valid=False otherwise;
    spec_parser checks spec.model.architecture, which states no attention heads)."""
    tp = spec.engine.tensor_parallel_size
    for what, heads in (("KV heads", shape.num_kv_heads), ("attention heads", shape.num_attention_heads)):
        if heads is not None and heads % tp:
            raise SizingFailure(
                conditions.REASON_INVALID_SPEC,
                f"spec.engine.tensorParallelSize: {tp} does not divide the model's {heads} {what}",
                None,
            )


def _per_node_gpus(spec: InferenceServiceSpec) -> str:
    """For a pod of several GPUs: that they must all be on one node (multi-node replicas are not deployed)."""
    n = spec.resources.gpus
    if n <= 1:
        return ""
    return (
        f" A replica with tensorParallelSize {spec.engine.tensor_parallel_size} needs {n} allocatable"
        f" nvidia.com/gpu on one node; replicas across nodes are not supported (docs/operator.md)."
    )


async def plan(
    runtime: Runtime, spec: InferenceServiceSpec, namespace: str, nodes: Iterable[Mapping[str, Any]]
) -> tuple[planning.KVCachePlan, str]:
    """The KV plan and a sentence saying where its numbers come from; SizingFailure when it cannot be made (yet).

    `nodes`: every node of the cluster as the node index holds it (`node_memory.node_facts`).
    With spec.engine.kvOffload the plan carries its host tier (`offload.py`); one the nodes cannot give is an
    invalid spec naming the field.
    """
    nodes = list(nodes)
    result, message = await _plan_pool(runtime, spec, namespace, nodes)
    if spec.engine.kv_offload is None:
        return result, message
    memory = offload.node_memory(nodes, planning.placement_for(spec))
    try:
        tier = offload.tier_bytes(spec, memory)
        offload.check_fits(spec, tier, planning.pod_memory_bytes(spec), memory)
    except offload.OffloadDoesNotFit as exc:
        raise SizingFailure(conditions.REASON_INVALID_SPEC, str(exc), None) from None
    result = dataclasses.replace(result, offload_bytes=tier)
    tokens = f" ({result.offload_tokens} tokens)" if result.offload_tokens else ""
    return result, f"{message} Host tier: {tier / 2**30:.2f} GiB per rank{tokens}."


async def _plan_pool(
    runtime: Runtime, spec: InferenceServiceSpec, namespace: str, nodes: list[Mapping[str, Any]]
) -> tuple[planning.KVCachePlan, str]:
    """The device pool's plan (what `plan` returns without a host tier)."""
    if spec.resources.gpus == 0:
        return await _plan_cpu(runtime, spec, namespace)
    if not planning.needs_model_shape(spec):
        shape = None
        if spec.model.architecture is not None:
            shape = planning.shape_from_architecture(spec.model.architecture, spec.model.dtype)
        result = planning.plan_for(spec, shape, None, planning.SOURCE_ENGINE)
        return result, sized_message(result)
    shape = await model_shape(runtime, spec, namespace)
    _check_heads_divide(spec, shape)
    where = ""
    if spec.resources.gpu_memory_bytes is not None:
        memory, source = spec.resources.gpu_memory_bytes, planning.SOURCE_SPEC
    else:
        discovery = discover_gpu_memory(nodes, planning.placement_for(spec))
        if discovery.gpu_memory_bytes is None:
            raise SizingFailure(
                conditions.REASON_NO_MATCHING_NODES,
                f"No node to size the KV cache for: {discovery.message}{_per_node_gpus(spec)}"
                f" Retrying in "
                f"{runtime.config.no_nodes_retry_seconds:g}s. {SCALE_FROM_ZERO_HINT}",
                runtime.config.no_nodes_retry_seconds,
            )
        memory, source, where = discovery.gpu_memory_bytes, planning.SOURCE_NODE_LABELS, " " + discovery.message
    try:
        result = planning.plan_for(spec, shape, memory, source)
    except sizing.InsufficientMemoryError as exc:
        raise SizingFailure(conditions.REASON_INSUFFICIENT_GPU_MEMORY, f"{exc}{where}", None) from None
    except ValueError as exc:
        raise SizingFailure(conditions.REASON_INSUFFICIENT_GPU_MEMORY, f"Cannot size: {exc}", None) from None
    return result, sized_message(result) + where


async def _plan_cpu(runtime: Runtime, spec: InferenceServiceSpec, namespace: str) -> tuple[planning.KVCachePlan, str]:
    """A CPU engine's plan (`planning.cpu_plan`). Without the model's shape the engine sizes
    itself within the budget the pod's memory leaves, and the message says why."""
    shape, unknown = None, ""
    if spec.model.architecture is not None:
        shape = planning.shape_from_architecture(spec.model.architecture, spec.model.dtype, cpu=True)
    elif planning.needs_model_shape(spec):
        try:
            shape = await model_shape(runtime, spec, namespace)
        except SizingFailure as failure:
            if failure.reason == conditions.REASON_MODEL_CONFIG_INVALID:
                raise
            unknown = f" The operator cannot size it itself: {failure.message}"
    try:
        result = planning.plan_for(spec, shape, None, planning.SOURCE_MEMORY)
    except sizing.InsufficientMemoryError as exc:
        raise SizingFailure(conditions.REASON_INSUFFICIENT_MEMORY, str(exc), None) from None
    return result, sized_message(result, spec) + unknown


def sized_message(plan_: planning.KVCachePlan, spec: InferenceServiceSpec | None = None) -> str:
    budget = ""
    if plan_.cpu_memory_budget_bytes is not None and spec is not None:
        memory = planning.cpu_memory(spec)[0]
        where = "spec.resources.memory" if spec.resources.memory else "the default pod memory"
        budget = (
            f"a CPU budget of {plan_.cpu_memory_budget_bytes / 2**30:.2f} GiB ({where} {memory} less"
            f" {planning.CPU_RUNTIME_OVERHEAD_BYTES / 2**30:g} GiB for the runtime)"
        )
    if plan_.num_gpu_blocks is None:
        return f"CPU engine: the engine sizes its own KV cache at start-up within {budget or 'its budget'}."
    per_token = f", {plan_.bytes_per_token} bytes per token" if plan_.bytes_per_token else ""
    memory = f" on {plan_.gpu_memory_bytes / 2**30:.1f} GiB GPUs" if plan_.gpu_memory_bytes else ""
    memory = f" within {budget}" if budget else memory
    return (
        f"{plan_.num_gpu_blocks} KV blocks of {plan_.block_size} tokens ({plan_.max_tokens} tokens)"
        f"{memory}{per_token}; source {plan_.source}."
    )
