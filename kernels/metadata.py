"""The per-step attention metadata shared by the engine and the kernels.

One `AttentionMetadata` is built by the engine for each model step and passed
unchanged to every layer. It describes a packed (varlen) batch:

- sequence i contributes `query_lens_cpu[i]` new tokens, packed contiguously
  at `query_start_loc[i]:query_start_loc[i + 1]` of the step's token axis;
- those tokens sit at absolute positions `[seq_lens[i] - q_len_i, seq_lens[i])`
  (`seq_lens` counts the context INCLUDING this step's tokens);
- the first `num_decode_seqs` sequences are decodes (q_len 1), the rest are
  prefill chunks (possibly after a cached prefix);
- `block_tables[i, j]` is the physical block holding positions
  `[j * block_size, (j + 1) * block_size)` of sequence i; entries past the
  sequence's last block are padding and are never read;
- `slot_mapping[t]` is where token t's K/V is written
  (`block * block_size + offset`), or -1 for a padding token that is skipped.

Invariants checked at construction (cheap, host-side only, no device sync):
shapes and dtypes of the tensors agree with the host lists, every q_len is in
`[1, seq_len]`, decodes come first, and the `max_*` fields bound the lists.
The instance compares by identity (`eq=False`): tensors have no useful `==`,
and kernels may cache per-step derived tensors keyed by the instance.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # int64 [num_tokens]: cache slot of each new token, -1 = skip
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks_per_seq]: physical block ids, 0-padded
    seq_lens: torch.Tensor  # int32 [num_seqs]: context length including this step's tokens
    query_start_loc: torch.Tensor  # int32 [num_seqs + 1]: cumulative new-token counts
    max_seq_len: int  # >= max(seq_lens_cpu)
    max_query_len: int  # >= max(query_lens_cpu)
    num_decode_seqs: int  # the first num_decode_seqs sequences have q_len 1
    seq_lens_cpu: list[int]  # host copy of seq_lens
    query_lens_cpu: list[int]  # host copy of the per-sequence new-token counts

    def __post_init__(self) -> None:
        num_seqs = len(self.seq_lens_cpu)
        _check_tensor("slot_mapping", self.slot_mapping, torch.int64, 1)
        _check_tensor("block_tables", self.block_tables, torch.int32, 2)
        _check_tensor("seq_lens", self.seq_lens, torch.int32, 1)
        _check_tensor("query_start_loc", self.query_start_loc, torch.int32, 1)
        if len(self.query_lens_cpu) != num_seqs:
            raise ValueError(f"query_lens_cpu has {len(self.query_lens_cpu)} entries, seq_lens_cpu has {num_seqs}")
        if self.seq_lens.shape[0] != num_seqs:
            raise ValueError(f"seq_lens has {self.seq_lens.shape[0]} entries, seq_lens_cpu has {num_seqs}")
        if self.block_tables.shape[0] != num_seqs:
            raise ValueError(f"block_tables has {self.block_tables.shape[0]} rows, expected {num_seqs}")
        if self.query_start_loc.shape[0] != num_seqs + 1:
            raise ValueError(
                f"query_start_loc has {self.query_start_loc.shape[0]} entries, expected num_seqs + 1 = {num_seqs + 1}"
            )
        num_tokens = sum(self.query_lens_cpu)
        if self.slot_mapping.shape[0] != num_tokens:
            raise ValueError(
                f"slot_mapping has {self.slot_mapping.shape[0]} entries, expected sum(query_lens_cpu) = {num_tokens}"
            )
        for i, (seq_len, query_len) in enumerate(zip(self.seq_lens_cpu, self.query_lens_cpu)):
            if not 1 <= query_len <= seq_len:
                raise ValueError(f"query_lens_cpu[{i}] = {query_len} must be in [1, seq_lens_cpu[{i}] = {seq_len}]")
        if not 0 <= self.num_decode_seqs <= num_seqs:
            raise ValueError(f"num_decode_seqs = {self.num_decode_seqs} must be in [0, {num_seqs}]")
        if any(q != 1 for q in self.query_lens_cpu[: self.num_decode_seqs]):
            raise ValueError("query_lens_cpu: the first num_decode_seqs sequences must have q_len 1")
        if num_seqs and self.max_seq_len < max(self.seq_lens_cpu):
            raise ValueError(f"max_seq_len = {self.max_seq_len} < max(seq_lens_cpu) = {max(self.seq_lens_cpu)}")
        if num_seqs and self.max_query_len < max(self.query_lens_cpu):
            raise ValueError(f"max_query_len = {self.max_query_len} < max(query_lens_cpu) = {max(self.query_lens_cpu)}")

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return self.slot_mapping.shape[0]


def _check_tensor(name: str, tensor: object, dtype: torch.dtype, ndim: int) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype != dtype or tensor.dim() != ndim:
        raise ValueError(f"{name} must be a {ndim}-d {dtype} tensor, got {tensor.dim()}-d {tensor.dtype}")


def build_attention_metadata(
    seq_lens: list[int],
    query_lens: list[int],
    block_tables: list[list[int]],
    block_size: int,
    device: torch.device | str = "cpu",
    num_decode_seqs: int | None = None,
) -> AttentionMetadata:
    """Build the metadata of a step from host lists (tests, benchmarks, simple callers).

    Every new token gets a cache slot from its sequence's block table. Without
    `num_decode_seqs`, the leading run of q_len-1 sequences counts as decodes.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if len(block_tables) != len(seq_lens):
        raise ValueError(f"block_tables has {len(block_tables)} rows, seq_lens has {len(seq_lens)}")
    slots: list[int] = []
    for i, (seq_len, query_len, table) in enumerate(zip(seq_lens, query_lens, block_tables)):
        if len(table) * block_size < seq_len:
            raise ValueError(f"block_tables[{i}] has {len(table)} blocks, too few for seq_len {seq_len}")
        for position in range(seq_len - query_len, seq_len):
            slots.append(table[position // block_size] * block_size + position % block_size)
    if num_decode_seqs is None:
        num_decode_seqs = 0
        while num_decode_seqs < len(query_lens) and query_lens[num_decode_seqs] == 1:
            num_decode_seqs += 1
    width = max((len(t) for t in block_tables), default=0)
    padded = [list(t) + [0] * (width - len(t)) for t in block_tables]
    starts = [0]
    for query_len in query_lens:
        starts.append(starts[-1] + query_len)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        block_tables=torch.tensor(padded, dtype=torch.int32, device=device).reshape(len(seq_lens), width),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        max_seq_len=max(seq_lens, default=0),
        max_query_len=max(query_lens, default=0),
        num_decode_seqs=num_decode_seqs,
        seq_lens_cpu=list(seq_lens),
        query_lens_cpu=list(query_lens),
    )
