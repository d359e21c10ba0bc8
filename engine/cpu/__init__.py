"""CPU-only model transformations: q/k/v and gate/up fused (`fused_projections`), linear layers packed once
for oneDNN (`linear`), the compiled forward (`compiled_forward`, `attention_op`)."""
