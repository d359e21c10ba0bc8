"""Whether a live child still is what the operator built (pure).

`drifted_paths(live, wanted)` compares only what `wanted` sets: `wanted` is
the merge patch the operator would send (`builders.patch_for`), so its keys
are exactly the fields the operator owns and a None value means "must be
absent". Keys that only the live object has (what the API server defaults,
such as a container's `imagePullPolicy` or a Service's `clusterIP`, and what
other controllers add, such as `deployment.kubernetes.io/revision`) are not
compared, so defaulting never looks like drift. A list is owned whole, as a
merge patch replaces it: a different length is drift, and elements are
compared pairwise by the same rule.

What the API server stores in another spelling is not drift either:
- resource quantities (a container's `resources.requests`/`limits`, an
  emptyDir's `sizeLimit`) are compared by value, as the server keeps their
  canonical form (0.5 -> 500m, 1024Mi -> 1Gi, 2000m -> 2; `quantity`);
- a wanted empty string, list or map equals an absent key: the API types omit
  empty fields (`omitempty`), so an env item `{name: X, value: ""}` comes
  back as `{name: X}`.

`fingerprint(obj)` hashes the part of an object the operator owns: all but
its metadata and status, and of the metadata its ownerReferences, the labels
the operator sets (`builders.OWNED_LABEL_KEYS`) and the annotations under the
operator's API group. It changes when someone edits what the operator
manages, and not when a controller writes status or its own metadata (the
Deployment controller's `deployment.kubernetes.io/revision`, kubectl's
last-applied-configuration, another tool's labels), nor on the bookkeeping
of every write (resourceVersion, generation, managedFields).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagedinfer.operator.children.builders import OWNED_ANNOTATION_PREFIX, OWNED_LABEL_KEYS, content_hash
from pagedinfer.operator.spec.quantity import same_quantity

QUANTITY_MAPS = ("requests", "limits")  # under a `resources` key
QUANTITY_KEYS = ("sizeLimit",)
EMPTY_VALUES = ("", [], {})


def drifted_paths(live: Any, wanted: Any, path: str = "", quantity: bool = False) -> list[str]:
    """Dotted paths (`spec.template.spec.containers[0].image`) where `live` differs from `wanted`.

    quantity: `live` and `wanted` are resource quantities, equal when their values are.
    """
    if isinstance(wanted, Mapping):
        if not isinstance(live, Mapping):
            return [path]
        quantities = path.endswith(".resources") or path == "resources"
        drifted = []
        for key, value in wanted.items():
            where = f"{path}.{key}" if path else key
            if value is None:
                if live.get(key) is not None:
                    drifted.append(where)
            elif key not in live:
                if value not in EMPTY_VALUES:
                    drifted.append(where)
            else:
                drifted += drifted_paths(
                    live[key], value, where, quantity or (quantities and key in QUANTITY_MAPS) or key in QUANTITY_KEYS
                )
        return drifted
    if isinstance(wanted, list):
        if not isinstance(live, list) or len(live) != len(wanted):
            return [path]
        return [
            p for i, (have, want) in enumerate(zip(live, wanted)) for p in drifted_paths(have, want, f"{path}[{i}]")
        ]
    if live == wanted or (quantity and same_quantity(live, wanted)):
        return []
    return [path]


def owned_part(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What of `obj` the operator owns or sets (see the module docstring)."""
    meta = obj.get("metadata") or {}
    owned_meta = {
        "ownerReferences": meta.get("ownerReferences"),
        "labels": {k: v for k, v in (meta.get("labels") or {}).items() if k in OWNED_LABEL_KEYS},
        "annotations": {
            k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(OWNED_ANNOTATION_PREFIX)
        },
    }
    return {**{k: v for k, v in obj.items() if k not in ("status", "metadata")}, "metadata": owned_meta}


def fingerprint(obj: Mapping[str, Any]) -> str:
    """A hash of `owned_part(obj)`."""
    return content_hash(owned_part(obj))
