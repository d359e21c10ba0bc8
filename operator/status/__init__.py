"""pagedinfer.operator.status: an InferenceService's conditions and phase, and how they are written.

`conditions` (pure) defines the five conditions, their reasons and the
phase; `writer` writes them as merge patches to `/status` guarded by
resourceVersion. Invariants: conditions always come in the same order;
lastTransitionTime changes only when a condition flips; a write never
loses another writer's fields (reconcile, rollout report, autoscaler) and
one that would change only timestamps is not sent.
"""
