"""The decode graphs' input and output buffers: allocated once for the largest bucket, written every step.

A captured graph reads its inputs from fixed addresses, so a step copies its
inputs into these buffers instead of building new tensors. Every bucket b
uses the first b rows of each buffer (the graphs are captured largest first
in one memory pool and share them).

Padding (rows n..b of a batch of n at bucket b), harmless by construction:
- slot_mapping -1: the KV write skips the row, so it writes no cache byte;
- seq_lens 1 and block table entry 0 = block 0: the row attends to one key
  (slot 0 of block 0, whatever it holds) and its output is sliced away; rows
  never mix in a decoder (norms, GEMMs, attention are per row);
- input id 0 and position 0: any valid embedding row and RoPE angle.

Invariants:
- query_start_loc is arange(max_bucket + 1) and logits_index arange(max_bucket), written once (one token per
  row, every row's logits kept);
- the block tables are max_model_len / block_size wide; entries of a row past its sequence's last block are
  stale, never read (a kernel reads a row's first ceil(seq_len / block_size) entries);
- on CUDA the host side is ordinary (pageable) memory copied with non_blocking=True: the copy stages the
  source at once, so the next step may rewrite it, and no copy waits for the device;
- on a CPU the device tensors ARE the host arrays (torch.from_numpy): nothing is copied;
- `logits` has max_bucket rows in the forward's own dtype (a bfloat16 model's logits are not rounded again).
"""

from __future__ import annotations

import numpy as np
import torch

from pagedinfer.engine.batch.persistent_batch import StepArrays
from pagedinfer.kernels.metadata import AttentionMetadata

PAD_SLOT = -1  # write_kv skips the row
PAD_SEQ_LEN = 1  # attend to one key: position 0 of block 0


class StaticInputs:
    """Host arrays and their device tensors for a decode batch of up to `max_bucket` sequences."""

    def __init__(self, device: torch.device, max_bucket: int, max_blocks_per_seq: int) -> None:
        if max_bucket < 1 or max_blocks_per_seq < 1:
            raise ValueError(
                f"static inputs: max_bucket ({max_bucket}) and max_blocks_per_seq ({max_blocks_per_seq}) must be >= 1"
            )
        self.device = device
        self.max_bucket = max_bucket
        self.max_blocks_per_seq = max_blocks_per_seq
        b = max_bucket
        self.host = {
            "input_ids": np.zeros(b, dtype=np.int64),
            "positions": np.zeros(b, dtype=np.int64),
            "slot_mapping": np.full(b, PAD_SLOT, dtype=np.int64),
            "block_tables": np.zeros((b, max_blocks_per_seq), dtype=np.int32),
            "seq_lens": np.full(b, PAD_SEQ_LEN, dtype=np.int32),
            "query_start_loc": np.arange(b + 1, dtype=np.int32),
            "logits_index": np.arange(b, dtype=np.int64),
        }
        on_cpu = device.type == "cpu"
        self.tensors = {
            name: torch.from_numpy(a) if on_cpu else torch.from_numpy(a).to(device) for name, a in self.host.items()
        }
        # the forward's logits of the bucket's rows are copied here (inside the graph on CUDA); allocated at the
        # first run (a warm-up, before any capture) in the dtype and width the forward returns
        self.logits: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values()) + (0 if self.logits is None else self.logits.nbytes)

    def fill(self, bucket: int, token_ids: list[int], arrays: StepArrays) -> None:
        """Write a decode batch of n = len(token_ids) <= bucket sequences, rows n..bucket as padding."""
        n = len(token_ids)
        if not 1 <= n <= bucket <= self.max_bucket:
            raise ValueError(f"static inputs: a batch of {n} does not fit bucket {bucket} (at most {self.max_bucket})")
        width = arrays.block_tables.shape[1]
        if width > self.max_blocks_per_seq:
            raise ValueError(
                f"static inputs: a block table of {width} blocks exceeds max_model_len's {self.max_blocks_per_seq}"
            )
        h = self.host
        h["input_ids"][:n] = token_ids
        h["positions"][:n] = arrays.positions
        h["slot_mapping"][:n] = arrays.slot_mapping
        h["seq_lens"][:n] = arrays.seq_lens
        h["block_tables"][:n, :width] = arrays.block_tables
        h["input_ids"][n:bucket] = 0
        h["positions"][n:bucket] = 0
        h["slot_mapping"][n:bucket] = PAD_SLOT
        h["seq_lens"][n:bucket] = PAD_SEQ_LEN
        h["block_tables"][n:bucket, 0] = 0
        if self.device.type != "cpu":
            self._copy_to_device(bucket, max(width, 1))

    def _copy_to_device(self, bucket: int, width: int) -> None:
        for name in ("input_ids", "positions", "slot_mapping", "seq_lens"):
            self.tensors[name][:bucket].copy_(torch.from_numpy(self.host[name][:bucket]), non_blocking=True)
        # the columns this step's tables use, and column 0 of the padding rows (written with them)
        tables = torch.from_numpy(self.host["block_tables"][:bucket, :width])
        self.tensors["block_tables"][:bucket, :width].copy_(tables, non_blocking=True)

    def views(self, bucket: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """input_ids [1, bucket], positions [1, bucket], logits_index [bucket]: the forward's arguments."""
        t = self.tensors
        return t["input_ids"][None, :bucket], t["positions"][None, :bucket], t["logits_index"][:bucket]

    def metadata(self, bucket: int, seq_lens_cpu: list[int]) -> AttentionMetadata:
        """The bucket's AttentionMetadata over the static tensors, with these host lengths (`seq_lens_cpu`: the
        real lengths then PAD_SEQ_LEN per padding row when replayed eagerly; the longest length the graph must
        serve, for every row, when captured)."""
        if len(seq_lens_cpu) != bucket:
            raise ValueError(f"static inputs: {len(seq_lens_cpu)} host lengths for bucket {bucket}")
        t = self.tensors
        return AttentionMetadata(
            slot_mapping=t["slot_mapping"][:bucket],
            block_tables=t["block_tables"][:bucket],
            seq_lens=t["seq_lens"][:bucket],
            query_start_loc=t["query_start_loc"][: bucket + 1],
            max_seq_len=max(seq_lens_cpu),
            max_query_len=1,
            num_decode_seqs=bucket,
            seq_lens_cpu=list(seq_lens_cpu),
            query_lens_cpu=[1] * bucket,
        )
