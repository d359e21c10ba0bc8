"""Pruning by a structural schema, and field validation, as kube-apiserver does for custom resources.

A CRD's openAPIV3Schema is structural: every object names its fields. On
every create, update and patch (main resource and `/status` alike) the API
server drops what the schema does not name, before anything is stored:

- an object with `properties` keeps those keys only, each pruned by its own
  schema; one also marked `x-kubernetes-preserve-unknown-fields: true` keeps
  every key (the named ones are still pruned inside);
- an object with `additionalProperties` keeps every key, each value pruned by
  that schema;
- an object with neither (and not preserving) keeps nothing;
- a list prunes each item by `items`; scalars are left alone;
- at the root, `apiVersion`, `kind` and `metadata` are the server's own and
  are never pruned here.

What happens to a request that carried unknown fields is its
`fieldValidation` query parameter (`field_validation`): `Ignore` drops them
silently; `Warn` (the API server's default, when the parameter is absent)
drops them and answers with one `Warning: 299 - "unknown field \"spec.x\""`
header each; `Strict` refuses the request, 400 BadRequest, `strict decoding
error: unknown field "spec.x"` listing every one. kubectl sends `Strict` by
default (`--validate=strict`), `Warn` with `--validate=warn` and `Ignore` with
`--validate=false`; client libraries and kopf send nothing, so `Warn`.

Paths are written as the API server writes them: `spec.model.uri`,
`spec.tolerations[0].key`. Duplicate JSON keys (also refused by `Strict`) are
not modelled: a JSON body reaches the emulator as a dict, where the last one won.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

FIELD_VALIDATIONS = ("Ignore", "Warn", "Strict")
DEFAULT_FIELD_VALIDATION = "Warn"
# The CRD of the repository this package is a checkout of (an editable install): crds/ is the one source of truth.
INFERENCESERVICES_CRD = Path(__file__).resolve().parents[1] / "crds" / "inferenceservices.yaml"
_ROOT_FIELDS = ("apiVersion", "kind", "metadata")


class FieldValidationError(ValueError):
    """A `fieldValidation` directive the API server does not know (answered with 400)."""


def field_validation(directive: str | None) -> str:
    """The request's mode: `Warn` when the parameter is absent; FieldValidationError for an unknown one."""
    if directive in (None, ""):
        return DEFAULT_FIELD_VALIDATION
    if directive not in FIELD_VALIDATIONS:
        raise FieldValidationError(
            f'invalid or unsupported fieldValidation directive: "{directive}" (one of {", ".join(FIELD_VALIDATIONS)})'
        )
    return directive


def prune(obj: dict[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Drop (in place) every field of `obj` that the structural `schema` does not name; return their paths."""
    dropped: list[str] = []
    root = {k: v for k, v in obj.items() if k not in _ROOT_FIELDS}
    _prune_value(root, schema, "", dropped)
    for key in [k for k in obj if k not in _ROOT_FIELDS and k not in root]:
        del obj[key]
    return dropped


def _prune_value(value: Any, schema: Mapping[str, Any], path: str, dropped: list[str]) -> None:
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            for index, item in enumerate(value):
                _prune_value(item, items, f"{path}[{index}]", dropped)
        return
    if not isinstance(value, dict):
        return
    properties = schema.get("properties") or {}
    additional = schema.get("additionalProperties")
    preserve = schema.get("x-kubernetes-preserve-unknown-fields") is True
    for key in list(value):
        child = f"{path}.{key}" if path else key
        if key in properties:
            _prune_value(value[key], properties[key], child, dropped)
        elif isinstance(additional, Mapping):
            _prune_value(value[key], additional, f"{path}[{key}]", dropped)
        elif not preserve and additional is not True:
            del value[key]
            dropped.append(child)


def strict_error(kind: str, version: str, dropped: list[str]) -> str:
    """The message of the 400 a `Strict` request with unknown fields gets."""
    fields = ", ".join(f'unknown field "{path}"' for path in dropped)
    return f'{kind} in version "{version}" cannot be handled as a {kind}: strict decoding error: {fields}'


def warning_header(path: str) -> str:
    """One `Warning` header value (RFC 7234 code 299, agent `-`), as the API server sends it."""
    text = f'unknown field "{path}"'.replace("\\", "\\\\").replace('"', '\\"')
    return f'299 - "{text}"'


def crd_schema(path: Path = INFERENCESERVICES_CRD) -> dict[str, Any]:
    """The openAPIV3Schema of a CRD manifest's served storage version."""
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: the CRD the emulator prunes by is missing (pagedinfer.testing reads it "
            f"from a source checkout; pass the schema to KubeEmulator.register otherwise)"
        )
    crd = yaml.safe_load(path.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    return version["schema"]["openAPIV3Schema"]
