"""Decode steps run per batch-size bucket from static buffers: a captured CUDA graph, or its eager replay.

`DecodeGraphs.run` takes a pure-decode step (one new token per sequence) of
n <= max bucket sequences: it writes the step into `StaticInputs` at the
smallest bucket b >= n (rows n..b padded), runs the bucket, and returns the
logits of the rows the step asked for, as the caller's own tensor.

Running a bucket:
- captured (CUDA): `capture` ran, at start-up after the KV pool was
  allocated, a warm-up of the forward then a capture of it per bucket,
  largest first, in one shared memory pool (nano-vllm's and vLLM's
  scheme); a step replays the graph. The graph was captured with every
  row's host length at max_model_len, so what the kernels choose from host
  lengths (the decode split-K count) serves every context the bucket meets;
  the device lengths come from the static buffer at each replay.
- replayed without capture (a CPU, or CUDA before capture): the same
  forward on the same static buffers, eagerly. With the Triton attention
  (which reads lengths from the device tensors only) the replay passes the
  very metadata a capture holds, host lengths at max_model_len, so a CPU
  test under TRITON_INTERPRET=1 runs what the captured graph runs; the CPU
  kernels read the host lengths, so they get the step's real ones.

No host sync inside `run` on CUDA: the inputs go up with non-blocking copies
from pageable host arrays (staged at once), the replay and the copy of the
logits out are launches. The one sync of a step is the sampler's bringing
the tokens back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from pagedinfer.contracts.cuda_graph_buckets import bucket_for
from pagedinfer.engine.batch.persistent_batch import StepArrays
from pagedinfer.engine.cuda_graphs.static_inputs import PAD_SEQ_LEN, StaticInputs
from pagedinfer.kernels import dispatch
from pagedinfer.kernels.metadata import AttentionMetadata

logger = logging.getLogger(__name__)

# forward(input_ids [1, n], positions [1, n], metadata, logits_index [k]) -> logits [k, vocab]
Forward = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor], torch.Tensor]
WARM_UP_RUNS = 2  # eager runs per bucket before its capture (Triton compiles, cuBLAS picks its kernels)


class DecodeGraphs:
    """The buckets of one runner: their static buffers, and their graphs once captured."""

    def __init__(
        self, sizes: tuple[int, ...], forward: Forward, device: torch.device, max_model_len: int, block_size: int
    ) -> None:
        if not sizes:
            raise ValueError("decode graphs: no bucket sizes (max_cudagraph_capture_size 0 means no graphs)")
        self.sizes = sizes
        self.forward = forward
        self.device = device
        self.max_model_len = max_model_len
        self.static = StaticInputs(device, sizes[-1], -(-max_model_len // block_size))
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.captured_bytes: int | None = None  # device memory the capture took (pool + graphs), once captured
        self.planned_bytes = 0  # what the KV sizing left for the graphs (sizing.estimate_cuda_graph_bytes)
        self.capture_seconds: float | None = None
        self.num_runs: dict[int, int] = {b: 0 for b in sizes}  # steps run per bucket (tests, the bench)
        # the attention reads lengths from the device (Triton): every run passes the capture's metadata
        self.device_lengths = dispatch.backend_for(device) == "triton"

    @property
    def captured(self) -> bool:
        return bool(self.graphs)

    def bucket(self, num_tokens: int, num_seqs: int) -> int | None:
        """The bucket a step runs at, or None for the eager path (not pure decode, or too many sequences)."""
        if num_tokens != num_seqs:
            return None
        return bucket_for(num_seqs, self.sizes)

    def run(
        self,
        bucket: int,
        token_ids: list[int],
        arrays: StepArrays,
        logits_rows: list[int],
        fill: Callable[[torch.Tensor], None] | None = None,
    ) -> torch.Tensor:
        """Logits [len(logits_rows), vocab] of a pure-decode step at `bucket` (see the module docstring); `fill`
        (async scheduling) writes the placeholder tokens' ids into the static input ids on the device."""
        n = len(token_ids)
        self.static.fill(bucket, token_ids, arrays)
        if fill is not None:
            fill(self.static.tensors["input_ids"])
        if bucket in self.graphs:
            self.graphs[bucket].replay()
        elif self.device_lengths:
            self._run_body(bucket, self.capture_metadata(bucket))
        else:
            lens = arrays.seq_lens.tolist() + [PAD_SEQ_LEN] * (bucket - n)
            self._run_body(bucket, self.static.metadata(bucket, lens))
        self.num_runs[bucket] += 1
        logits = self.static.logits
        if list(logits_rows) == list(range(n)):
            return logits[:n].clone()  # every row, in order: a decode step's (its own tensor: the buffer is reused)
        return logits[torch.tensor(logits_rows, dtype=torch.long).to(self.device, non_blocking=True)]

    def capture_metadata(self, bucket: int) -> AttentionMetadata:
        """The metadata a bucket's graph is captured with: the static tensors, host lengths at max_model_len."""
        return self.static.metadata(bucket, [self.max_model_len] * bucket)

    def _run_body(self, bucket: int, meta: AttentionMetadata) -> None:
        input_ids, positions, logits_index = self.static.views(bucket)
        out = self.forward(input_ids, positions, meta, logits_index)
        if self.static.logits is None:
            self.static.logits = torch.empty(self.static.max_bucket, out.shape[-1], dtype=out.dtype, device=self.device)
        self.static.logits[:bucket].copy_(out)

    def capture(self) -> None:
        """Capture one CUDA graph per bucket, largest first, in one memory pool; measure what it took."""
        if self.device.type != "cuda":
            raise RuntimeError(f"decode graphs: capture needs a CUDA device, not {self.device}")
        began = time.monotonic()
        torch.cuda.synchronize(self.device)
        index_bytes = self.static.nbytes  # allocated already (the logits buffer not yet)
        free_before = torch.cuda.mem_get_info(self.device)[0]
        pool = None
        for bucket in reversed(self.sizes):
            # every row padding (slot -1: nothing written), host lengths at max_model_len (see the docstring)
            self.static.fill(bucket, [0], _padding_row())
            meta = self.capture_metadata(bucket)
            for _ in range(WARM_UP_RUNS):
                self._run_body(bucket, meta)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, pool=pool):
                    self._run_body(bucket, meta)
            except RuntimeError as exc:
                raise RuntimeError(
                    f"max_cudagraph_capture_size (--max-cudagraph-capture-size): capturing the decode step of"
                    f" {bucket} sequences failed ({exc}); the model's forward does something a CUDA graph cannot"
                    " hold (a host sync, a CPU tensor): serve it with the option at 0"
                ) from exc
            pool = graph.pool() if pool is None else pool
            self.graphs[bucket] = graph
        torch.cuda.synchronize(self.device)
        # the pool, the graphs and the logits buffer (allocated at the first warm-up), and the index buffers
        self.captured_bytes = max(0, free_before - torch.cuda.mem_get_info(self.device)[0]) + index_bytes
        self.capture_seconds = time.monotonic() - began
        logger.info(
            "decode graphs: %d buckets (1..%d) captured in %.1f s, %.1f MiB",
            len(self.sizes),
            self.sizes[-1],
            self.capture_seconds,
            self.captured_bytes / 2**20,
        )


def _padding_row() -> StepArrays:
    """One padding row as a step's arrays (position 0, slot -1, length PAD_SEQ_LEN, block 0)."""
    import numpy as np

    from pagedinfer.engine.cuda_graphs.static_inputs import PAD_SLOT

    return StepArrays(
        slot_mapping=np.array([PAD_SLOT], dtype=np.int64),
        block_tables=np.zeros((1, 1), np.int32),
        seq_lens=np.array([PAD_SEQ_LEN], dtype=np.int64),
        query_start_loc=np.arange(2, dtype=np.int64),
        positions=np.zeros(1, dtype=np.int64),
        num_decode_seqs=1,
    )
