"""pagedinfer.operator.autoscaling: `spec.autoscaling`, from engine metrics to `spec.replicas` (docs/autoscaling.md).

`spec` parses and validates `spec.autoscaling` (pure); `scrape` reads the
engines' /metrics (or Prometheus) with timeouts; `readings` turns that text
into per-pod readings with prometheus_client's parser and the names of
`pagedinfer.contracts.metric_names`; `policy` (pure, tested by tables
and properties) decides a ScalingDecision from observations and the
previous state; `daemon` is the kopf daemon that runs the loop and writes
`spec.replicas` and `status.autoscaling`.
Invariants: a decision is a pure function of (spec, state, observations);
an invalid spec is reported (a Warning Event, status) and never acted on;
a metric whose every scrape failed never lets the loop scale
down (HPA's rule).
"""
