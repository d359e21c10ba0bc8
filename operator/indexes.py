"""The operator's in-memory indexes, kept by kopf from its watches (`@kopf.index`).

- `gpu_nodes`: every Node of the cluster, as `node_memory.node_facts` (what
  sizing reads). kopf lists the nodes once at start and then follows one
  watch, so sizing a service costs no API call whatever the node count
  (bench/operator_scale.py measures it at 10, 100 and 1,000 nodes). kopf
  starts no resource handler before every index is populated, so the first
  reconcile already sees every node.
- `model_config_maps`: (namespace, ConfigMap name) -> the names of the
  InferenceServices whose `spec.model.configMapRef` names it, so a
  ConfigMap event finds the services to reconcile (`config_map_events`).

Handlers get each index as a keyword argument named after its function
(kopf's rule); the reconciler takes the nodes as a plain iterable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import kopf

from pagedinfer.contracts.inference_service import API_GROUP, API_VERSION, PLURAL
from pagedinfer.operator.kv_plan.node_memory import node_facts
from pagedinfer.operator.registry import REGISTRY

ALL_NODES = "all"


@kopf.index("", "v1", "nodes", registry=REGISTRY)
def gpu_nodes(body: kopf.Body, **_: Any) -> dict[str, dict[str, Any]]:
    return {ALL_NODES: node_facts(body)}


def nodes_in(index: Mapping[str, Iterable[Mapping[str, Any]]]) -> Iterable[Mapping[str, Any]]:
    """The nodes `gpu_nodes` holds (none before the first node is seen)."""
    return index.get(ALL_NODES, ())


@kopf.index(API_GROUP, API_VERSION, PLURAL, registry=REGISTRY)
def model_config_maps(spec: Mapping[str, Any], name: str, namespace: str, **_: Any) -> dict[tuple[str, str], str]:
    """The ConfigMap spec.model.configMapRef names, if any ({} drops the service's old entry)."""
    model = spec.get("model") if isinstance(spec, Mapping) else None
    ref = model.get("configMapRef") if isinstance(model, Mapping) else None
    config_map = ref.get("name") if isinstance(ref, Mapping) else None
    return {(namespace, config_map): name} if isinstance(config_map, str) and config_map else {}


def referencing(index: Mapping[tuple[str, str], Iterable[str]], namespace: str, name: str) -> list[str]:
    """Names of the services whose spec.model.configMapRef is this ConfigMap (sorted, each once)."""
    return sorted(set(index.get((namespace, name), ())))
