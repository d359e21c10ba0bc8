"""End-to-end greedy tokens/s of the 125M Llama on CPU with each linear backend (F.linear vs packed oneDNN).

    .venv/bin/python bench/cpu_generate.py --dtype float32

The model is bench/cpu_forward.py's (built once under its --model-dir). Every
backend's engine (`PAGEDINFER_CPU_LINEAR=aten|onednn`) is built in the same
process and the timed `generate` calls alternate between them (`--repeats`
rounds, median); output tokens/s counts each request's `--max-tokens`. The
backends' greedy tokens are compared (printed).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

from cpu_forward import build_model, default_model_dir

BACKENDS = ("aten", "onednn")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--model-dir", default=default_model_dir())
    args = p.parse_args(argv)
    import torch

    from pagedinfer.engine import LLM, SamplingParams

    torch.set_num_threads(args.threads)
    model_dir = build_model(args.model_dir)
    rng = random.Random(0)
    prompts = [[rng.randrange(7, 384) for _ in range(args.prompt_tokens)] for _ in range(args.num_requests)]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    engines = {}
    for backend in BACKENDS:
        os.environ["PAGEDINFER_CPU_LINEAR"] = backend
        engines[backend] = LLM(
            model=model_dir, dtype=args.dtype, device="cpu", max_model_len=256, cpu_memory_budget_bytes=1 << 30
        )
        engines[backend].generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    times: dict[str, list[float]] = {b: [] for b in BACKENDS}
    outputs = {}
    for _ in range(args.repeats):
        for backend, llm in engines.items():
            start = time.perf_counter()
            outputs[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
            times[backend].append(time.perf_counter() - start)
    total = args.num_requests * args.max_tokens
    for backend, t in times.items():
        print(
            f"{backend:7s} {args.dtype}: {total / statistics.median(t):7.1f} output tok/s"
            f"  runs (s) {', '.join(f'{x:.1f}' for x in t)}"
        )
    print(f"same greedy tokens: {outputs['aten'] == outputs['onednn']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
