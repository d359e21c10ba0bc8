"""The engine's RSS after each pass over the same workload: does memory grow, and by what.

    cd /tmp && OMP_NUM_THREADS=1 /path/to/.venv/bin/python /path/to/bench/rss_passes.py \
        [--model tiny|125m] [--dtype float32] [--passes 6] [--touch-pool]

One `LLM` on the bench's model, workload and KV budget (bench/throughput.py's
defaults) generates the same requests `--passes` times. After each pass it
prints VmRSS, how many bytes of KV the pass's completions needed (completion
tokens x KV bytes per token) and how many of the pool's pages are resident
(`mincore`). On CPU the pool is allocated untouched, so a pass that writes
blocks never written before raises RSS by about that much, until the whole
pool has been written once; `--touch-pool` zeroes the pool before the first
pass (as vLLM-CPU does at start-up), after which RSS stays flat unless
something else grows.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from proc_stats import resident_fraction, rss_bytes  # noqa: E402
from throughput import FIRST_REGULAR_TOKEN_ID, MODELS, parse_args  # noqa: E402
from workload import make_workload  # noqa: E402

from pagedinfer.engine.bench.workload import LengthDistribution  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--passes", type=int, default=6)
    parser.add_argument("--num-requests", type=int, default=48)
    parser.add_argument("--model-dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "pagedinfer-bench"))
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--kv-budget-tokens", type=int, default=32768, help="KV slots of the pool")
    parser.add_argument("--touch-pool", action="store_true", help="zero the KV pool before the first pass")
    args = parser.parse_args(argv)

    from pagedinfer.engine import LLM, SamplingParams
    from pagedinfer.engine.tiny_model import make_tiny_model

    spec = MODELS[args.model]
    model_dir = str(make_tiny_model(os.path.join(args.model_dir, args.model), arch="llama", **spec.shape))
    bench = parse_args(["--skip-vllm"])  # the throughput bench's workload, seed 0
    requests = make_workload(
        args.num_requests,
        bench.seed,
        spec.prompt_vocab_size,
        FIRST_REGULAR_TOKEN_ID,
        LengthDistribution.with_median(bench.prompt_median, bench.sigma, 4, bench.max_prompt_tokens),
        LengthDistribution.with_median(bench.output_median, bench.sigma, 4, bench.max_output_tokens),
        spec.max_model_len,
    )
    llm = LLM(
        model=model_dir,
        dtype=args.dtype,
        device="cpu",
        block_size=args.block_size,
        num_gpu_blocks_override=args.kv_budget_tokens // args.block_size,
        max_model_len=spec.max_model_len,
    )
    pool = llm.llm_engine.runner.kv_cache
    if args.touch_pool:
        pool.zero_()
    kv_bytes_per_token = pool.nbytes // (pool.shape[2] * pool.shape[3])
    completion_tokens = sum(r.max_tokens for r in requests)
    print(
        f"{args.model} {args.dtype}: pool {pool.nbytes / 2**20:.0f} MiB ({kv_bytes_per_token} B of KV a token); "
        f"a pass's completions: {completion_tokens} tokens = {completion_tokens * kv_bytes_per_token / 2**20:.1f} MiB"
    )
    previous = rss_bytes(os.getpid()) / 2**20
    print(f"start: RSS {previous:.0f} MiB, pool resident {resident_fraction(pool.data_ptr(), pool.nbytes):.1%}")
    for n in range(args.passes):
        params = [SamplingParams(max_tokens=r.max_tokens, temperature=0.0, ignore_eos=True) for r in requests]
        llm.generate([list(r.prompt_token_ids) for r in requests], params, use_tqdm=False)
        gc.collect()
        now = rss_bytes(os.getpid()) / 2**20
        print(
            f"pass {n + 1}: RSS {now:.0f} MiB (+{now - previous:.0f}), "
            f"pool resident {resident_fraction(pool.data_ptr(), pool.nbytes):.1%}",
            flush=True,
        )
        previous = now
    return 0


if __name__ == "__main__":
    sys.exit(main())
