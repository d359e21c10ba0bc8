"""CPU-only model transformations: linear layers packed once for oneDNN (`linear`), the compiled forward."""
