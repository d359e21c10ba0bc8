"""Conditions and phase of an InferenceService (pure).

Five conditions, always in this order, each with status True/False/Unknown,
a CamelCase reason, a message for humans, lastTransitionTime (changes only
when the status flips) and observedGeneration (the owner's generation the
condition was set for):

- Valid:     SpecValid | InvalidSpec
- Sized:     SizedFromNodeLabels | SizedFromSpec | SizedFromMemory | Override | SizedByEngine
             | NoMatchingNodes | InsufficientGPUMemory | InsufficientMemory (a CPU engine)
             | ModelConfigUnavailable | ModelConfigInvalid
             | InvalidSpec (False while Valid is False: nothing can be sized; the message repeats Valid's)
- Applied:   ChildrenApplied | ChildConflict | ApplyFailed | QuotaExceeded | NotDeployed
- Available: MinimumReplicasAvailable | NoReplicasAvailable | ScaledToZero | NotDeployed
- Ready:     AllReplicasReady | RolloutInProgress | ReplicasNotReady | NotDeployed

No condition is left Unknown once a reconcile has run: Unknown (reason
Reconciling) means no reconcile has decided yet, so `kubectl wait
--for=condition=X` ends (True or False) on every path, an invalid spec too.

Applied is True when the Deployment and Service match the spec of its
observedGeneration; an invalid or unsized update leaves it as it was (the
children still match the generation it names). Available's and Ready's
observedGeneration is the generation the Deployment was built from (its
`serving.pagedinfer.dev/owner-generation` annotation), which lags the
InferenceService's while an update is not applied yet or cannot be: Ready
True with the current generation means that generation's pods are all ready.

Phase (one word for `kubectl get`): Invalid, Pending (waiting for nodes,
model config or room in a ResourceQuota), Failed (does not fit, the model
config is invalid, or the children cannot be applied), Deploying, Ready.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

CONDITION_TYPES = ("Valid", "Sized", "Applied", "Available", "Ready")

VALID = "Valid"
SIZED = "Sized"
APPLIED = "Applied"
AVAILABLE = "Available"
READY = "Ready"

REASON_SPEC_VALID = "SpecValid"
REASON_INVALID_SPEC = "InvalidSpec"
REASON_NO_MATCHING_NODES = "NoMatchingNodes"
REASON_INSUFFICIENT_GPU_MEMORY = "InsufficientGPUMemory"
REASON_INSUFFICIENT_MEMORY = "InsufficientMemory"
REASON_MODEL_CONFIG_UNAVAILABLE = "ModelConfigUnavailable"
REASON_MODEL_CONFIG_INVALID = "ModelConfigInvalid"
REASON_NOT_DEPLOYED = "NotDeployed"
REASON_CHILDREN_APPLIED = "ChildrenApplied"
REASON_CHILD_CONFLICT = "ChildConflict"
REASON_APPLY_FAILED = "ApplyFailed"
REASON_QUOTA_EXCEEDED = "QuotaExceeded"
SIZED_REASONS = {
    "node-labels": "SizedFromNodeLabels",
    "spec": "SizedFromSpec",
    "memory": "SizedFromMemory",
    "override": "Override",
    "engine": "SizedByEngine",
}

# Appended to a Valid, Sized or Applied message when an update is not applied but a Deployment exists.
KEEPS_SERVING = " The Deployment keeps serving the last applied spec, unchanged; status.kvCache is its plan."

PHASE_INVALID = "Invalid"
PHASE_PENDING = "Pending"
PHASE_FAILED = "Failed"
PHASE_DEPLOYING = "Deploying"
PHASE_READY = "Ready"


@dataclass(frozen=True)
class Condition:
    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str


def true(type_: str, reason: str, message: str) -> Condition:
    return Condition(type_, "True", reason, message)


def false(type_: str, reason: str, message: str) -> Condition:
    return Condition(type_, "False", reason, message)


def not_sized(valid: Condition) -> Condition:
    """Sized=False for a spec whose Valid condition is False: sizing never ran, and says why."""
    return false(SIZED, REASON_INVALID_SPEC, f"Not sized: condition Valid is False ({valid.reason}): {valid.message}")


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_conditions(
    existing: Iterable[Mapping[str, Any]] | None, updates: Iterable[Condition], generation: int | None, now: str
) -> list[dict[str, Any]]:
    """All four conditions: updates replace their type, the rest are kept (or Unknown).

    lastTransitionTime is kept when a condition's status does not change.
    """
    old = {c.get("type"): dict(c) for c in existing or () if isinstance(c, Mapping)}
    new = {c.type: c for c in updates}
    out = []
    for type_ in CONDITION_TYPES:
        previous = old.get(type_)
        if type_ in new:
            c = new[type_]
            changed = previous is None or previous.get("status") != c.status
            out.append(
                {
                    "type": type_,
                    "status": c.status,
                    "reason": c.reason,
                    "message": c.message,
                    "lastTransitionTime": now if changed else previous.get("lastTransitionTime", now),
                    **({"observedGeneration": generation} if generation is not None else {}),
                }
            )
        elif previous is not None:
            out.append(previous)
        else:
            out.append(
                {
                    "type": type_,
                    "status": "Unknown",
                    "reason": "Reconciling",
                    "message": "The operator has not decided yet.",
                    "lastTransitionTime": now,
                }
            )
    return out


@dataclass(frozen=True)
class Rollout:
    """The parts of a Deployment's state that status reports."""

    replicas: int  # pods that exist
    ready_replicas: int
    updated_replicas: int
    desired_replicas: int
    observed: bool  # the Deployment controller has seen the latest Deployment spec

    @classmethod
    def from_deployment(cls, deployment: Mapping[str, Any]) -> Rollout:
        spec = deployment.get("spec") or {}
        st = deployment.get("status") or {}
        generation = (deployment.get("metadata") or {}).get("generation")
        observed = generation is None or st.get("observedGeneration", 0) >= generation
        return cls(
            replicas=int(st.get("replicas") or 0),
            ready_replicas=int(st.get("readyReplicas") or 0),
            updated_replicas=int(st.get("updatedReplicas") or 0),
            desired_replicas=int(spec.get("replicas", 1)),
            observed=observed,
        )

    @property
    def complete(self) -> bool:
        return (
            self.observed
            and self.updated_replicas >= self.desired_replicas
            and self.ready_replicas >= self.desired_replicas
            and self.replicas <= self.desired_replicas
        )


def rollout_conditions(rollout: Rollout | None) -> tuple[Condition, Condition]:
    """Available and Ready from the Deployment (None: not created)."""
    if rollout is None:
        return (
            false(AVAILABLE, REASON_NOT_DEPLOYED, "No Deployment exists for this service."),
            false(READY, REASON_NOT_DEPLOYED, "No Deployment exists for this service."),
        )
    counts = f"{rollout.ready_replicas}/{rollout.desired_replicas} replicas ready"
    if rollout.desired_replicas == 0:
        available = true(AVAILABLE, "ScaledToZero", "Scaled to zero replicas.")
    elif rollout.ready_replicas > 0:
        available = true(AVAILABLE, "MinimumReplicasAvailable", f"{counts}.")
    else:
        available = false(AVAILABLE, "NoReplicasAvailable", f"{counts}; engines may still be loading the model.")
    if rollout.complete:
        ready = true(READY, "AllReplicasReady", f"{counts}.")
    elif not rollout.observed or rollout.updated_replicas < rollout.desired_replicas:
        ready = false(
            READY,
            "RolloutInProgress",
            f"{rollout.updated_replicas}/{rollout.desired_replicas} replicas updated, {counts}.",
        )
    else:
        ready = false(READY, "ReplicasNotReady", f"{counts}.")
    return available, ready


def phase_for(conditions: Iterable[Mapping[str, Any]]) -> str:
    by_type = {c["type"]: c for c in conditions}
    valid, sized, ready = by_type.get(VALID, {}), by_type.get(SIZED, {}), by_type.get(READY, {})
    if valid.get("status") == "False":
        return PHASE_INVALID
    if sized.get("status") == "False":
        failed = sized.get("reason") in (
            REASON_INSUFFICIENT_GPU_MEMORY,
            REASON_INSUFFICIENT_MEMORY,
            REASON_MODEL_CONFIG_INVALID,
        )
        return PHASE_FAILED if failed else PHASE_PENDING
    if sized.get("status") != "True":
        return PHASE_PENDING
    if by_type.get(APPLIED, {}).get("reason") == REASON_QUOTA_EXCEEDED:
        return PHASE_PENDING
    if by_type.get(APPLIED, {}).get("reason") in (REASON_CHILD_CONFLICT, REASON_APPLY_FAILED):
        return PHASE_FAILED
    return PHASE_READY if ready.get("status") == "True" else PHASE_DEPLOYING


def rollout_status(rollout: Rollout | None) -> dict[str, Any]:
    """status.replicas / readyReplicas as the scale subresource and printer columns read them."""
    if rollout is None:
        return {"replicas": 0, "readyReplicas": 0}
    return {"replicas": rollout.replicas, "readyReplicas": rollout.ready_replicas}
