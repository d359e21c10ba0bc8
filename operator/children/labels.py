"""The labels every child carries and the selectors built from them (pure).

An engine pod is selected by `selector_labels` (its Deployment's selector, the
Service's, and `status.selector` for HPA); every child of an InferenceService
carries `common_labels`. The keys of `common_labels` are the operator's
(`OWNED_LABEL_KEYS`: drift compares them); a child's other labels are anyone's.
A child with the managed-by label and its owner's name in OWNER_LABEL but no
controller is an orphan the operator adopts (`apply.adoptable`).
"""

from __future__ import annotations

from collections.abc import Mapping

from pagedinfer.contracts.inference_service import API_GROUP

OWNER_LABEL = f"{API_GROUP}/inferenceservice"
MANAGED_BY = "pagedinfer-operator"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"


def selector_labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "pagedinfer-engine", "app.kubernetes.io/instance": name}


def label_selector(labels: Mapping[str, str]) -> str:
    """A label selector string (`k=v,k2=v2`, sorted) matching exactly these labels."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def selector_string(name: str) -> str:
    """`status.selector` for the scale subresource (what HPA lists pods with)."""
    return label_selector(selector_labels(name))


def common_labels(name: str) -> dict[str, str]:
    return {
        **selector_labels(name),
        "app.kubernetes.io/component": "engine",
        MANAGED_BY_LABEL: MANAGED_BY,
        OWNER_LABEL: name,
    }


# The label keys the operator sets on its children (other keys are anyone's).
OWNED_LABEL_KEYS = frozenset(common_labels("any"))
