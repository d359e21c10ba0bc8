"""The decisions LLMEngine makes once, when it is built: each a named step, most of them pure.

In the order the engine takes them (`LLMEngine.__init__`):

1. `resolve_model_paths`: --model and --tokenizer (a directory, or a Hub id
   read from the local cache) become directories; the config holds those.
2. `load_tokenizer`: a tokenizer that cannot be loaded is a ValueError naming it.
3. `resolve_max_model_len` (the length policy): max_model_len, else the
   model's max_position_embeddings, else 2048; never above the model's
   positions; without chunked prefill one step's token budget must hold it.
4. `choose_num_gpu_blocks` (sizing): the runner's plan (profiled on a GPU,
   estimated within cpu_memory_budget_bytes on a CPU) bounds an override,
   which is lowered with a warning when it does not fit; the pool must hold
   one max_model_len sequence, else InsufficientMemoryError.
5. `num_swap_blocks`: the swap space holds swapped-out sequences only, so
   recompute preemption gets none; `num_tier_blocks`: the prefix cache's host
   tier (kv_offloading_size). One host pool holds both (engine/kv_offload/).
   `check_host_pools_fit`: on a CPU the KV pool is host memory too, not yet
   touched when it is allocated, so the host pool must fit beside it (the
   config checked the host pool alone). `kv_pools` takes steps 4 and 5 together.
6. `eos_token_ids`: the generation config's EOS ids, else the tokenizer's.

Steps 3 to 6 take plain values and return plain values: tests call them
directly, without a model.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, NamedTuple

from pagedinfer.contracts.config.engine_config import EngineConfig
from pagedinfer.contracts.config.host_memory import HostMemoryBound
from pagedinfer.contracts.sizing import InsufficientMemoryError, SizingResult
from pagedinfer.engine.model_source import resolve_model_dir

logger = logging.getLogger(__name__)

# max_model_len when neither the config nor the model states one.
FALLBACK_MAX_MODEL_LEN = 2048


def resolve_model_paths(config: EngineConfig) -> EngineConfig:
    """`config` with model and tokenizer as local directories (the tokenizer defaults to the model's)."""
    model_dir = resolve_model_dir(str(config.model), config.revision)
    tokenizer_dir = (
        resolve_model_dir(str(config.tokenizer), config.revision, "tokenizer") if config.tokenizer else model_dir
    )
    return dataclasses.replace(config, model=model_dir, tokenizer=tokenizer_dir)


def load_tokenizer(path: str) -> Any:
    """The Hugging Face tokenizer at `path`; a missing or corrupt one is a ValueError, never a traceback."""
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(path)
    except Exception as exc:
        raise ValueError(f"tokenizer: cannot load from {path!r}: {type(exc).__name__}: {exc}") from None


def resolve_max_model_len(config: EngineConfig, model_max_positions: int | None) -> int:
    """The longest prompt + completion the engine accepts (the length policy above)."""
    max_model_len = config.max_model_len or model_max_positions or FALLBACK_MAX_MODEL_LEN
    if model_max_positions and max_model_len > model_max_positions:
        raise ValueError(
            f"max_model_len: {max_model_len} exceeds the model's max_position_embeddings ({model_max_positions})"
        )
    if not config.enable_chunked_prefill and config.max_num_batched_tokens < max_model_len:
        raise ValueError(
            f"max_num_batched_tokens: without chunked prefill it must be >= max_model_len ({max_model_len}),"
            f" got {config.max_num_batched_tokens}; enable chunked prefill or lower max_model_len"
        )
    return max_model_len


def choose_num_gpu_blocks(config: EngineConfig, planned_blocks: int, max_model_len: int, device_type: str) -> int:
    """KV blocks of the device pool: the override if it fits in the plan's `planned_blocks`, else the plan's."""
    num_blocks = planned_blocks
    if config.num_gpu_blocks_override is not None:
        if config.num_gpu_blocks_override > planned_blocks:
            logger.warning(
                "num_gpu_blocks_override=%d does not fit (%s); using %d blocks",
                config.num_gpu_blocks_override,
                "after profiling"
                if device_type == "cuda"
                else f"within cpu_memory_budget_bytes={config.cpu_memory_budget_bytes}",
                planned_blocks,
            )
        else:
            num_blocks = config.num_gpu_blocks_override
    needed = -(-max_model_len // config.block_size)
    if num_blocks < needed:
        raise InsufficientMemoryError(
            f"No room for the KV cache: one max_model_len={max_model_len} sequence needs {needed} blocks of"
            f" {config.block_size} tokens but the pool has {num_blocks}. Lower max_model_len to at most"
            f" {num_blocks * config.block_size} or give the pool more blocks."
        )
    return num_blocks


def num_swap_blocks(config: EngineConfig, bytes_per_block: int) -> int:
    """Blocks of the host swap pool: swap_space GiB of them in swap mode, none for recompute."""
    if config.preemption_mode != "swap":
        return 0
    return int(config.swap_space * 2**30) // bytes_per_block


def num_tier_blocks(config: EngineConfig, bytes_per_block: int) -> int:
    """Blocks the prefix cache's host tier adds to the host pool: kv_offloading_size GiB of them."""
    return int(config.kv_offloading_size * 2**30) // bytes_per_block


def check_host_pools_fit(
    config: EngineConfig, device_type: str, kv_pool_bytes: int, swap_pool_bytes: int, bound: HostMemoryBound | None
) -> None:
    """On a CPU, every rank's KV pool and host pool (swap space and tier) must fit in the host memory still available (`bound`,
    read after the weights loaded and before either pool is allocated), else a ValueError naming both.

    Both pools are allocated untouched and filled as blocks are written, so without this an engine whose swap
    pool fit alone would start, then be OOM-killed under load (a pod's limit: its KV budget plus 1 GiB).
    On a GPU the KV pool is device memory: the config's swap check is the whole story.
    """
    if device_type != "cpu" or not swap_pool_bytes or bound is None:
        return
    ranks = config.tensor_parallel_size
    if (kv_pool_bytes + swap_pool_bytes) * ranks > bound.available_bytes:
        per_rank = f", x {ranks} tensor-parallel ranks" if ranks > 1 else ""
        if config.kv_offloading_size:
            raise ValueError(
                f"kv_offloading_size (--kv-offloading-size): {config.kv_offloading_size:g} GiB of host tier (with"
                f" the swap space, {swap_pool_bytes / 2**30:.2f} GiB of host pool) beside this CPU engine's"
                f" {kv_pool_bytes / 2**30:.2f} GiB KV pool{per_rank} does not fit in the"
                f" {bound.available_bytes / 2**30:.2f} GiB this host has available ({bound.source}); lower"
                " --kv-offloading-size or --cpu-memory-budget"
            )
        raise ValueError(
            f"swap_space (--swap-space): {config.swap_space:g} GiB of host swap pool beside this CPU engine's"
            f" {kv_pool_bytes / 2**30:.2f} GiB KV pool{per_rank} does not fit in the"
            f" {bound.available_bytes / 2**30:.2f} GiB this host has available ({bound.source}); lower"
            " --swap-space or --cpu-memory-budget, or use preemption_mode recompute (on a CPU, swapping copies"
            " host memory to host memory)"
        )


class KVPools(NamedTuple):
    """The engine's KV pools in blocks (`kv_pools`)."""

    num_gpu_blocks: int  # the device pool
    num_cpu_blocks: int  # the host pool: the swap space plus the prefix cache's tier (engine/kv_offload/)
    num_tier_blocks: int  # of num_cpu_blocks, the tier's


def kv_pools(
    config: EngineConfig, planned: SizingResult, max_model_len: int, device_type: str, bound: HostMemoryBound | None
) -> KVPools:
    """Steps 4 and 5 together: the device pool from the runner's plan, one host pool for the swap space and the
    tier, and the host pools checked against the host memory still available (`bound`)."""
    bytes_per_block = planned.bytes_per_block
    num_gpu = choose_num_gpu_blocks(config, planned.num_gpu_blocks, max_model_len, device_type)
    num_tier = num_tier_blocks(config, bytes_per_block)
    num_cpu = num_swap_blocks(config, bytes_per_block) + num_tier
    check_host_pools_fit(config, device_type, num_gpu * bytes_per_block, num_cpu * bytes_per_block, bound)
    logger.info(
        "KV cache: %d blocks x %d tokens (%d bytes each), %d host blocks (%d of them the tier's)",
        num_gpu,
        config.block_size,
        bytes_per_block,
        num_cpu,
        num_tier,
    )
    return KVPools(num_gpu, num_cpu, num_tier)


def eos_token_ids(generation_eos: int | list[int] | tuple[int, ...] | None, tokenizer_eos: int | None) -> set[int]:
    """The ids that end a completion: the generation config's (one or several), else the tokenizer's."""
    eos = generation_eos if generation_eos is not None else tokenizer_eos
    if eos is None:
        return set()
    return set(eos) if isinstance(eos, (list, tuple)) else {eos}
