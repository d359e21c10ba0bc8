"""The demand path's names, shared with the operator (which imports them from here). Standard library only.

The router writes `DEMAND_ANNOTATION: <RFC 3339 UTC time>` on its own
InferenceService while requests wait with no engine to wake; the operator
scales 0 -> 1 when the annotation changes. The operator sets the two
environment variables on the router's pod; unset, the router signals nothing.
"""

DEMAND_ANNOTATION = "pagedinfer.io/demand-at"
INFERENCESERVICE_NAME_ENV = "PAGEDINFER_INFERENCESERVICE_NAME"
INFERENCESERVICE_NAMESPACE_ENV = "PAGEDINFER_INFERENCESERVICE_NAMESPACE"
DEMAND_MIN_INTERVAL_SECONDS = 5.0  # at most one PATCH per this many seconds while requests are queued
