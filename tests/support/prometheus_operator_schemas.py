"""Minimal JSON schemas for prometheus-operator's monitoring.coreos.com/v1 kinds.

kubernetes-validate ships only Kubernetes' own kinds, so ServiceMonitor,
PodMonitor and PrometheusRule are checked structurally against these
instead. They are written from prometheus-operator's API reference
(PodMonitorSpec, ServiceMonitorSpec, PrometheusRuleSpec, RuleGroup, Rule,
NamespaceSelector, Duration) and cover the fields this chart renders, strictly
(unknown fields are rejected, as `kubernetes-validate --strict` does), plus
the handful of common optional ones. They are a subset, not the real CRDs:
a field the chart starts using must be added here first.
"""

from __future__ import annotations

from typing import Any

# prometheus-operator's Duration type.
DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
}
DNS_SUBDOMAIN = {
    "type": "string",
    "maxLength": 253,
    "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
}
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}

METADATA = {
    "type": "object",
    "required": ["name", "namespace"],
    "properties": {"name": DNS_SUBDOMAIN, "namespace": DNS_SUBDOMAIN, "labels": STRING_MAP, "annotations": STRING_MAP},
    "additionalProperties": False,
}
LABEL_SELECTOR = {
    "type": "object",
    "properties": {
        "matchLabels": STRING_MAP,
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["key", "operator"],
                "additionalProperties": False,
                "properties": {
                    "key": {"type": "string"},
                    "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
    "additionalProperties": False,
}
NAMESPACE_SELECTOR = {
    "type": "object",
    "properties": {"any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}},
    "additionalProperties": False,
}
ENDPOINT_PROPERTIES = {
    "port": {"type": "string", "minLength": 1},
    "path": {"type": "string", "pattern": "^/"},
    "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
    "interval": DURATION,
    "scrapeTimeout": DURATION,
    "honorLabels": {"type": "boolean"},
}


def _resource(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": METADATA,
            "spec": spec,
        },
        "additionalProperties": False,
    }


def _monitor_spec(endpoints_key: str, labels_key: str, required: list[str]) -> dict[str, Any]:
    """PodMonitorSpec (podMetricsEndpoints, podTargetLabels) or ServiceMonitorSpec (endpoints, targetLabels)."""
    return {
        "type": "object",
        "required": required,
        "properties": {
            "selector": LABEL_SELECTOR,
            "namespaceSelector": NAMESPACE_SELECTOR,
            "jobLabel": {"type": "string"},
            labels_key: {"type": "array", "items": {"type": "string"}},
            endpoints_key: {
                "type": "array",
                "minItems": 1,
                "items": {"type": "object", "properties": ENDPOINT_PROPERTIES, "additionalProperties": False},
            },
        },
        "additionalProperties": False,
    }


SCHEMAS: dict[str, dict[str, Any]] = {
    "PodMonitor": _resource("PodMonitor", _monitor_spec("podMetricsEndpoints", "podTargetLabels", ["selector"])),
    "ServiceMonitor": _resource(
        "ServiceMonitor", _monitor_spec("endpoints", "targetLabels", ["selector", "endpoints"])
    ),
    "PrometheusRule": _resource(
        "PrometheusRule",
        {
            "type": "object",
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": DURATION,
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["expr"],
                                    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                    "properties": {
                                        "alert": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"},
                                        "record": {"type": "string"},
                                        "expr": {"type": ["string", "integer"]},
                                        "for": DURATION,
                                        "keep_firing_for": DURATION,
                                        "labels": STRING_MAP,
                                        "annotations": STRING_MAP,
                                    },
                                    "additionalProperties": False,
                                },
                            },
                        },
                        "additionalProperties": False,
                    },
                }
            },
            "additionalProperties": False,
        },
    ),
}
