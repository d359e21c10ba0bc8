"""`pagedinfer plan`: the KV-cache plan for a model on a GPU, without a GPU.

Uses exactly the sizing functions the operator uses, so both print the same
num_gpu_blocks for the same inputs (the decode graphs' estimated memory too,
with --max-cudagraph-capture-size), and the dtype the engine itself picks on
`--device` (`model_shape.resolve_dtype`). `--device cpu` plans a CPU engine:
`--gpu-memory` is then its --cpu-memory-budget, and the activation reserve
is the one the engine estimates on a CPU.
"""

from __future__ import annotations

import argparse
import json

from pagedinfer.contracts import sizing
from pagedinfer.contracts.model_shape import DEVICE_TYPES, ModelShape
from pagedinfer.contracts.sizing_inputs import sizing_inputs
from pagedinfer.engine.engine_args import add_plan_args
from pagedinfer.engine.hf_config import load_hf_config


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="print the KV-cache plan (bytes per token/block, num_gpu_blocks, max tokens)",
        description="Size the KV block pool of one GPU for a model, the same way the operator does.",
    )
    p.add_argument("--model", required=True, help="a model directory holding config.json, or the path of a config.json")
    p.add_argument("--gpu-memory", required=True, help="memory of one GPU (or MIG slice), e.g. 80GiB, 81559Mi, 141G")
    add_plan_args(p)
    p.add_argument(
        "--device",
        default="cuda",
        choices=DEVICE_TYPES,
        help="where the engine runs (default cuda); decides dtype auto, and with cpu --gpu-memory is"
        " the engine's --cpu-memory-budget",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    shape = ModelShape.from_hf_config(load_hf_config(args.model, name="--model"), dtype=args.dtype, device=args.device)
    memory_bytes = sizing.parse_bytes(args.gpu_memory, name="--gpu-memory")
    result = sizing.plan_kv_cache(sizing_inputs(args, shape, memory_bytes, args.device))
    if args.json:
        print(json.dumps(result.__dict__, indent=2))
        return 0
    rows = [
        ("GPU memory", f"{result.gpu_memory_bytes / 2**30:.2f} GiB x {result.gpu_memory_utilization}"),
        ("weights per GPU", f"{result.weight_bytes_per_gpu / 2**30:.2f} GiB"),
        ("activation reserve", f"{result.activation_reserve_bytes / 2**30:.2f} GiB"),
        (
            "decode graphs (estimate)",
            f"{result.cuda_graph_bytes / 2**30:.2f} GiB"
            f" (--max-cudagraph-capture-size {args.max_cudagraph_capture_size})",
        ),
        ("KV bytes per token", f"{result.bytes_per_token} ({result.bytes_per_token / 1024:.1f} KiB)"),
        (
            "KV bytes per block",
            f"{result.bytes_per_block} ({result.bytes_per_block / 2**20:.2f} MiB, block_size {result.block_size})",
        ),
        ("num_gpu_blocks", str(result.num_gpu_blocks)),
        ("max tokens in cache", str(result.max_tokens)),
    ]
    if result.max_concurrent_full_sequences is not None:
        rows.append((f"full {result.max_model_len}-token sequences", str(result.max_concurrent_full_sequences)))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0
