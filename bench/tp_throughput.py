"""Tensor parallelism on CPU: output tokens/s of one replica split across N processes vs one process.

Same workload, same run: a random Llama (default: hidden 768, 12 layers, 12
heads, 4 KV heads, ~104M parameters) generates greedy tokens for random
prompts, first with tensor_parallel_size=1 and N torch threads, then with
tensor_parallel_size=N and one thread per rank (the same cores), and, as a
second baseline, tensor_parallel_size=1 with one thread. Also
reports the share of rank 0's step time spent broadcasting the step's inputs.
Both runs must produce the same tokens (checked; a mismatch is exit 1).

    OMP_NUM_THREADS=1 .venv/bin/python bench/tp_throughput.py --tp-size 2

Not a timed test; tests/bench smoke-tests it with a tiny model.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tp-size", type=int, default=2)
    p.add_argument("--hidden-size", type=int, default=768)
    p.add_argument("--num-layers", type=int, default=12)
    p.add_argument("--num-heads", type=int, default=12)
    p.add_argument("--num-kv-heads", type=int, default=4)
    p.add_argument("--intermediate-size", type=int, default=3072)
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--model-dir", default=None, help="where to build the random model (default: a temp dir)")
    p.add_argument("--json-out", default=None)
    return p.parse_args(argv)


def run(model_dir: str, tp: int, threads: int, prompts: list[list[int]], max_tokens: int) -> dict:
    import torch

    from pagedinfer.engine import LLM, SamplingParams

    torch.set_num_threads(threads)  # ranks 1..N-1 take rank 0's thread count
    llm = LLM(
        model_dir,
        device="cpu",
        dtype="float32",
        tensor_parallel_size=tp,
        max_model_len=512,
        num_gpu_blocks_override=len(prompts) * 512 // 16,
        enable_prefix_caching=False,
    )
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=2))  # warm-up
    runner = llm.llm_engine.runner
    channel = runner.workers.channel if runner.workers is not None else None
    before = (channel.broadcast_seconds, channel.num_broadcasts) if channel else (0.0, 0)
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    tokens = [o.outputs[0].token_ids for o in outs]
    result = {
        "tensor_parallel_size": tp,
        "threads_per_rank": threads,
        "seconds": seconds,
        "output_tokens_per_s": sum(map(len, tokens)) / seconds,
        "sharded_weight_bytes_per_rank": runner.sharded_weight_bytes,
        "tokens": tokens,
    }
    if channel is not None:
        bcast_s, n = channel.broadcast_seconds - before[0], channel.num_broadcasts - before[1]
        result.update(
            broadcast_share_of_generate=bcast_s / seconds, broadcasts=n, mean_broadcast_ms=1000 * bcast_s / max(1, n)
        )
    llm.shutdown()
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from pagedinfer.engine.tiny_model import make_tiny_model

    model_dir = Path(args.model_dir or tempfile.mkdtemp(prefix="pagedinfer-tp-bench-"))
    make_tiny_model(
        model_dir,
        "llama",
        hidden_size=args.hidden_size,
        num_hidden_layers=args.num_layers,
        num_attention_heads=args.num_heads,
        num_key_value_heads=args.num_kv_heads,
        intermediate_size=args.intermediate_size,
        max_position_embeddings=512,
    )
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    rng = random.Random(0)
    prompts = [[rng.randrange(8, vocab) for _ in range(args.prompt_len)] for _ in range(args.num_prompts)]
    one = run(str(model_dir), 1, args.tp_size, prompts, args.max_tokens)
    one_thread = run(str(model_dir), 1, 1, prompts, args.max_tokens)
    split = run(str(model_dir), args.tp_size, 1, prompts, args.max_tokens)
    same = one.pop("tokens") == split.pop("tokens") == one_thread.pop("tokens")
    print(
        f"model: hidden {args.hidden_size}, {args.num_layers} layers, {args.num_heads} heads, "
        f"{args.num_kv_heads} KV heads; {args.num_prompts} prompts x {args.prompt_len} tokens,"
        f" {args.max_tokens} output tokens each"
    )
    for r in (one, one_thread, split):
        print(
            f"tp={r['tensor_parallel_size']} x {r['threads_per_rank']} thread(s)/rank:"
            f" {r['output_tokens_per_s']:8.1f} output tokens/s"
            f" ({r['sharded_weight_bytes_per_rank'] / 2**20:.1f} MiB of sharded weights per rank)"
        )
    print(
        f"speed-up tp={args.tp_size} vs tp=1 x {args.tp_size} threads:"
        f" {split['output_tokens_per_s'] / one['output_tokens_per_s']:.2f}x;"
        f" vs tp=1 x 1 thread: {split['output_tokens_per_s'] / one_thread['output_tokens_per_s']:.2f}x"
    )
    print(
        f"step broadcast: {split['mean_broadcast_ms']:.3f} ms each,"
        f" {100 * split['broadcast_share_of_generate']:.2f}% of rank 0's time"
    )
    print(f"same tokens: {same}")
    if args.json_out:
        Path(args.json_out).write_text(
            json.dumps({"tp1": one, "tp1_one_thread": one_thread, "tp": split, "same_tokens": same}, indent=2)
        )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
