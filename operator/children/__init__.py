"""pagedinfer.operator.children: the engine's Deployment and Service, built, applied and watched for drift.

`builders` (pure) turns a validated spec and its KV plan into manifests, with
the labels of `labels`;
`apply` creates or patches them idempotently (adoption, conflicts, quota);
`drift` says which fields the operator owns of a child (its spec hash, the
merge patch that restores them) and whether they changed (`fingerprint`), so
only others' edits cost a reconcile.
Invariants: every manifest passes strict Kubernetes validation; the
operator patches only the fields it owns; a child is the operator's when it
carries its managed-by label and its owner is an InferenceService. The
router's children are built by `pagedinfer.operator.routing`.
"""
