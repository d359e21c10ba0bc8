"""Engine flags shared by `pagedinfer generate` and `pagedinfer serve` (named like vLLM's)."""

from __future__ import annotations

import argparse

from pagedinfer.engine import sizing
from pagedinfer.engine.config import DTYPES, PREEMPTION_MODES, EngineConfig


def add_engine_args(p: argparse.ArgumentParser, model_required: bool = True) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--model", required=model_required, default=None,
                   help="Hugging Face model directory (config.json + safetensors + tokenizer)")
    g.add_argument("--revision", default=None,
                   help="revision of a Hugging Face model id (--model org/name), resolved from the local"
                        " cache when HF_HUB_OFFLINE=1")
    g.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the model directory)")
    g.add_argument("--block-size", type=int, default=16, choices=sizing.VALID_BLOCK_SIZES,
                   help="tokens per KV-cache block (default 16)")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="fraction of device memory for weights, activations and the KV cache (default 0.9)")
    g.add_argument("--num-gpu-blocks-override", type=int, default=None,
                   help="use this many KV blocks instead of profiling (the operator passes its sizing here);"
                        " if it does not fit after profiling on a GPU, the smaller number is used")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse KV blocks of shared prompt prefixes (default on)")
    g.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True,
                   help="split long prompts across steps and mix them with decodes (default on)")
    g.add_argument("--max-num-seqs", type=int, default=256, help="most sequences in one step (default 256)")
    g.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="token budget of one step (default 2048)")
    g.add_argument("--max-model-len", type=int, default=None,
                   help="longest prompt + completion (default: the model's max_position_embeddings)")
    g.add_argument("--swap-space", type=float, default=4.0,
                   help="GiB of host memory for KV blocks swapped out by preemption (default 4); with"
                        " --preemption-mode swap it must fit in the host memory available (MemAvailable, or the"
                        " cgroup's limit less its working set if lower)")
    g.add_argument("--preemption-mode", choices=PREEMPTION_MODES, default="recompute",
                   help="when the pool runs out: recompute (free and redo) or swap (to host memory)")
    g.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="weight and KV dtype (default auto: the config's torch_dtype; if it names none, bfloat16"
                        " on a GPU and float32 on a CPU; a float16 model runs in float32 on a CPU)")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="default auto")
    g.add_argument("--cpu-memory-budget", default="2GiB",
                   help="on CPU, the memory the engine treats as its device memory (default 2GiB)")
    g.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs (on CPU: processes) per replica; the attention and MLP weights and the KV"
                        " heads are split across them (default 1)")
    g.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False,
                   help="on a CPU (tensor parallel size 1): torch.compile the model's forward, one graph per token"
                        " bucket (powers of two up to --max-num-batched-tokens), all compiled at start-up"
                        " (default off)")
    g.add_argument("--seed", type=int, default=0, help="seed of the sampling of unseeded requests (default 0)")


def engine_config_from_args(args: argparse.Namespace, model: str | None = None) -> EngineConfig:
    return EngineConfig(
        model=model or args.model,
        tokenizer=args.tokenizer,
        revision=args.revision,
        block_size=args.block_size,
        gpu_memory_utilization=args.gpu_memory_utilization,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        enable_prefix_caching=args.enable_prefix_caching,
        enable_chunked_prefill=args.enable_chunked_prefill,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        swap_space=args.swap_space,
        preemption_mode=args.preemption_mode,
        dtype=args.dtype,
        device=args.device,
        cpu_memory_budget_bytes=sizing.parse_bytes(args.cpu_memory_budget, name="--cpu-memory-budget"),
        tensor_parallel_size=args.tensor_parallel_size,
        seed=args.seed,
        compile=args.compile,
    )
