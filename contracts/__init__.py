"""pagedinfer.contracts: what the engine, the router and the operator agree on, defined once.

The three deployables stand side by side on this package and never import one another: the engine's
options (`config`), the sizing arithmetic and model shape (`sizing`, `model_shape`,
`cuda_graph_buckets`), metric names (`metric_names`), the KV-event schema and block hash (`kv_events`),
the HTTP pieces both servers share (`http`), what the router and the operator agree on (`routing`), the
InferenceService's names (`inference_service`) and the embedded model (`embedded_model`). Torch-,
transformers- and triton-free, and it imports none of the three (the import-linter contracts in
pyproject.toml; docs/design.md "Layering").
"""
