"""The runner's view of the batch, kept across steps and changed by deltas.

The scheduler does not resend a sequence's whole block table every step:
the KV cache manager records which tables changed since the last step
(`deltas.BlockTableUpdate`, plus the ids of freed tables), the scheduler
output carries only those, and every rank's runner applies them to its own
`persistent_batch.PersistentBatch` (the tensor-parallel step message carries
the same deltas). The attention metadata of a step is then gathered from the
persistent rows with array operations, with no per-token Python loop, and
its token ids and logits rows are written into buffers kept across steps
(`step_inputs.IndexBuffer`), not built by torch.tensor each step.
(The model: vLLM v1's SchedulerOutput with NewRequestData/CachedRequestData
and its persistent InputBatch.)
"""
