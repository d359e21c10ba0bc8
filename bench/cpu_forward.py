"""Step times of the 125M Llama's forward on CPU: F.linear vs packed oneDNN linears, eager vs compiled.

    .venv/bin/python bench/cpu_forward.py --threads 1 --dtype float32

The issue's 125M model (hidden 768, 12 layers, 12 heads, 4 KV heads, MLP 2048,
vocab 32000; random weights, built once under --model-dir, never downloaded)
runs engine steps through ModelRunner.run_step: decodes of B sequences with
a 128-token context each, and one prefill chunk of N tokens. Every variant's
runner is built in the same process and the variants are timed round-robin
(`--repeats` rounds, median per variant), so machine load hits all alike;
start-up (load + fusing + packing + compiling the one graph) is printed per variant.
Decode logits of each variant are compared with the first's (max |diff|).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

MODEL_125M = dict(
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=4,
    intermediate_size=2048,
    vocab_size=32000,
    max_position_embeddings=2048,
)
VARIANTS = {  # name: (PAGEDINFER_CPU_LINEAR, compile)
    "F.linear eager": ("aten", False),
    "packed eager": ("onednn", False),
    "packed compiled": ("onednn", True),
}


def default_model_dir() -> str:
    return os.path.join(tempfile.gettempdir(), "pagedinfer-bench-llama-125m")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--decode-batches", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--prefill-tokens", type=int, nargs="+", default=[512])
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=512,
        help="the step budget (the compiled graph serves 1 to this many tokens)",
    )
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--model-dir", default=default_model_dir())
    return p.parse_args(argv)


def build_model(model_dir: str) -> str:
    import torch
    import transformers

    from pagedinfer.engine.tiny_model import train_tokenizer

    out = Path(model_dir)
    if (out / "config.json").is_file():
        return model_dir
    train_tokenizer(out)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        bos_token_id=1, eos_token_id=2, pad_token_id=3, tie_word_embeddings=False, **MODEL_125M
    )
    transformers.LlamaForCausalLM(config).save_pretrained(str(out))
    return model_dir


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from pagedinfer.contracts.config.engine_config import EngineConfig
    from pagedinfer.engine.batch.deltas import BlockTableUpdate, TableDeltas
    from pagedinfer.engine.distributed.step_message import StepInputs
    from pagedinfer.engine.runner.model_runner import ModelRunner

    torch.set_num_threads(args.threads)
    model_dir = build_model(args.model_dir)
    block_size, context = 16, 128
    max_batch = max(args.decode_batches)
    blocks_per_seq = -(-(context + 1) // block_size)
    num_blocks = max(max_batch * blocks_per_seq, -(-max(args.prefill_tokens) // block_size)) + 1
    runners = {}
    for name in args.variants:
        backend, compiled = VARIANTS[name]
        os.environ["PAGEDINFER_CPU_LINEAR"] = backend
        start = time.perf_counter()
        runner = ModelRunner(
            EngineConfig(
                model=model_dir,
                dtype=args.dtype,
                device="cpu",
                compile=compiled,
                max_num_batched_tokens=args.max_num_batched_tokens,
            )
        )
        runner.allocate_kv_cache(num_blocks, 0)
        runners[name] = runner
        print(
            f"{name}: start-up {time.perf_counter() - start:.1f} s"
            + (f" (compiling {runner.compiled.startup_seconds:.1f} s)" if runner.compiled else ""),
            flush=True,
        )
    # sequence i holds blocks [1 + i * blocks_per_seq, ...); the prefill sequence (id max_batch) blocks 1, 2, ...
    tables = [
        BlockTableUpdate(i, 0, tuple(range(1 + i * blocks_per_seq, 1 + (i + 1) * blocks_per_seq)))
        for i in range(max_batch)
    ]
    prefill_table = BlockTableUpdate(max_batch, 0, tuple(range(1, 1 + -(-max(args.prefill_tokens) // block_size))))
    steps = {}
    for batch in args.decode_batches:
        steps[f"decode B={batch}"] = StepInputs(
            [7] * batch, list(range(batch)), [context + 1] * batch, [1] * batch, list(range(batch))
        )
    for tokens in args.prefill_tokens:
        steps[f"prefill N={tokens}"] = StepInputs([7] * tokens, [max_batch], [tokens], [tokens], [tokens - 1])
    for runner in runners.values():  # fill the decode contexts once (same K/V in every runner's cache)
        for i in range(max_batch):
            new_tables = TableDeltas((tables[i],) if i else (tables[i], prefill_table))
            runner.run_step(StepInputs([7 + i % 50] * context, [i], [context], [context], [context - 1], new_tables))
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), {args.dtype}; median ms per step "
        f"({args.repeats} rounds, round-robin) and speed-up over {args.variants[0]}"
    )
    for label, step in steps.items():
        times: dict[str, list[float]] = {name: [] for name in runners}
        logits = {name: runner.run_step(step).float() for name, runner in runners.items()}
        for _ in range(args.repeats):
            for name, runner in runners.items():
                start = time.perf_counter()
                runner.run_step(step)
                times[name].append(time.perf_counter() - start)
        base = statistics.median(times[args.variants[0]])
        first = logits[args.variants[0]]
        cells = [
            f"{name} {statistics.median(t) * 1e3:8.1f} ms x{base / statistics.median(t):4.2f}"
            f" (|dlogit| {(logits[name] - first).abs().max().item():.1e})"
            for name, t in times.items()
        ]
        print(f"{label:15s} " + " | ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
