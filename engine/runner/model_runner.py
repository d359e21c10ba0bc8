"""ModelRunner: one rank's loaded model (`loading.py`), its KV pools, and its steps.

All sequences of a step run packed in ONE forward: input_ids [1, num_tokens]
with explicit position_ids (the default arange is wrong when packed), no
padding, use_cache=False (the paged cache is ours), and logits_to_keep set to
the last token of each sequence that samples. Attention is the paged
implementation registered in `engine/attention.py`; after each forward we check it
really ran in every layer (transformers silently ignores unknown kwargs if
the implementation were not set).

Block tables live in the runner's `PersistentBatch` (engine/batch/): each
step applies the scheduler's table deltas to it, then gathers the step's
attention metadata and positions from it with array operations. A step's host
inputs are `inputs.py`'s; the pool is sized by `profiling.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from pagedinfer.contracts.config.engine_config import EngineConfig
from pagedinfer.engine.attention import StepContext
from pagedinfer.engine.batch.persistent_batch import PersistentBatch
from pagedinfer.engine.batch.step_inputs import IndexBuffer
from pagedinfer.engine.cpu.fused_layers import causal_lm_logits
from pagedinfer.engine.cuda_graphs.decode_graphs import DecodeGraphs
from pagedinfer.engine.cuda_graphs.setup import make_decode_graphs
from pagedinfer.engine.distributed.group import TPGroup
from pagedinfer.engine.distributed.step_message import ALLOCATE, STEP, Message, StepInputs
from pagedinfer.engine.engine_setup import resolve_max_model_len
from pagedinfer.engine.kv_offload.copies import TierCopier
from pagedinfer.engine.kv_offload.tier import LOAD, STORE
from pagedinfer.engine.runner.inputs import PromptLogits, prepare_step
from pagedinfer.engine.runner.loading import LoadedModel
from pagedinfer.engine.scheduler import SchedulerOutput
from pagedinfer.kernels import dispatch
from pagedinfer.kernels.metadata import AttentionMetadata

if TYPE_CHECKING:
    from pagedinfer.engine.distributed.workers import WorkerSet


class ModelRunner(LoadedModel):
    """One rank's model and KV pool. With tensor parallelism (`group`), rank 0's runner
    also drives the other ranks (`workers`): it sends each step before running it."""

    def __init__(self, config: EngineConfig, group: TPGroup | None = None) -> None:
        super().__init__(config, group)
        self.workers: WorkerSet | None = None  # rank 0 of a replica: the other ranks (set by the launcher)
        self.block_size = config.block_size
        self.kv_cache: torch.Tensor | None = None
        self.cpu_cache: torch.Tensor | None = None  # the host pool: swap space and the prefix cache's tier
        self.tier_copier = TierCopier(self.device)
        self.batch = PersistentBatch(self.block_size, config.max_num_seqs)
        # a step's token ids and logits rows, written into buffers kept across steps (engine/batch/step_inputs.py)
        self._input_ids = IndexBuffer(self.device, config.max_num_batched_tokens)
        self._logits_rows = IndexBuffer(self.device, config.max_num_seqs)
        # pure-decode steps by batch-size bucket (engine/cuda_graphs/), built with the KV pool
        self.decode_graphs: DecodeGraphs | None = None

    # ----- the KV pools ------------------------------------------------------------------
    def allocate_kv_cache(self, num_gpu_blocks: int, num_cpu_blocks: int, decode_graphs: bool = True) -> None:
        """This rank's pools (rank 0 of a replica first tells the other ranks to allocate theirs), then its
        decode graphs over the new pool (unless `decode_graphs` is False: the profiling pass's pool)."""
        if self.workers is not None:
            with self.workers.guard("allocating the KV cache"):
                self.workers.send(Message(ALLOCATE, num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks))
        self.decode_graphs = None  # captured over the old pool's addresses
        self.kv_cache, self.key_caches, self.value_caches, self.cpu_cache = None, [], [], None
        self.batch = PersistentBatch(self.block_size, self.config.max_num_seqs)  # a new pool: no table survives
        shape = (2, self.num_layers, num_gpu_blocks, self.block_size, self.num_kv_heads, self.head_dim)
        # On CPU, empty (pages are touched only when written): slots never written
        # are masked by the attention, so their contents never matter.
        alloc = torch.zeros if self.device.type == "cuda" else torch.empty
        self.kv_cache = alloc(shape, dtype=self.dtype, device=self.device)
        self.key_caches = [self.kv_cache[0, i] for i in range(self.num_layers)]
        self.value_caches = [self.kv_cache[1, i] for i in range(self.num_layers)]
        if num_cpu_blocks:
            cpu_shape = (2, self.num_layers, num_cpu_blocks, self.block_size, self.num_kv_heads, self.head_dim)
            self.cpu_cache = torch.empty(
                cpu_shape, dtype=self.dtype, device="cpu", pin_memory=self.device.type == "cuda"
            )
        if self.compiled is not None and num_gpu_blocks:
            self.compiled.warm_up(self._one_token_step)
        if decode_graphs and num_gpu_blocks:
            self.decode_graphs = make_decode_graphs(
                self.config,
                self.device,
                self._forward,
                resolve_max_model_len(self.config, self.max_position_embeddings),
                self.model_shape(),
            )

    def _one_token_step(self) -> tuple[torch.Tensor, torch.Tensor, StepContext]:
        """A step of one token writing block 0 (free at start-up), for the compiled forward's warm-up."""
        from pagedinfer.kernels.metadata import build_attention_metadata

        meta = build_attention_metadata([1], [1], [[0]], self.block_size, self.device)
        ctx = StepContext(metadata=meta, key_caches=self.key_caches, value_caches=self.value_caches)
        return torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long), ctx

    def release_kv_cache(self) -> None:
        """Drop this rank's device pool (the profiling pass's): its memory is freed once no step holds it."""
        self.kv_cache, self.key_caches, self.value_caches = None, [], []

    # ----- one step ----------------------------------------------------------------------
    def _forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, logits_index: torch.Tensor
    ) -> torch.Tensor:
        if self.triton_decoder is not None:  # every layer runs by construction (no attention-registry check)
            with torch.inference_mode():
                return self.triton_decoder(
                    input_ids[0], positions[0], meta, self.key_caches, self.value_caches, logits_index
                )
        ctx = StepContext(metadata=meta, key_caches=self.key_caches, value_caches=self.value_caches)
        with torch.inference_mode():
            if self.compiled is not None:
                logits = self.compiled(input_ids, positions, ctx, logits_index)
            elif self.fused_lm:
                logits = causal_lm_logits(self.model, input_ids[0], positions[0], logits_index, ctx)
            else:
                logits = self.model(
                    input_ids=input_ids,
                    position_ids=positions,
                    use_cache=False,
                    logits_to_keep=logits_index,
                    pagedinfer_step=ctx,
                ).logits[0]
        if len(ctx.layers_seen) != self.num_layers:
            raise RuntimeError(
                f"paged attention ran in {len(ctx.layers_seen)} of {self.num_layers} layers; the model does"
                " not route attention through transformers' AttentionInterface"
            )
        return logits

    def execute(
        self,
        sched: SchedulerOutput,
        sample_seq_ids: set[int],
        prompt_logprob_seq_ids: frozenset[int] | set[int] = frozenset(),
    ) -> tuple[torch.Tensor, list[int], dict[int, PromptLogits]]:
        """Run the block copies and the forward of one step.

        Returns float32 logits [num_sampling, vocab] and the seq_ids of their
        rows, for the sequences in sample_seq_ids (those whose last token is
        computed now); and, for the sequences in prompt_logprob_seq_ids, the
        logits of the prompt positions computed this step that predict a
        prompt token (position p predicts token p + 1), from the same forward.
        """
        prepared = prepare_step(sched, sample_seq_ids, prompt_logprob_seq_ids)
        return prepared.split(self.run_step(prepared.inputs))

    def run_step(self, step: StepInputs, fill: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
        """Table deltas and block moves, then the forward; logits of step.logits_rows (whole rows on every rank).

        Rank 0 of a tensor-parallel replica first broadcasts `step`, so that
        every rank runs the same moves and forward on its own heads. `fill`
        (async scheduling, one rank only) writes the ids of the step's placeholder tokens into its input ids
        on the device, just before the forward.
        """
        if self.workers is None:
            return self._run_step(step, fill)
        if fill is not None:
            raise ValueError("async scheduling runs without tensor parallelism")
        with self.workers.guard("running a step"):
            self.workers.send(Message(STEP, step))
            return self._run_step(step)

    def _run_step(self, step: StepInputs, fill: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
        self.batch.apply(step.table_deltas)
        # the host tier's stores read device blocks this step may overwrite: first (engine/kv_offload/)
        self.tier_copier.copy(STORE, self.kv_cache, self.cpu_cache, step.tier_stores)
        if step.blocks_to_swap_out:
            dispatch.swap_blocks(self.kv_cache, self.cpu_cache, _pairs(step.blocks_to_swap_out), block_dim=2)
        if step.blocks_to_swap_in:
            dispatch.swap_blocks(self.cpu_cache, self.kv_cache, _pairs(step.blocks_to_swap_in), block_dim=2)
        self.tier_copier.copy(LOAD, self.cpu_cache, self.kv_cache, step.tier_loads)
        if step.blocks_to_copy:
            dispatch.copy_blocks(self.key_caches, self.value_caches, _pairs(step.blocks_to_copy, self.device))
        graphs = self.decode_graphs
        bucket = None if graphs is None else graphs.bucket(len(step.token_ids), len(step.seq_ids))
        if bucket is not None:  # a pure-decode step its buckets hold
            arrays = self.batch.gather(step.seq_ids, step.seq_lens, step.query_lens)
            return graphs.run(bucket, step.token_ids, arrays, step.logits_rows, fill)
        meta, positions = self.batch.prepare(step.seq_ids, step.seq_lens, step.query_lens, self.device)
        input_ids = self._input_ids.put(step.token_ids)
        if fill is not None:
            fill(input_ids)
        return self._forward(input_ids[None], positions[None], meta, self._logits_rows.put(step.logits_rows))


def _pairs(pairs: tuple[tuple[int, int], ...], device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.tensor(pairs, dtype=torch.long, device=device).view(-1, 2)
