"""Model runner: loads a transformers model, sizes and owns the KV cache, runs steps.

All sequences of a step run packed in ONE forward: input_ids [1, num_tokens]
with explicit position_ids (the default arange is wrong when packed), no
padding, use_cache=False (the paged cache is ours), and logits_to_keep set to
the last token of each sequence that samples. Attention is the paged
implementation registered in `attention.py`; after each forward we check it
really ran in every layer (transformers silently ignores unknown kwargs if
the implementation were not set).

Block tables live in the runner's `PersistentBatch` (engine/batch/): each
step applies the scheduler's table deltas to it, then gathers the step's
attention metadata and positions from it with array operations.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from pagedinfer.contracts import sizing
from pagedinfer.contracts.config.engine_config import EngineConfig
from pagedinfer.contracts.model_shape import ModelShape
from pagedinfer.contracts.model_shape import resolve_dtype as resolve_dtype_name
from pagedinfer.engine.attention import StepContext, register
from pagedinfer.engine.batch.deltas import BlockTableUpdate, TableDeltas
from pagedinfer.engine.batch.persistent_batch import PersistentBatch
from pagedinfer.engine.batch.step_inputs import IndexBuffer
from pagedinfer.engine.cpu.compiled_forward import CompiledForward
from pagedinfer.engine.cpu.fused_layers import LayerFusionReport, causal_lm_logits, fuse_layers, fuses_causal_lm
from pagedinfer.engine.cpu.fused_projections import FusionReport, fuse_projections
from pagedinfer.engine.cpu.linear import PackingReport, pack_linear_weights
from pagedinfer.engine.cuda_graphs.decode_graphs import DecodeGraphs
from pagedinfer.engine.cuda_graphs.setup import make_decode_graphs
from pagedinfer.engine.distributed import sharding
from pagedinfer.engine.distributed.group import TPGroup
from pagedinfer.engine.distributed.step_message import ALLOCATE, STEP, Message, StepInputs
from pagedinfer.engine.engine_setup import resolve_max_model_len
from pagedinfer.engine.gpu_forward.select import choose_decoder
from pagedinfer.engine.hf_config import load_hf_config
from pagedinfer.engine.kv_offload.copies import TierCopier
from pagedinfer.engine.kv_offload.tier import LOAD, STORE
from pagedinfer.engine.scheduler import SchedulerOutput
from pagedinfer.kernels import dispatch
from pagedinfer.kernels.metadata import AttentionMetadata

if TYPE_CHECKING:
    from pagedinfer.engine.distributed.workers import WorkerSet

logger = logging.getLogger(__name__)

_UNSUPPORTED_ROPE = ("dynamic", "longrope")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' requested but no CUDA device is available")
    return torch.device(name)


def tp_device(config: EngineConfig, rank: int) -> torch.device:
    """The device of tensor-parallel rank `rank`: cuda:<rank> on CUDA, the CPU otherwise."""
    device = resolve_device(config.device)
    if device.type != "cuda" or config.tensor_parallel_size == 1:
        return device
    if torch.cuda.device_count() < config.tensor_parallel_size:
        raise ValueError(
            f"tensor_parallel_size: {config.tensor_parallel_size} GPUs per replica, but"
            f" {torch.cuda.device_count()} are visible"
        )
    return torch.device("cuda", rank)


def resolve_dtype(name: str, model_config: dict, device: torch.device) -> torch.dtype:
    """`model_shape.resolve_dtype`'s answer (the one `plan` and the operator size with) as a torch dtype."""
    return getattr(torch, resolve_dtype_name(name, model_config, device.type))


def _rope_types(rope: object) -> list[str]:
    """rope_type values of a rope_scaling/rope_parameters entry, flat or nested per layer type."""
    if not isinstance(rope, dict):
        return []
    kind = rope.get("rope_type") or rope.get("type")
    if kind is not None:
        return [str(kind)]
    return [t for value in rope.values() for t in _rope_types(value)]


def check_rope(model_config: dict) -> None:
    """Reject RoPE variants whose factors depend on the longest position in a batch."""
    cfg = model_config.get("text_config") or model_config
    for key in ("rope_scaling", "rope_parameters"):
        for kind in _rope_types(cfg.get(key)):
            if kind not in _UNSUPPORTED_ROPE:
                continue
            raise ValueError(
                f"model: rope type {kind!r} picks its scaling from the longest sequence in a batch, which"
                " packed batches break; use a model with default/linear/llama3/yarn RoPE"
            )


class ModelRunner:
    """One rank's model and KV pool. With tensor parallelism (`group`), rank 0's runner
    also drives the other ranks (`workers`): it sends each step before running it."""

    def __init__(self, config: EngineConfig, group: TPGroup | None = None) -> None:
        import transformers

        self.config = config
        self.group = group
        self.workers: WorkerSet | None = None  # rank 0 of a replica: the other ranks (set by the launcher)
        self.device = tp_device(config, group.rank if group else 0)
        self.hf_config_dict = load_hf_config(config.model)
        check_rope(self.hf_config_dict)
        self.dtype = resolve_dtype(config.dtype, self.hf_config_dict, self.device)
        attn_name = register()
        try:
            self.model = transformers.AutoModelForCausalLM.from_pretrained(
                config.model, dtype=self.dtype, attn_implementation=attn_name
            )
        except (OSError, ValueError, TypeError, KeyError, RuntimeError) as exc:
            raise ValueError(
                f"model: cannot load {config.model!r} with transformers: {type(exc).__name__}: {exc}"
            ) from None
        except Exception as exc:  # e.g. safetensors' or huggingface_hub's own error types
            raise ValueError(f"model: cannot load {config.model!r}: {type(exc).__name__}: {exc}") from None
        if group is not None:
            sharding.shard_model(self.model, group)
        self.model.to(self.device).eval()
        # of the layers the model's tensor-parallel plan splits (by its names: before fusing renames them)
        self.sharded_weight_bytes = sharding.planned_parameter_bytes(self.model)
        # our Triton decoder (--forward; engine/gpu_forward/: on CUDA by default for the families it runs), its
        # q/k/v and gate/up fused into one GEMM each
        choice = choose_decoder(
            self.model, config.forward, self.device, config.tensor_parallel_size, self._rope_positions()
        )
        self.triton_decoder = choice.decoder
        cpu_layers = self.device.type == "cpu" and self.triton_decoder is None
        # on CPU, q/k/v and gate/up fused into one GEMM each, then every linear weight packed once for
        # oneDNN (each replacing the originals: weight_bytes counts every weight once)
        self.fusion: FusionReport | None = fuse_projections(self.model) if cpu_layers else choice.fusion
        self.linear_packing: PackingReport | None = pack_linear_weights(self.model) if cpu_layers else None
        # on CPU, norms, RoPE, SiLU-and-multiply and the residual adds as native ops (the decoder's forward replaced)
        self.layer_fusion: LayerFusionReport | None = (
            fuse_layers(self.model, self._rope_positions()) if cpu_layers else None
        )
        # eager steps of a fused causal LM skip transformers' outer forward (same ops: `causal_lm_logits`)
        self.fused_lm = self.layer_fusion is not None and self.layer_fusion.fused and fuses_causal_lm(self.model)
        if self.model.config._attn_implementation != attn_name:
            raise RuntimeError(f"transformers did not set attention implementation {attn_name!r}")
        text_cfg = self.model.config.get_text_config()
        self.num_layers = int(text_cfg.num_hidden_layers)
        tp = config.tensor_parallel_size
        # this rank's KV heads (all of them without tensor parallelism; all of them too where the plan gathers the
        # keys, as Phi-3's does): its pool holds only these
        self.num_kv_heads = sharding.kv_heads_per_rank(
            self.model, int(getattr(text_cfg, "num_key_value_heads", None) or text_cfg.num_attention_heads), tp
        )
        self.head_dim = int(getattr(text_cfg, "head_dim", None) or text_cfg.hidden_size // text_cfg.num_attention_heads)
        self.hidden_size = int(text_cfg.hidden_size)
        self.vocab_size = int(text_cfg.vocab_size)
        self.max_position_embeddings = getattr(text_cfg, "max_position_embeddings", None)
        self.block_size = config.block_size
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters()) + sum(
            b.numel() * b.element_size() for b in self.model.buffers()
        )
        self.kv_cache: torch.Tensor | None = None
        self.cpu_cache: torch.Tensor | None = None  # the host pool: swap space and the prefix cache's tier
        self.tier_copier = TierCopier(self.device)
        self.batch = PersistentBatch(self.block_size, config.max_num_seqs)
        # a step's token ids and logits rows, written into buffers kept across steps (engine/batch/step_inputs.py)
        self._input_ids = IndexBuffer(self.device, config.max_num_batched_tokens)
        self._logits_rows = IndexBuffer(self.device, config.max_num_seqs)
        # pure-decode steps by batch-size bucket (engine/cuda_graphs/), built with the KV pool
        self.decode_graphs: DecodeGraphs | None = None
        self.compiled: CompiledForward | None = None
        if config.compile:
            if self.device.type != "cpu":
                raise ValueError(f"compile (--compile): the compiled forward runs on a CPU, not {self.device}")
            self.compiled = CompiledForward(self.model, config.max_num_batched_tokens)

    def _rope_positions(self) -> int:
        """How many positions the fused layers' RoPE table covers: the model's and max_model_len's larger."""
        text_cfg = self.model.config.get_text_config()
        return max(int(getattr(text_cfg, "max_position_embeddings", 0) or 0), self.config.max_model_len or 0, 1)

    # ----- sizing --------------------------------------------------------------------
    def model_shape(self) -> ModelShape:
        return ModelShape(
            num_layers=self.num_layers,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            num_parameters=max(1, sum(p.numel() for p in self.model.parameters())),
            dtype=str(self.dtype).removeprefix("torch."),
            hidden_size=self.hidden_size,
            max_position_embeddings=self.max_position_embeddings,
            vocab_size=self.vocab_size,
        )

    def plan_kv_cache(self, max_model_len: int) -> sizing.SizingResult:
        """Profile (on CUDA) or estimate (on CPU) activations, then size the pool with `sizing`."""
        shape = self.model_shape()
        if self.device.type == "cuda":
            total_bytes = torch.cuda.mem_get_info(self.device)[1]
            reserve = self._profile_cuda_activation_bytes(max_model_len)
        else:
            total_bytes = self.config.cpu_memory_budget_bytes
            reserve = sizing.estimate_activation_reserve_bytes(shape, self.config.max_num_batched_tokens, "cpu")
        return sizing.plan_kv_cache(
            sizing.SizingInputs(
                shape=shape,
                gpu_memory_bytes=total_bytes,
                gpu_memory_utilization=self.config.gpu_memory_utilization,
                block_size=self.block_size,
                max_num_batched_tokens=self.config.max_num_batched_tokens,
                max_model_len=max_model_len,
                activation_reserve_bytes=reserve,
                weight_bytes_per_gpu=self.weight_bytes,
                max_num_seqs=self.config.max_num_seqs,
                max_cudagraph_capture_size=self.config.max_cudagraph_capture_size,
            )
        )

    def _profile_cuda_activation_bytes(self, max_model_len: int) -> int:
        """Peak memory of a forward at max_num_batched_tokens, plus non-torch usage (CUDA context)."""
        num_tokens = min(self.config.max_num_batched_tokens, self.config.max_num_seqs * max_model_len)
        seq_len = min(max_model_len, num_tokens)
        lens = [seq_len] * (num_tokens // seq_len) + ([num_tokens % seq_len] if num_tokens % seq_len else [])
        num_blocks = sum(-(-n // self.block_size) for n in lens)
        self.allocate_kv_cache(num_blocks, 0, decode_graphs=False)
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        next_block = 0
        tables = []
        for i, n in enumerate(lens):
            nb = -(-n // self.block_size)
            tables.append(BlockTableUpdate(i, 0, tuple(range(next_block, next_block + nb))))
            next_block += nb
        # as many logits rows as a real step may keep (one per running sequence), not one per profiled sequence
        keep = list(range(num_tokens - min(self.config.max_num_seqs, num_tokens), num_tokens))
        self.run_step(
            StepInputs([0] * num_tokens, list(range(len(lens))), lens, lens, keep, TableDeltas(tuple(tables)))
        ).float()
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - before
        self.kv_cache, self.key_caches, self.value_caches = None, [], []
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        non_torch = max(0, (total - free) - torch.cuda.memory_reserved(self.device))
        return int(peak + non_torch)

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
        prepared = self.prepare(sched, sample_seq_ids, prompt_logprob_seq_ids)
        return prepared.split(self.run_step(prepared.inputs))

    def prepare(
        self,
        sched: SchedulerOutput,
        sample_seq_ids: set[int],
        prompt_logprob_seq_ids: frozenset[int] | set[int] = frozenset(),
    ) -> PreparedStep:
        """`execute`'s host half: the step's inputs, read from the sequences now (async scheduling runs the
        forward later, on its own thread: engine/async_step/)."""
        # decodes (one new token) first, as the attention metadata requires
        items = sorted(sched.scheduled, key=lambda it: it.num_new_tokens != 1)
        ids: list[int] = []
        seq_ids: list[int] = []
        seq_lens: list[int] = []
        query_lens: list[int] = []
        keep: list[int] = []
        keep_ids: list[int] = []
        # (seq_id, first target position, flat index of its first row, rows)
        prompt_keep: list[tuple[int, int, int, int]] = []
        for it in items:
            start = it.seq.num_computed_tokens
            end = start + it.num_new_tokens
            if it.seq.seq_id in prompt_logprob_seq_ids and start < it.seq.num_prompt_tokens - 1:
                last = min(end, it.seq.num_prompt_tokens - 1)  # the last prompt position predicts no prompt token
                prompt_keep.append((it.seq.seq_id, start + 1, len(ids), last - start))
            ids.extend(it.seq.token_ids[start:end])
            seq_ids.append(it.seq.seq_id)
            seq_lens.append(end)
            query_lens.append(it.num_new_tokens)
            if it.seq.seq_id in sample_seq_ids:
                keep.append(len(ids) - 1)
                keep_ids.append(it.seq.seq_id)
        for _, _, flat, count in prompt_keep:
            keep.extend(range(flat, flat + count))
        if not keep:
            keep, keep_ids = [len(ids) - 1], []  # logits_to_keep must select something
        return PreparedStep(
            StepInputs(
                ids,
                seq_ids,
                seq_lens,
                query_lens,
                keep,
                sched.table_deltas,
                sched.blocks_to_copy,
                sched.blocks_to_swap_out,
                sched.blocks_to_swap_in,
                sched.tier_copies.stores,
                sched.tier_copies.loads,
            ),
            keep_ids,
            tuple(prompt_keep),
        )

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


@dataclass(frozen=True)
class PreparedStep:
    """A step's inputs for `run_step`, and how its logits rows split (`ModelRunner.prepare`)."""

    inputs: StepInputs
    sampled_seq_ids: list[int]  # the seq_id of each of the first len(sampled_seq_ids) logits rows
    prompt_keep: tuple[tuple[int, int, int, int], ...]  # (seq_id, first target, flat index, rows): prompt logprobs

    def split(self, logits: torch.Tensor) -> tuple[torch.Tensor, list[int], dict[int, PromptLogits]]:
        """`execute`'s result from the forward's logits."""
        num_sampled = len(self.sampled_seq_ids)
        prompt_logits: dict[int, PromptLogits] = {}
        row = num_sampled
        for seq_id, first_target, _, count in self.prompt_keep:
            prompt_logits[seq_id] = PromptLogits(first_target, logits[row : row + count])
            row += count
        return logits[:num_sampled].float(), self.sampled_seq_ids, prompt_logits


@dataclass(frozen=True)
class PromptLogits:
    """A sequence's prompt-position logits from one step: rows i predicts prompt token first_target + i."""

    first_target: int  # the prompt position whose token row 0 predicts
    logits: torch.Tensor  # [num_targets, vocab], the model's dtype
