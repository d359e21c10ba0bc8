"""What the operator owns of a child, the patch that restores it, and whether it drifted (pure).

Building stamps each child with `serving.pagedinfer.dev/spec-hash`
(`with_spec_hash`: a hash of its desired spec and labels), so an unchanged
child costs one GET and no PATCH; the operator's annotations are those under
its API group (OWNED_ANNOTATION_PREFIX), others' on a child are not.

`patch_for(desired, live)` is the merge patch that makes a live child equal to
`desired` in what the operator manages: its labels, annotations and
ownerReferences, and all of its body but status. Lists are replaced whole by a
merge patch; the optional pod fields the spec no longer sets are deleted
explicitly (null), and so are keys of `live` in a map the operator owns whole
(CLOSED_MAPS). Other server-set fields (clusterIP, status, defaults) are left
alone.

`drifted_paths(live, wanted)` compares only what `wanted` sets: `wanted` is
the merge patch the operator would send (`patch_for`), so its keys
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
the operator sets (`labels.OWNED_LABEL_KEYS`) and the annotations under the
operator's API group. It changes when someone edits what the operator
manages, and not when a controller writes status or its own metadata (the
Deployment controller's `deployment.kubernetes.io/revision`, kubectl's
last-applied-configuration, another tool's labels), nor on the bookkeeping
of every write (resourceVersion, generation, managedFields).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from pagedinfer.contracts.inference_service import API_GROUP
from pagedinfer.operator.children.labels import OWNED_LABEL_KEYS
from pagedinfer.operator.spec.quantity import same_quantity

SPEC_HASH_ANNOTATION = f"{API_GROUP}/spec-hash"
# The children's annotations the operator owns; others' (deployment.kubernetes.io/revision) are not its.
OWNED_ANNOTATION_PREFIX = f"{API_GROUP}/"
OPTIONAL_POD_FIELDS = ("nodeSelector", "tolerations", "affinity")
# Maps the operator owns whole: a key added by hand changes which pods the Service selects
# or where they run, so the patch deletes it. (Not resources: the API server defaults
# requests from limits, and a LimitRange adds limits.)
CLOSED_MAPS = (
    ("Service", ("spec", "selector")),
    ("Deployment", ("spec", "template", "spec", "nodeSelector")),
)

QUANTITY_MAPS = ("requests", "limits")  # under a `resources` key
QUANTITY_KEYS = ("sizeLimit",)
EMPTY_VALUES = ("", [], {})


def content_hash(value: Any) -> str:
    """A short sha256 of `value` as canonical JSON (sorted keys): equal content, equal hash."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def owned_body(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The top-level fields the operator sets besides metadata: `spec`, or a Role's `rules`, a RoleBinding's
    `roleRef` and `subjects` (kinds without a spec)."""
    return {k: v for k, v in manifest.items() if k not in ("apiVersion", "kind", "metadata", "status")}


def with_spec_hash(manifest: dict[str, Any]) -> dict[str, Any]:
    """Stamp the hash of the desired spec+labels, so an unchanged child costs one GET and no PATCH."""
    desired = {**owned_body(manifest), "labels": manifest["metadata"].get("labels")}
    manifest["metadata"]["annotations"] = {SPEC_HASH_ANNOTATION: content_hash(desired)}
    return manifest


def dig(obj: Any, path: tuple[str, ...]) -> Any:
    """obj[path[0]][path[1]]...; None where a key is absent or a value on the way is not a dict."""
    for key in path:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def patch_for(desired: dict[str, Any], live: dict[str, Any] | None = None) -> dict[str, Any]:
    """A merge patch that makes an existing child equal to `desired` in what the operator manages
    (see the module docstring); without `live`, no CLOSED_MAPS key is deleted."""
    patch = {
        "metadata": {key: desired["metadata"][key] for key in ("labels", "annotations", "ownerReferences")},
        **copy.deepcopy(owned_body(desired)),
    }
    pod = patch.get("spec", {}).get("template", {}).get("spec")
    if pod is not None:
        for key in OPTIONAL_POD_FIELDS:
            pod.setdefault(key, None)
    for kind, path in CLOSED_MAPS if live is not None else ():
        wanted, have = dig(patch, path), dig(live, path)
        if kind == desired["kind"] and isinstance(wanted, dict) and isinstance(have, dict):
            wanted.update({key: None for key in have if key not in wanted})
    return patch


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
