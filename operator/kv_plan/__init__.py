"""pagedinfer.operator.kv_plan: from what the cluster says to the KV-cache plan in `status.kvCache`.

`node_memory` (pure) reads the GPU memory of the nodes a pod can land on
from their labels; `hub_config` fetches an hf:// model's config.json over
HTTP (timeout, cache; the engine reads a local one with
`pagedinfer.engine.hf_config`); `planning` (pure) chooses the sizing inputs
and calls the shared arithmetic (`pagedinfer.contracts.sizing.plan_kv_cache`,
the one KV sizing rule, shared with `pagedinfer plan` and the engine);
`resolver` is the only I/O around them (ConfigMap, Hub, the node index) and
turns every failure into a SizingFailure with a condition reason.
Invariant: the plan is the one the engine would compute for the same
inputs, so the operator never starts a pod that cannot hold one sequence.
"""
