"""Engine configuration: one frozen dataclass, validated when built, that defines every engine option.

Its fields are the options of `LLM(**kwargs)`, and through their metadata
(`options.flag_field`) the flags of `pagedinfer serve`, `generate` and `plan`
and the operator's managed flags. Pure: the operator imports it (no torch).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from pagedinfer.contracts.config.host_memory import available_host_memory
from pagedinfer.contracts.config.options import flag_field
from pagedinfer.contracts.model_shape import ENGINE_DTYPES
from pagedinfer.contracts.sizing import VALID_BLOCK_SIZES, parse_bytes
from pagedinfer.contracts.validators import positive_int

PREEMPTION_MODES = ("recompute", "swap")
DTYPES = ("auto", *ENGINE_DTYPES)
DEVICES = ("auto", "cpu", "cuda")
OVERLAP_MODES = ("off", "thread", "process")  # EngineConfig.overlap: where the output side runs
FORWARD_MODES = ("auto", "module", "triton")  # EngineConfig.forward: which decoder forward runs a step


def _check_swap_space_fits(swap_space_gib: float, num_ranks: int) -> None:
    """The host swap pools (swap mode only; one per tensor-parallel rank) must fit in the host memory available."""
    bound = available_host_memory()
    if bound is not None and swap_space_gib * num_ranks * 2**30 > bound.available_bytes:
        per_rank = f" x {num_ranks} tensor-parallel ranks" if num_ranks > 1 else ""
        raise ValueError(
            f"swap_space (--swap-space): {swap_space_gib:g} GiB{per_rank} of host memory for swapped-out KV blocks"
            " does not"
            f" fit in the {bound.available_bytes / 2**30:.2f} GiB this host has available ({bound.source});"
            " lower it, or use preemption_mode recompute, which needs no host pool"
        )


def _check_offload_fits(kv_offloading_size_gib: float, swap_space_gib: float, num_ranks: int) -> None:
    """The host pool (the tier, plus the swap space in swap mode; one per rank) must fit in the host memory available."""
    bound = available_host_memory()
    total_gib = (kv_offloading_size_gib + swap_space_gib) * num_ranks
    if bound is not None and total_gib * 2**30 > bound.available_bytes:
        beside = f" beside --swap-space {swap_space_gib:g} GiB" if swap_space_gib else ""
        per_rank = f" x {num_ranks} tensor-parallel ranks" if num_ranks > 1 else ""
        raise ValueError(
            f"kv_offloading_size (--kv-offloading-size): {kv_offloading_size_gib:g} GiB of host memory for the"
            f" prefix cache's tier{beside}{per_rank} does not fit in the {bound.available_bytes / 2**30:.2f} GiB"
            f" this host has available ({bound.source}); lower it"
        )


def _cpu_memory_budget_bytes(text: str) -> int:
    return parse_bytes(text, name="--cpu-memory-budget")


@dataclass(frozen=True)
class EngineConfig:
    """Everything that shapes one engine: the one definition of each engine option.

    Each field is at once the config value, the `LLM(**kwargs)` keyword and,
    through its metadata (`contracts/config/options.py`), the flag of `pagedinfer
    serve` and `generate` (and of `plan` where it shares one): its name, help,
    type, choices and whether the operator sets it (`managed`: the
    operator's MANAGED_FLAGS and the CRD's CEL rule on extraArgs are derived
    from it). Field names follow vLLM's flags.

    max_model_len None means the model's max_position_embeddings.
    num_gpu_blocks_override None means: size the pool by profiling.
    On CPU the "device memory" is cpu_memory_budget_bytes.
    """

    model: str = flag_field(
        flag="--model",
        cli_default=None,
        managed=True,
        help="Hugging Face model directory (config.json + safetensors + tokenizer)",
    )
    revision: str | None = flag_field(
        None,
        flag="--revision",
        managed=True,
        help="revision of a Hugging Face model id (--model org/name), resolved from the local"
        " cache when HF_HUB_OFFLINE=1",
    )  # None: main
    tokenizer: str | None = flag_field(
        None, flag="--tokenizer", help="tokenizer directory (default: the model directory)"
    )
    block_size: int = flag_field(
        16,
        flag="--block-size",
        type=int,
        choices=VALID_BLOCK_SIZES,
        managed=True,
        help="tokens per KV-cache block (default 16)",
    )
    gpu_memory_utilization: float = flag_field(
        0.9,
        flag="--gpu-memory-utilization",
        type=float,
        managed=True,
        help="fraction of device memory for weights, activations and the KV cache (default 0.9)",
    )
    num_gpu_blocks_override: int | None = flag_field(
        None,
        flag="--num-gpu-blocks-override",
        type=int,
        managed=True,
        help="use this many KV blocks instead of profiling (the operator passes its sizing here);"
        " if it does not fit after profiling on a GPU, the smaller number is used",
    )
    enable_prefix_caching: bool = flag_field(
        True,
        flag="--enable-prefix-caching",
        managed=True,
        help="reuse KV blocks of shared prompt prefixes (default on)",
    )
    enable_chunked_prefill: bool = flag_field(
        True,
        flag="--enable-chunked-prefill",
        managed=True,
        help="split long prompts across steps and mix them with decodes (default on)",
    )
    max_num_seqs: int = flag_field(
        256, flag="--max-num-seqs", type=int, managed=True, help="most sequences in one step (default 256)"
    )
    max_num_batched_tokens: int = flag_field(
        2048, flag="--max-num-batched-tokens", type=int, managed=True, help="token budget of one step (default 2048)"
    )
    max_model_len: int | None = flag_field(
        None,
        flag="--max-model-len",
        type=int,
        managed=True,
        help="longest prompt + completion (default: the model's max_position_embeddings)",
    )
    swap_space: float = flag_field(
        4.0,
        flag="--swap-space",
        type=float,
        managed=True,
        help="GiB of host memory for KV blocks swapped out by preemption (default 4); with"
        " --preemption-mode swap it must fit in the host memory available (MemAvailable, or the"
        " cgroup's limit less its working set if lower); on a CPU beside the KV pool, which is host memory too",
    )
    kv_offloading_size: float = flag_field(
        0.0,
        flag="--kv-offloading-size",
        type=float,
        managed=True,
        help="GiB of host memory for the prefix cache's second tier: cached blocks evicted from the KV pool are"
        " kept there and copied back on a prefix hit instead of recomputed (default 0: off; vLLM's"
        " flag); it shares one host pool with --swap-space (docs/kv-offload.md)",
    )
    preemption_mode: str = flag_field(
        "recompute",
        flag="--preemption-mode",
        choices=PREEMPTION_MODES,
        help="when the pool runs out: recompute (free and redo) or swap (to host memory)",
    )
    dtype: str = flag_field(
        "auto",
        flag="--dtype",
        choices=DTYPES,
        managed=True,
        help="weight and KV dtype (default auto: the config's torch_dtype; if it names none, bfloat16"
        " on a GPU and float32 on a CPU; a float16 model runs in float32 on a CPU)",
    )
    device: str = flag_field("auto", flag="--device", choices=DEVICES, help="default auto")
    cpu_memory_budget_bytes: int = flag_field(
        2 << 30,
        flag="--cpu-memory-budget",
        cli_default="2GiB",
        parse=_cpu_memory_budget_bytes,
        managed=True,
        help="on CPU, the memory the engine treats as its device memory (default 2GiB)",
    )
    tensor_parallel_size: int = flag_field(
        1,
        flag="--tensor-parallel-size",
        type=int,
        managed=True,
        help="GPUs (on CPU: processes) per replica; the attention and MLP weights and the KV"
        " heads are split across them (default 1)",
    )  # >1: engine/distributed
    compile: bool = flag_field(
        False,
        flag="--compile",
        help="on a CPU (tensor parallel size 1): torch.compile the model's decoder at start-up, one graph"
        " for every step size up to --max-num-batched-tokens (default off)",
    )
    overlap: str = flag_field(
        "off",
        flag="--overlap",
        choices=OVERLAP_MODES,
        const="process",
        help="detokenization, stop strings and output building beside the next step's forward"
        " (engine/overlap/): off (inline, the default), thread (a second thread: it shares the GIL) or"
        " process (a child process, on another core); --overlap alone means process",
    )
    forward: str = flag_field(
        "module",
        flag="--forward",
        choices=FORWARD_MODES,
        help="the decoder forward of a step (engine/gpu_forward/): module (the default until a GPU run has"
        " measured our decoder: transformers' modules with the paged attention; on a CPU its fused"
        " layers), auto (on CUDA our Triton decoder for Llama, Mistral, Qwen2 and Qwen3 at tensor"
        " parallel size 1, the module path for any other model; on a CPU its own fused layers) or triton (our Triton decoder, any device: a CPU needs TRITON_INTERPRET=1;"
        " an unsupported model is refused at load)",
    )
    max_cudagraph_capture_size: int = flag_field(
        0,
        flag="--max-cudagraph-capture-size",
        type=int,
        managed=True,
        help="decode steps of up to this many sequences run as a CUDA graph captured at start-up, one per"
        " batch-size bucket (1, 2, 4, then steps of 8, then of 16 above 256; capped by --max-num-seqs) and"
        " counted in the KV sizing; vLLM's max_cudagraph_capture_size: one number, not a list of sizes, so"
        " the buckets and their memory follow from it. 0 (the default until a GPU run has measured the"
        " graphs) runs every step eagerly. On a CPU the buckets' static buffers are replayed without"
        " capture: exact, not faster (for tests)",
    )  # engine/cuda_graphs/
    async_scheduling: bool = flag_field(
        False,
        flag="--async-scheduling",
        help="schedule the next step and process the previous step's outputs while a step's forward runs on a"
        " second thread (engine/async_step/; as vLLM's); steps run synchronously while a beam-search,"
        " structured-output, n > 1 or prompt-logprobs request is in the engine, and always with tensor"
        " parallelism or --compile (default off)",
    )
    seed: int = flag_field(0, flag="--seed", type=int, help="seed of the sampling of unseeded requests (default 0)")
    watermark: float = 0.01  # fraction of blocks kept free when admitting new requests (no flag)

    def __post_init__(self) -> None:
        if not isinstance(self.model, (str, os.PathLike)) or not str(self.model):
            raise ValueError(f"model: must be a model directory path, got {self.model!r}")
        if isinstance(self.block_size, bool) or self.block_size not in VALID_BLOCK_SIZES:
            raise ValueError(f"block_size: must be one of {VALID_BLOCK_SIZES}, got {self.block_size!r}")
        u = self.gpu_memory_utilization
        if isinstance(u, bool) or not isinstance(u, (int, float)) or not 0.0 < u <= 1.0:
            raise ValueError(f"gpu_memory_utilization: must be in (0, 1], got {u!r}")
        positive_int("num_gpu_blocks_override", self.num_gpu_blocks_override, allow_none=True)
        positive_int("max_num_seqs", self.max_num_seqs)
        positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        positive_int("max_model_len", self.max_model_len, allow_none=True)
        positive_int("tensor_parallel_size", self.tensor_parallel_size)
        if (
            isinstance(self.swap_space, bool)
            or not isinstance(self.swap_space, (int, float))
            or not math.isfinite(self.swap_space)
            or self.swap_space < 0
        ):
            raise ValueError(f"swap_space (--swap-space): must be a number of GiB >= 0, got {self.swap_space!r}")
        if (
            isinstance(self.kv_offloading_size, bool)
            or not isinstance(self.kv_offloading_size, (int, float))
            or not math.isfinite(self.kv_offloading_size)
            or self.kv_offloading_size < 0
        ):
            raise ValueError(
                "kv_offloading_size (--kv-offloading-size): must be a number of GiB >= 0, got"
                f" {self.kv_offloading_size!r}"
            )
        if self.kv_offloading_size and not self.enable_prefix_caching:
            raise ValueError(
                "kv_offloading_size (--kv-offloading-size): the tier keeps the prefix cache's"
                " evicted blocks; it needs --enable-prefix-caching"
            )
        if self.kv_offloading_size:
            _check_offload_fits(
                self.kv_offloading_size,
                self.swap_space if self.preemption_mode == "swap" else 0.0,
                self.tensor_parallel_size,
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: must be one of {DTYPES}, got {self.dtype!r}")
        if self.device not in DEVICES:
            raise ValueError(f"device: must be one of {DEVICES}, got {self.device!r}")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode: must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}")
        if self.preemption_mode == "swap":
            _check_swap_space_fits(self.swap_space, self.tensor_parallel_size)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"seed: must be an integer, got {self.seed!r}")
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(f"enable_prefix_caching: must be a boolean, got {self.enable_prefix_caching!r}")
        if not isinstance(self.enable_chunked_prefill, bool):
            raise ValueError(f"enable_chunked_prefill: must be a boolean, got {self.enable_chunked_prefill!r}")
        if not isinstance(self.compile, bool):
            raise ValueError(f"compile: must be a boolean, got {self.compile!r}")
        if self.compile and (self.device == "cuda" or self.tensor_parallel_size > 1):
            raise ValueError(
                "compile (--compile): the compiled forward runs on a CPU with tensor_parallel_size 1"
                f" only, got device {self.device!r}, tensor_parallel_size {self.tensor_parallel_size}"
            )
        if not isinstance(self.forward, str) or self.forward not in FORWARD_MODES:
            raise ValueError(f"forward (--forward): must be one of {', '.join(FORWARD_MODES)}, got {self.forward!r}")
        if self.compile and self.forward == "triton":
            raise ValueError(
                "compile (--compile) compiles the CPU's fused layers; forward 'triton' runs the Triton"
                " decoder instead: choose one"
            )
        if (
            isinstance(self.max_cudagraph_capture_size, bool)
            or not isinstance(self.max_cudagraph_capture_size, int)
            or self.max_cudagraph_capture_size < 0
        ):
            raise ValueError(
                "max_cudagraph_capture_size (--max-cudagraph-capture-size): must be an integer >= 0"
                f" (0: no graphs), got {self.max_cudagraph_capture_size!r}"
            )
        if not isinstance(self.async_scheduling, bool):
            raise ValueError(f"async_scheduling (--async-scheduling): must be a boolean, got {self.async_scheduling!r}")
        if not isinstance(self.overlap, str) or self.overlap not in OVERLAP_MODES:
            raise ValueError(f"overlap (--overlap): must be one of {', '.join(OVERLAP_MODES)}, got {self.overlap!r}")
        positive_int("cpu_memory_budget_bytes", self.cpu_memory_budget_bytes)
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark: must be in [0, 1), got {self.watermark!r}")
        if (
            not self.enable_chunked_prefill
            and self.max_model_len is not None
            and self.max_model_len > self.max_num_batched_tokens
        ):
            raise ValueError(
                f"max_num_batched_tokens: without chunked prefill it must be >= max_model_len"
                f" ({self.max_model_len}), got {self.max_num_batched_tokens}"
            )
