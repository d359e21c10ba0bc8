"""Pure API-server rules the emulator applies: patches, selectors, server-set fields.

- merge patch (RFC 7386): objects merge recursively, null deletes, anything
  else replaces (lists included). Strategic merge patches are merge patches
  except for the lists in `STRATEGIC_MERGE_KEYS` (a pod's `status.conditions`,
  merged by `type`, as the router sets its readiness gate's condition); the
  operator never relies on other list merge keys.
- a pod's readiness with `spec.readinessGates` (`gated_pod_readiness`, the
  kubelet's status sync): Ready is True only while ContainersReady and every
  gate's condition are True.
- JSON patch (RFC 6902): add, remove, replace, move, copy, test. A failed
  `test` or a bad path raises PatchError, which the emulator answers with 422
  as kube-apiserver does.
- label selectors (`a=b`, `a==b`, `a!=b`, `a`, `!a`, `a in (x,y)`,
  `a notin (x,y)`, comma = AND) and field selectors on `metadata.name` and
  `metadata.namespace` (`=`, `==`, `!=`).
- the canonical form the API server stores a pod spec in (`canonical_pod_spec`):
  container resource quantities as `resource.Quantity.String()` writes them
  (0.5 -> 500m, 1024Mi -> 1Gi, 1.5Gi -> 1536Mi, 2000m -> 2; binary suffixes
  stay binary when the value is a whole number of bytes of at least 1024,
  everything else is decimal SI with the largest suffix that keeps the number
  whole), and env items without an empty `value` (EnvVar.value is `omitempty`).
  Exponent forms (`1e3`) are not emulated: the operator never writes them.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

_MISSING = object()


class PatchError(ValueError):
    """A patch that cannot be applied (answered with 422)."""


class SelectorError(ValueError):
    """A selector that cannot be parsed (answered with 400)."""


# The lists a strategic merge patch merges by a key instead of replacing them (the API types' patchMergeKey),
# by field name: only those this project patches so.
STRATEGIC_MERGE_KEYS = {"conditions": "type"}


def merge_patch(target: Any, patch: Any, merge_keys: Mapping[str, str] | None = None) -> Any:
    """RFC 7386; with `merge_keys` (field name -> item key), those lists merge item by item on their key."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif merge_keys and key in merge_keys and isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list_by_key(result[key], value, merge_keys[key], merge_keys)
        else:
            result[key] = merge_patch(result.get(key), value, merge_keys)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A merge patch that merges the lists of `STRATEGIC_MERGE_KEYS` item by item on their key."""
    return merge_patch(target, patch, STRATEGIC_MERGE_KEYS)


def _merge_list_by_key(current: list[Any], patch: list[Any], item_key: str, merge_keys: Mapping[str, str]) -> list[Any]:
    merged = copy.deepcopy(current)
    for item in patch:
        if not isinstance(item, Mapping) or item_key not in item:
            raise PatchError(f"each item of a list merged by {item_key!r} must be an object with {item_key!r}")
        at = next(
            (i for i, c in enumerate(merged) if isinstance(c, Mapping) and c.get(item_key) == item[item_key]), None
        )
        if at is None:
            merged.append(copy.deepcopy(dict(item)))
        else:
            merged[at] = merge_patch(merged[at], item, merge_keys)
    return merged


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer {path!r} must start with '/'")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> tuple[Any, str]:
    node = doc
    for part in parts[:-1]:
        node = _child(node, part)
    return node, parts[-1]


def _child(node: Any, part: str) -> Any:
    if isinstance(node, dict):
        if part not in node:
            raise PatchError(f"path segment {part!r} does not exist")
        return node[part]
    if isinstance(node, list):
        try:
            return node[int(part)]
        except (ValueError, IndexError):
            raise PatchError(f"list index {part!r} is out of range") from None
    raise PatchError(f"cannot descend into a {type(node).__name__} at {part!r}")


def _get(doc: Any, path: str) -> Any:
    node = doc
    for part in _pointer(path):
        node = _child(node, part)
    return node


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent, last = _parent(doc, parts)
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if not 0 <= index <= len(parent):
            raise PatchError(f"list index {last!r} is out of range")
        parent.insert(index, value)
    else:
        raise PatchError(f"cannot add into a {type(parent).__name__}")
    return doc


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        raise PatchError("cannot remove the whole document")
    parent, last = _parent(doc, parts)
    _child(parent, last)
    if isinstance(parent, dict):
        del parent[last]
    else:
        del parent[int(last)]
    return doc


def json_patch(target: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise PatchError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, Mapping) or "op" not in op or "path" not in op:
            raise PatchError(f"malformed operation {op!r}")
        kind, path = op["op"], op["path"]
        if kind == "test":
            if _get(doc, path) != op.get("value"):
                raise PatchError(f"test operation failed at {path}: expected {op.get('value')!r}")
        elif kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)
            doc = _add(_remove(doc, path), path, copy.deepcopy(op.get("value")))
        elif kind in ("move", "copy"):
            value = copy.deepcopy(_get(doc, op.get("from", "")))
            if kind == "move":
                doc = _remove(doc, op["from"])
            doc = _add(doc, path, value)
        else:
            raise PatchError(f"unknown operation {kind!r}")
    return doc


_REQUIREMENT = re.compile(
    r"\s*(!?)\s*([-A-Za-z0-9_./]+)\s*(?:(==|=|!=)\s*([-A-Za-z0-9_.]*)|\s+(in|notin)\s*\(([^)]*)\))?\s*"
)


def _split_selector(selector: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p for p in parts if p.strip()]


def label_selector(selector: str | None) -> Callable[[Mapping[str, str]], bool]:
    """A predicate over labels; SelectorError when the selector is malformed."""
    checks: list[Callable[[Mapping[str, str]], bool]] = []
    for requirement in _split_selector(selector or ""):
        m = _REQUIREMENT.fullmatch(requirement)
        if m is None:
            raise SelectorError(f"unable to parse requirement {requirement!r}")
        negated, key, op, value, set_op, values = m.groups()
        if negated and (op or set_op):
            raise SelectorError(f"unable to parse requirement {requirement!r}")
        if negated:
            checks.append(lambda labels, k=key: k not in labels)
        elif op in ("=", "=="):
            checks.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif op == "!=":
            checks.append(lambda labels, k=key, v=value: labels.get(k) != v)
        elif set_op:
            options = {v.strip() for v in values.split(",") if v.strip()}
            if set_op == "in":
                checks.append(lambda labels, k=key, o=options: labels.get(k) in o)
            else:
                checks.append(lambda labels, k=key, o=options: labels.get(k) not in o)
        else:
            checks.append(lambda labels, k=key: k in labels)
    return lambda labels: all(check(labels) for check in checks)


_FIELDS = {"metadata.name": ("metadata", "name"), "metadata.namespace": ("metadata", "namespace")}


def field_selector(selector: str | None) -> Callable[[Mapping[str, Any]], bool]:
    checks: list[Callable[[Mapping[str, Any]], bool]] = []
    for requirement in _split_selector(selector or ""):
        m = re.fullmatch(r"\s*([A-Za-z.]+)\s*(==|=|!=)\s*(\S*)\s*", requirement)
        if m is None or m.group(1) not in _FIELDS:
            raise SelectorError(
                f"field selector {requirement!r} is not supported (only {', '.join(_FIELDS)} with =, ==, !=)"
            )
        outer, inner = _FIELDS[m.group(1)]
        equal = m.group(2) != "!="
        checks.append(
            lambda obj, o=outer, i=inner, v=m.group(3), eq=equal: (
                ((obj.get(o) or {}).get(i) or "") == v if eq else ((obj.get(o) or {}).get(i) or "") != v
            )
        )
    return lambda obj: all(check(obj) for check in checks)


def spec_changed(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """Whether anything besides metadata and status changed (what bumps metadata.generation)."""
    strip = lambda obj: {k: v for k, v in obj.items() if k not in ("metadata", "status")}  # noqa: E731
    return strip(before) != strip(after)


def selector_from_match_labels(match_labels: Mapping[str, str] | None) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted((match_labels or {}).items()))


_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_DECIMAL = {"m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]


def canonical_quantity(quantity: Any) -> Any:
    """A quantity as the API server stores it; anything it does not parse is returned as it is."""
    m = _QUANTITY.fullmatch(quantity) if isinstance(quantity, str) else None
    if m is None:
        return quantity
    number, suffix = Fraction(m.group(1)), m.group(2) or ""
    if suffix in _BINARY[1:]:
        value = number * 1024 ** _BINARY.index(suffix)
        if value.denominator == 1 and value >= 1024:
            power = max(p for p in range(len(_BINARY)) if value % 1024**p == 0)
            return f"{value // 1024**power}{_BINARY[power]}"
    else:
        value = number * Fraction(10) ** _DECIMAL[suffix]
    milli = math.ceil(value * 1000)  # precision ends at milli; finer values round up
    for suffix, exponent in sorted(_DECIMAL.items(), key=lambda item: -item[1]):
        scaled = Fraction(milli, 1000) / Fraction(10) ** exponent
        if scaled.denominator == 1:
            return f"{scaled.numerator}{suffix}"
    raise AssertionError("unreachable: a whole number of milli units always fits the m suffix")


def canonical_pod_spec(pod: Any) -> None:
    """Bring a pod spec (in place) into the form the API server stores: quantities, empty env values."""
    if not isinstance(pod, dict):
        return
    for container in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]:
        if not isinstance(container, dict):
            continue
        for kind in ("requests", "limits"):
            amounts = (container.get("resources") or {}).get(kind)
            if isinstance(amounts, dict):
                amounts.update({name: canonical_quantity(v) for name, v in amounts.items()})
        for item in container.get("env") or []:
            if isinstance(item, dict) and item.get("value") == "":
                del item["value"]


POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
_PHASE_RANK = {"Pending": 0, "Unknown": 1, "Running": 2}


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def gated_pod_readiness(pod: dict[str, Any]) -> None:
    """Set a pod's Ready condition as the kubelet does for a pod with `spec.readinessGates` (in place).

    Ready is True only while ContainersReady is True and every gate's condition (conditionType) is True;
    False with reason ReadinessGatesNotReady while only the gates hold it. A pod with no gates, or whose
    status says nothing of its containers yet (no ContainersReady), is left as it is."""
    gates = [g.get("conditionType") for g in (pod.get("spec") or {}).get("readinessGates") or []]
    status = pod.get("status") or {}
    conditions = status.get("conditions") or []
    said = {c.get("type"): c.get("status") for c in conditions if isinstance(c, Mapping)}
    if not gates or "ContainersReady" not in said:
        return
    containers_ready = said["ContainersReady"] == "True"
    ready = containers_ready and all(said.get(g) == "True" for g in gates)
    wanted = {"type": "Ready", "status": "True" if ready else "False"}
    if containers_ready and not ready:
        missing = ", ".join(g for g in gates if said.get(g) != "True")
        wanted.update(reason="ReadinessGatesNotReady", message=f"the readiness gates {missing} are not True")
    kept = [c for c in conditions if not (isinstance(c, Mapping) and c.get("type") == "Ready")]
    status["conditions"] = [*kept, wanted]


def _deletion_cost(pod: Mapping[str, Any]) -> int:
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(POD_DELETION_COST, "0")
    try:
        return int(value)
    except ValueError:
        return 0  # the API server refuses such a value; counted as the default


def scale_down_order(pods: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Pods in the order a ReplicaSet deletes them when scaled down (kubernetes controller_utils
    ActivePodsWithRanks): unscheduled before scheduled, Pending < Unknown < Running, not ready before
    ready, then LOWER `controller.kubernetes.io/pod-deletion-cost` first, then newer before older
    (ties: the later name first). Restart counts and ready-since times are not modelled."""

    def key(pod: Mapping[str, Any]) -> tuple:
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        return (
            bool(spec.get("nodeName")),
            _PHASE_RANK.get(status.get("phase"), 1),
            _pod_ready(pod),
            _deletion_cost(pod),
            _negated(meta.get("creationTimestamp") or ""),
            _negated(meta.get("name") or ""),
        )

    return sorted(pods, key=key)


def _negated(text: str) -> tuple[int, ...]:
    """A sort key ordering strings descending."""
    return tuple(-ord(c) for c in text) + (0,)
