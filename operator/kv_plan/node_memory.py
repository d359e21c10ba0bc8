"""GPU memory per GPU from node labels, on the nodes an engine pod can land on.

NVIDIA GPU Feature Discovery labels every GPU node with
`nvidia.com/gpu.memory` (MiB per GPU; with MIG's single strategy it describes
one slice) and `nvidia.com/gpu.product`. A pod can land on a node when

- the node is schedulable (`spec.unschedulable` is not true),
- every `nodeSelector` entry (plus `nvidia.com/gpu.product` = gpuProduct)
  equals the node's label,
- the pod's required node affinity holds, as the scheduler reads it
  (`nodeSelectorTerms` are ORed; within a term every `matchExpressions`
  entry on the labels (In, NotIn, Exists, DoesNotExist, Gt, Lt) and every
  `matchFields` entry on `metadata.name` (In, NotIn) must hold; a term with
  neither matches no node),
- every NoSchedule/NoExecute taint is tolerated,
- the node can allocate `nvidia.com/gpu` >= the pod's GPU count.

`discover_gpu_memory` takes the smallest labelled memory among those nodes:
the plan must hold wherever the scheduler puts the pod. Nodes without the
label are left out of that minimum, so `require_gpu_memory` adds the other
half: a required node-affinity expression that keeps the pod off every node
whose label is missing or smaller than what the plan was sized for. Pure
functions; the nodes come from the operator's node index, which keeps of
each node only `node_facts` (what these functions read).
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"
MIB = 2**20


@dataclass(frozen=True)
class Placement:
    """The scheduling constraints of an engine pod (as the Deployment builder writes them)."""

    gpus: int
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    affinity: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class GpuMemoryDiscovery:
    """The outcome of looking at the nodes: memory per GPU, or why there is none."""

    gpu_memory_bytes: int | None  # None: no node can take the pod
    node_name: str | None  # the node with the smallest GPU memory among the matches
    num_matching_nodes: int
    num_nodes: int
    rejections: Mapping[str, int]  # why the other nodes were rejected, with counts

    @property
    def message(self) -> str:
        why = ", ".join(f"{count} {reason}" for reason, count in sorted(self.rejections.items()))
        if self.gpu_memory_bytes is None:
            return f"0 of {self.num_nodes} nodes can run the engine pod" + (f" ({why})" if why else "") + "."
        return (
            f"{self.num_matching_nodes} of {self.num_nodes} nodes can run the engine pod; smallest GPU memory"
            f" {self.gpu_memory_bytes // MIB} MiB on node {self.node_name}" + (f" ({why})" if why else "") + "."
        )


def gpu_memory_bytes_from_labels(labels: Mapping[str, str]) -> int | None:
    """Bytes per GPU from `nvidia.com/gpu.memory` (MiB); None when absent or unparseable."""
    value = labels.get(GPU_MEMORY_LABEL)
    if value is None:
        return None
    try:
        mib = int(str(value).strip())
    except ValueError:
        return None
    return mib * MIB if mib > 0 else None


def tolerates(taint: Mapping[str, Any], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    """Whether one taint is tolerated (the scheduler's rule, PreferNoSchedule ignored by the caller)."""
    for tol in tolerations:
        effect = tol.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        operator = tol.get("operator", "Equal")
        key = tol.get("key")
        if operator == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (tol.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _expression_holds(labels: Mapping[str, str], expr: Mapping[str, Any]) -> bool:
    key, operator, values = expr.get("key"), expr.get("operator"), list(expr.get("values") or [])
    present = key in labels
    if operator == "In":
        return present and labels[key] in values
    if operator == "NotIn":
        return not present or labels[key] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and values:
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if operator == "Gt" else have < want
    return False


def _field_holds(node_name: str, expr: Mapping[str, Any]) -> bool:
    """A `matchFields` entry: the API server admits only `metadata.name` with In or NotIn."""
    if expr.get("key") != "metadata.name":
        return False
    values = list(expr.get("values") or [])
    if expr.get("operator") == "In":
        return node_name in values
    if expr.get("operator") == "NotIn":
        return node_name not in values
    return False


def _term_holds(node_name: str, labels: Mapping[str, str], term: Mapping[str, Any]) -> bool:
    expressions, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not expressions and not fields:
        return False  # the scheduler: an empty term selects no node
    return all(_expression_holds(labels, e) for e in expressions) and all(_field_holds(node_name, f) for f in fields)


def _required_terms(affinity: Mapping[str, Any] | None) -> list[Mapping[str, Any]] | None:
    """The required nodeSelectorTerms; None when the pod has no required node affinity."""
    required = ((affinity or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    return None if required is None else list(required.get("nodeSelectorTerms") or [])


def required_affinity_holds(node_name: str, labels: Mapping[str, str], affinity: Mapping[str, Any] | None) -> bool:
    """requiredDuringSchedulingIgnoredDuringExecution node affinity: some term holds for this node."""
    terms = _required_terms(affinity)
    return terms is None or any(_term_holds(node_name, labels, term) for term in terms)


def require_gpu_memory(affinity: Mapping[str, Any] | None, min_mib: int) -> dict[str, Any]:
    """`affinity` (not modified) with `nvidia.com/gpu.memory` Gt `min_mib - 1` in every required term.

    The scheduler's Gt takes one integer, so "at least min_mib" is written as
    greater than min_mib - 1; a node without the label fails it. Terms are
    ORed, so the expression joins every non-empty term; an empty term matches
    no node and stays empty; without required terms it becomes the only one.
    """
    floor = {"key": GPU_MEMORY_LABEL, "operator": "Gt", "values": [str(min_mib - 1)]}
    out = copy.deepcopy(dict(affinity or {}))
    node_affinity = out["nodeAffinity"] = dict(out.get("nodeAffinity") or {})
    terms = [
        {**term, "matchExpressions": [*(term.get("matchExpressions") or []), floor]}
        if term.get("matchExpressions") or term.get("matchFields")
        else term
        for term in _required_terms(out) or ()
    ]
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
        "nodeSelectorTerms": terms or [{"matchExpressions": [floor]}]
    }
    return out


def _allocatable_gpus(node: Mapping[str, Any]) -> int:
    status = node.get("status") or {}
    raw = (status.get("allocatable") or status.get("capacity") or {}).get(GPU_RESOURCE, 0)
    try:
        return int(raw)
    except (TypeError, ValueError):
        return 0


def node_facts(node: Mapping[str, Any]) -> dict[str, Any]:
    """What sizing reads of a node (name, labels, unschedulable, taints, GPU and memory allocatable and capacity).

    The node index holds this, not the whole Node (images, conditions and
    addresses are most of a Node's bytes), so 1,000 nodes cost little memory.
    """
    meta, spec, status = (node.get(key) or {} for key in ("metadata", "spec", "status"))
    # the GPUs, and the memory (spec.engine.kvOffload's percentage and fit: kv_plan/offload.py)
    gpus = {
        kind: {
            GPU_RESOURCE: status[kind].get(GPU_RESOURCE, 0),
            **({"memory": status[kind]["memory"]} if "memory" in status[kind] else {}),
        }
        for kind in ("allocatable", "capacity")
        if isinstance(status.get(kind), Mapping) and status[kind]
    }
    return {
        "metadata": {"name": meta.get("name"), "labels": dict(meta.get("labels") or {})},
        "spec": {"unschedulable": spec.get("unschedulable"), "taints": list(spec.get("taints") or [])},
        "status": gpus,
    }


def rejection_reason(node: Mapping[str, Any], placement: Placement) -> str | None:
    """Why the pod cannot land on this node, or None when it can (and the node is labelled)."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return "unschedulable"
    for key, value in placement.node_selector.items():
        if labels.get(key) != value:
            return f"without label {key}={value}"
    if not required_affinity_holds(meta.get("name", ""), labels, placement.affinity):
        return "outside the required node affinity"
    for taint in spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(taint, placement.tolerations):
            return f"with untolerated taint {taint.get('key')}"
    if placement.gpus and _allocatable_gpus(node) < placement.gpus:
        return f"with fewer than {placement.gpus} allocatable {GPU_RESOURCE}"
    if gpu_memory_bytes_from_labels(labels) is None:
        return f"without a {GPU_MEMORY_LABEL} label"
    return None


def discover_gpu_memory(nodes: Iterable[Mapping[str, Any]], placement: Placement) -> GpuMemoryDiscovery:
    """The smallest per-GPU memory among the nodes the pod can land on."""
    rejections: Counter[str] = Counter()
    best: tuple[int, str] | None = None
    num_nodes = num_matching = 0
    for node in nodes:
        num_nodes += 1
        reason = rejection_reason(node, placement)
        if reason is not None:
            rejections[reason] += 1
            continue
        num_matching += 1
        memory = gpu_memory_bytes_from_labels((node.get("metadata") or {}).get("labels") or {})
        name = (node.get("metadata") or {}).get("name", "?")
        if memory is not None and (best is None or (memory, name) < best):
            best = (memory, name)
    return GpuMemoryDiscovery(
        gpu_memory_bytes=best[0] if best else None,
        node_name=best[1] if best else None,
        num_matching_nodes=num_matching,
        num_nodes=num_nodes,
        rejections=dict(rejections),
    )
