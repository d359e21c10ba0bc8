"""How much of a synchronous step is host work that async scheduling could hide: thread CPU seconds of the engine
thread inside `runner.execute` (the forward and its inputs) against the rest of the step (scheduling, sampling,
appending tokens, detokenizing, outputs), over a seeded decode-heavy workload on one torch thread.

    OMP_NUM_THREADS=1 .venv/bin/python bench/host_share.py --model $TMPDIR/pagedinfer-bench/125m --dtype bfloat16

(`bench/throughput.py --models 125m` builds that model directory.) Thread CPU time, not wall time: the split
holds on a loaded machine. A timer around `runner.execute` is set on the bench's own engine object.
"""

from __future__ import annotations

import argparse
import random
import time


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a model directory")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--num-requests", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    from pagedinfer.contracts.config.engine_config import EngineConfig
    from pagedinfer.engine import SamplingParams
    from pagedinfer.engine.llm_engine import LLMEngine

    engine = LLMEngine(EngineConfig(model=args.model, dtype=args.dtype, num_gpu_blocks_override=1024, device="cpu"))
    vocab = engine.runner.vocab_size
    forward_seconds = 0.0
    execute = engine.runner.execute

    def timed_execute(*a, **k):
        nonlocal forward_seconds
        start = time.thread_time()
        try:
            return execute(*a, **k)
        finally:
            forward_seconds += time.thread_time() - start

    engine.runner.execute = timed_execute
    rng = random.Random(args.seed)
    for i in range(args.num_requests):
        engine.add_request(
            str(i),
            [rng.randrange(7, vocab) for _ in range(rng.randrange(16, 200))],
            SamplingParams(temperature=0, max_tokens=rng.randrange(16, 120), ignore_eos=True),
        )
    start, steps = time.thread_time(), 0
    while engine.has_unfinished_requests():
        engine.step_deltas()
        steps += 1
    total = time.thread_time() - start
    rest = total - forward_seconds
    print(
        f"{args.dtype}: {steps} steps, engine thread {total:.2f} CPU s: runner.execute {forward_seconds:.2f} s,"
        f" the rest {rest:.3f} s = {100 * rest / total:.1f}% ({1e3 * rest / steps:.2f} ms per step)"
    )
    engine.shutdown()


if __name__ == "__main__":
    main()
