"""pagedinfer.operator.spec: the InferenceService CRD's model and how a raw spec becomes it (pure).

`crd_model` holds the typed, frozen dataclasses of a validated spec and the
CRD's constants (group, version, the engine defaults derived from
`pagedinfer.contracts.config.engine_config.EngineConfig`); `parser` turns the raw
`spec` mapping into them, collecting every problem (each naming its field
path) into one SpecError; `quantity` is the one reader of Kubernetes
quantities. Invariants: no I/O, no kopf; a spec that parses is one the
builders can turn into valid manifests; `spec.autoscaling` and
`spec.router` are parsed by their own rooms (`autoscaling.spec`,
`routing.spec`) and only gathered here.
"""
