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

`fingerprint(obj)` hashes an object without its status and without the
metadata every write changes (resourceVersion, generation, managedFields):
it changes exactly when someone changes the object's spec or metadata, not
when a controller writes its status.
"""

from __future__ import annotations

from typing import Any, Mapping

from pagedinfer.operator.builders import content_hash

VOLATILE_METADATA = ("resourceVersion", "generation", "managedFields")


def drifted_paths(live: Any, wanted: Any, path: str = "") -> list[str]:
    """Dotted paths (`spec.template.spec.containers[0].image`) where `live` differs from `wanted`."""
    if isinstance(wanted, Mapping):
        if not isinstance(live, Mapping):
            return [path]
        drifted = []
        for key, value in wanted.items():
            where = f"{path}.{key}" if path else key
            if value is None:
                if live.get(key) is not None:
                    drifted.append(where)
            elif key not in live:
                drifted.append(where)
            else:
                drifted += drifted_paths(live[key], value, where)
        return drifted
    if isinstance(wanted, list):
        if not isinstance(live, list) or len(live) != len(wanted):
            return [path]
        return [p for i, (have, want) in enumerate(zip(live, wanted)) for p in drifted_paths(have, want, f"{path}[{i}]")]
    return [] if live == wanted else [path]


def fingerprint(obj: Mapping[str, Any]) -> str:
    """A hash of `obj` less its status and volatile metadata."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in VOLATILE_METADATA}
    content = {**{k: v for k, v in obj.items() if k not in ("status", "metadata")}, "metadata": meta}
    return content_hash(content)
