"""pagedinfer.contracts: what the engine, the router and the operator agree on, defined once.

The three deployables stand side by side on this package and never import one another: the engine's
options (`config`), the sizing arithmetic and model shape (`sizing`, `model_shape`,
`cuda_graph_buckets`), metric names (`metric_names`), the KV-event schema (`kv_events`) and the HTTP
pieces both servers share (`http`). Torch-, transformers- and triton-free, and it imports none of the
three (the import-linter contracts in pyproject.toml; docs/design.md "Layering").
"""
