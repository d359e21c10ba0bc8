"""Sampler benchmark: one step's sampled rows drawn in one batch vs the same draws row by row.

    OMP_NUM_THREADS=1 .venv/bin/python bench/sampler_step.py [--rows 256] [--vocab 32000] [--device cpu]

`pagedinfer.engine.sampler.Sampler` cuts every sampled row of a step (temperature,
top-k, top-p, min-p) in one batch of tensor operations and draws with one uniform
per row, so a step costs one device sync. The peer, measured in the same run on
the same logits, is the per-row loop the engine used before: each row cut and
drawn with `torch.multinomial` on its own (one host round trip per row on a GPU).
Half of the rows carry a seed, as a mixed workload would. Medians of `--repeats`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256, help="sampled rows in the step (default 256)")
    parser.add_argument("--vocab", type=int, default=32000, help="vocabulary size (default 32000)")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per case (default 7)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    return parser.parse_args()


def per_row_draw(logits, params_list, generators) -> list[int]:
    """The peer: each row cut and drawn alone (the engine's sampler before batching)."""
    import torch

    tokens = []
    for row, params, gen in zip(logits, params_list, generators):
        row = row / params.temperature
        if params.top_k is not None and params.top_k < row.shape[0]:
            row = row.masked_fill(row < torch.topk(row, params.top_k).values[-1], float("-inf"))
        probs = torch.softmax(row, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            drop = torch.cumsum(sorted_probs, dim=-1) - sorted_probs > params.top_p
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs.masked_fill(drop, 0.0))
        if params.min_p > 0.0:
            probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
        tokens.append(int(torch.multinomial(probs.cpu(), 1, generator=gen)))
    return tokens


def median_ms(fn, repeats: int, sync) -> float:
    fn()
    times = []
    for _ in range(repeats):
        sync()
        began = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - began)
    return 1e3 * statistics.median(times)


def main() -> int:
    args = parse_args()
    import torch

    from pagedinfer.engine.sampler import Sampler
    from pagedinfer.engine.sampling_params import SamplingParams
    from pagedinfer.engine.sequence import Sequence

    device = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    logits = torch.randn(args.rows, args.vocab, device=device)
    cases = [
        ("top_k=50, top_p=0.95", dict(top_k=50, top_p=0.95)),
        ("top_p=0.9", dict(top_p=0.9)),
        ("temperature only", {}),
        ("min_p=0.05", dict(min_p=0.05)),
    ]
    print(
        f"{args.rows} sampled rows x {args.vocab} vocabulary on {device}, torch {torch.__version__}, "
        f"threads {torch.get_num_threads()}; median of {args.repeats}"
    )
    print(f"{'case':<24} {'per-row ms':>11} {'batched ms':>11} {'per-row / batched':>18}")
    for name, options in cases:
        params = [SamplingParams(temperature=0.8, seed=(i if i % 2 else None), **options) for i in range(args.rows)]
        seqs = [
            Sequence(request_id=str(i), prompt_token_ids=[5, 6], params=p, arrival_time=0.0)
            for i, p in enumerate(params)
        ]
        sampler = Sampler(seed=0, eos_token_ids={0}, device=device)
        generators = [torch.Generator().manual_seed(i) for i in range(args.rows)]
        batched = median_ms(lambda: sampler.sample(logits, seqs), args.repeats, sync)
        per_row = median_ms(lambda: per_row_draw(logits, params, generators), args.repeats, sync)
        print(f"{name:<24} {per_row:>11.1f} {batched:>11.1f} {per_row / batched:>17.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
