"""Minor page faults and thread CPU seconds of the engine's steps over the throughput bench's workload.

    cd /tmp && OMP_NUM_THREADS=1 /path/to/.venv/bin/python /path/to/bench/step_faults.py [--model 125m] \
        [--dtype float32] [--num-requests 48]

Builds the model and the seeded workload as bench/throughput.py does (its
defaults: prompt median 128, output median 64, sigma 1), drains it once
through LLMEngine to warm the process up (allocator state, first touch of the
KV pool), then once more with the prefix cache emptied, reading
`getrusage(RUSAGE_THREAD).ru_minflt` around every step. Prints the total
faults, the largest per-step counts and the engine thread's CPU seconds. A
fault costs about 2 us of kernel time (zeroing the page), so a fault count is
a load-independent measure of allocator churn (engine/cpu/mlp_chunks.py).
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time

import torch
from throughput import FIRST_REGULAR_TOKEN_ID, MODELS
from workload import make_workload

from pagedinfer.engine.bench.workload import LengthDistribution


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=list(MODELS), default="125m")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--num-requests", type=int, default=48)
    p.add_argument("--model-dir", default=os.path.join(tempfile.gettempdir(), "pagedinfer-bench"))
    args = p.parse_args()
    if args.num_requests < 1:
        p.error("--num-requests: must be >= 1")
    torch.set_num_threads(1)
    from pagedinfer.contracts.config.engine_config import EngineConfig
    from pagedinfer.engine import LLMEngine, SamplingParams
    from pagedinfer.engine.tiny_model import make_tiny_model

    spec = MODELS[args.model]
    model_dir = str(make_tiny_model(os.path.join(args.model_dir, args.model), arch="llama", **spec.shape))
    requests = make_workload(
        args.num_requests,
        0,
        vocab_size=spec.prompt_vocab_size,
        first_regular_token_id=FIRST_REGULAR_TOKEN_ID,
        prompt_lengths=LengthDistribution.with_median(128, 1.0, 4, 1024),
        output_lengths=LengthDistribution.with_median(64, 1.0, 4, 512),
        max_model_len=spec.max_model_len,
    )
    engine = LLMEngine(
        EngineConfig(
            model=model_dir,
            block_size=16,
            num_gpu_blocks_override=2048,
            max_num_seqs=256,
            max_num_batched_tokens=2048,
            max_model_len=spec.max_model_len,
            dtype=args.dtype,
            device="cpu",
        )
    )

    def drain(prefix: str) -> list[int]:
        for i, r in enumerate(requests):
            engine.add_request(
                f"{prefix}{i}",
                list(r.prompt_token_ids),
                SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True),
            )
        faults = []
        while engine.has_unfinished_requests():
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            engine.step_deltas()
            faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
        return faults

    drain("warm")
    engine.kv.pool.reset_prefix_cache()
    began = time.thread_time()
    faults = drain("run")
    print(
        f"{args.model} {args.dtype}: {len(faults)} steps, {sum(faults)} minor faults, "
        f"thread CPU {time.thread_time() - began:.1f} s; most in one step: {sorted(faults)[-6:]}"
    )
    engine.shutdown()


if __name__ == "__main__":
    main()
