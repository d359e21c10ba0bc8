"""The prefix cache's host tier of each engine (spec.engine.kvOffload): its size, and whether the nodes can give it.

Pure. The tier is host memory per tensor-parallel rank (the engine's
--kv-offloading-size, GiB), so a pod's memory request grows by tier x ranks.
A percentage is of the smallest allocatable memory among the nodes the pod can
land on (the plan must hold wherever it lands). A tier whose pod cannot fit on
any of those nodes (its memory request, grown by the tier, above the largest
allocatable memory) is an invalid spec naming `spec.engine.kvOffload`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pagedinfer.operator.kv_plan.node_memory import GPU_MEMORY_LABEL, Placement, rejection_reason
from pagedinfer.operator.spec.crd_model import InferenceServiceSpec
from pagedinfer.operator.spec.quantity import quantity_bytes

FIELD = "spec.engine.kvOffload"
MIB = 2**20


class OffloadDoesNotFit(ValueError):
    """The tier cannot be given: the message names FIELD."""


@dataclass(frozen=True)
class NodeMemory:
    """Allocatable memory among the nodes the pod can land on (None: no such node states it)."""

    smallest_bytes: int | None
    largest_bytes: int | None
    largest_node: str | None


def allocatable_memory(node: Mapping[str, Any]) -> int | None:
    raw = ((node.get("status") or {}).get("allocatable") or {}).get("memory")
    try:
        return quantity_bytes(str(raw)) if raw is not None else None
    except ValueError:
        return None


def node_memory(nodes: Iterable[Mapping[str, Any]], placement: Placement) -> NodeMemory:
    """The smallest and largest allocatable memory of the nodes the pod can land on (a CPU pod needs no GPU label)."""
    sizes: list[tuple[int, str]] = []
    for node in nodes:
        reason = rejection_reason(node, placement)
        if reason is not None and GPU_MEMORY_LABEL not in reason:
            continue
        memory = allocatable_memory(node)
        if memory is not None:
            sizes.append((memory, (node.get("metadata") or {}).get("name", "?")))
    if not sizes:
        return NodeMemory(None, None, None)
    return NodeMemory(min(sizes)[0], max(sizes)[0], max(sizes)[1])


def tier_bytes(spec: InferenceServiceSpec, memory: NodeMemory) -> int:
    """The tier per rank in bytes (0: off); OffloadDoesNotFit when a percentage has no node memory to be of."""
    offload = spec.engine.kv_offload
    if offload is None:
        return 0
    if offload.size_bytes is not None:
        return offload.size_bytes
    if memory.smallest_bytes is None:
        raise OffloadDoesNotFit(
            f"{FIELD}: {offload.text} of the node's allocatable memory, but no node the"
            " engine pod can land on states its allocatable memory; give a size (e.g. 8Gi)"
        )
    return int(memory.smallest_bytes * (offload.node_memory_fraction or 0.0))


def check_fits(spec: InferenceServiceSpec, tier: int, pod_memory_bytes: int, memory: NodeMemory) -> None:
    """OffloadDoesNotFit when the pod's memory with the tier is more than every candidate node can allocate."""
    if not tier or memory.largest_bytes is None:
        return
    ranks = spec.engine.tensor_parallel_size
    needed = pod_memory_bytes + tier * ranks
    if needed > memory.largest_bytes:
        per_rank = f" x {ranks} ranks" if ranks > 1 else ""
        raise OffloadDoesNotFit(
            f"{FIELD}: {spec.engine.kv_offload.text if spec.engine.kv_offload else ''} of host tier{per_rank}"
            f" makes the engine pod request {needed // MIB} MiB of memory, but the largest node it can land on"
            f" ({memory.largest_node}) can allocate {memory.largest_bytes // MIB} MiB; lower it"
        )


def offloading_size_gib(tier: int) -> str | None:
    """The engine's --kv-offloading-size for a tier of `tier` bytes (None: off)."""
    return f"{tier / 2**30:.6g}" if tier else None
