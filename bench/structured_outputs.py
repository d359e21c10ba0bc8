"""Structured-outputs benchmark: decode throughput with 0%, 50% and 100% of a batch's rows grammar-constrained.

    OMP_NUM_THREADS=1 .venv/bin/python bench/structured_outputs.py [--rows 64] [--tokens 64] [--device cpu]

One engine on the embedded model (or --model), one workload: `--rows` prompts
each generating exactly `--tokens` tokens (min_tokens = max_tokens, so no row
ends early), sampled at temperature 1. A constrained row carries a Lark
grammar `start: /[a-z ,.]+/`, which never completes, so its length does not
change (EOS is masked until min_tokens); its mask is computed by llguidance over the whole vocabulary at every
step, as any grammar's is. The three cases run in the same process, in rotating order,
`--repeats` times; the figure is the median tokens/s of each, and the ratio
to the unconstrained case. Every constrained output is checked against the
grammar.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time

GRAMMAR = "start: /[a-z ,.]+/"
PATTERN = re.compile(r"[a-z ,.]+")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64, help="requests in the batch (default 64)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens generated per request (default 64)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per case (default 3)")
    parser.add_argument("--device", default="cpu", help="engine device (default cpu)")
    parser.add_argument("--model", default=None, help="model directory (default: the embedded model)")
    return parser.parse_args()


def run_case(llm, args, fraction: float) -> float:
    from pagedinfer.engine import SamplingParams
    from pagedinfer.engine.structured.params import StructuredOutputsParams

    num_constrained = round(args.rows * fraction)
    spec = StructuredOutputsParams(grammar=GRAMMAR)
    params = [
        SamplingParams(
            temperature=1.0,
            seed=i,
            max_tokens=args.tokens,
            min_tokens=args.tokens,
            structured_outputs=spec if i < num_constrained else None,
        )
        for i in range(args.rows)
    ]
    start = time.perf_counter()
    outs = llm.generate(["Write a sentence: "] * args.rows, params)
    elapsed = time.perf_counter() - start
    total = sum(len(o.outputs[0].token_ids) for o in outs)
    if total != args.rows * args.tokens:
        sys.exit(f"expected {args.rows * args.tokens} tokens, got {total}")
    bad = [o.outputs[0].text for o in outs[:num_constrained] if not PATTERN.fullmatch(o.outputs[0].text)]
    if bad:
        sys.exit(f"{len(bad)} constrained outputs do not match the grammar, e.g. {bad[0]!r}")
    return total / elapsed


def main() -> None:
    args = parse_args()
    from pagedinfer.contracts.embedded_model import default_model_dir
    from pagedinfer.engine import LLM

    llm = LLM(
        model=args.model or str(default_model_dir()),
        device=args.device,
        max_num_seqs=max(args.rows, 1),
        max_num_batched_tokens=max(2048, args.rows * 16),
    )
    run_case(llm, args, 0.5)  # warm-up: compiles the grammar and touches every code path once
    fractions = (0.0, 0.5, 1.0)
    samples: dict[float, list[float]] = {f: [] for f in fractions}
    for repeat in range(args.repeats):
        for i in range(len(fractions)):  # the order rotates, so no case always runs first
            fraction = fractions[(i + repeat) % len(fractions)]
            samples[fraction].append(run_case(llm, args, fraction))
    base = statistics.median(samples[0.0])
    print(f"{args.rows} rows x {args.tokens} tokens on {args.device}, median of {args.repeats}")
    print(f"{'constrained rows':>18} {'tokens/s':>10} {'vs 0%':>7}")
    for fraction in fractions:
        rate = statistics.median(samples[fraction])
        print(f"{fraction:>17.0%} {rate:>10.1f} {rate / base:>6.2f}x")


if __name__ == "__main__":
    main()
