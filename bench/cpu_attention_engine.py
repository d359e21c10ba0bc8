"""Engine tokens/s with the native CPU attention vs the torch path, alternated in one process.

    cd /tmp && OMP_NUM_THREADS=1 /path/to/.venv/bin/python /path/to/bench/cpu_attention_engine.py \
        --model-dir DIR [--num-requests 64] [--repeats 3]

One `LLMEngine` (float32, block size 16, chunked prefill, prefix caching,
prefix cache emptied before each run) drains the same seeded workload as
`bench/throughput.py` (log-normal prompt and output lengths, greedy, EOS
ignored), switching `PAGEDINFER_ATTENTION` between `torch` and `native`
(read by the dispatcher at every call) on alternate runs, so both paths see
the same machine load. Reports per path the median output tokens per second
of wall time and of process CPU time (the machine may be shared; CPU time is
what the engine itself spent), the ratio, and whether both paths generated
the same tokens.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from runners import _WARMUP, _drain
from workload import make_workload

from pagedinfer.engine.bench.workload import LengthDistribution


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True, help="a model directory (e.g. engine/tiny_model.py's)")
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per path; medians (default 3)")
    parser.add_argument("--prompt-median", type=int, default=128)
    parser.add_argument("--output-median", type=int, default=64)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    import torch
    import transformers

    from pagedinfer.contracts.config.engine_config import EngineConfig
    from pagedinfer.engine import LLMEngine

    torch.set_num_threads(1)
    vocab = transformers.AutoConfig.from_pretrained(args.model_dir).vocab_size
    requests = make_workload(
        args.num_requests,
        0,
        vocab,
        8,
        LengthDistribution.with_median(args.prompt_median, 1.0, 4, 1024),
        LengthDistribution.with_median(args.output_median, 1.0, 4, 512),
        2048,
    )
    engine = LLMEngine(
        EngineConfig(
            model=args.model_dir,
            block_size=16,
            num_gpu_blocks_override=2048,
            max_num_seqs=256,
            max_num_batched_tokens=2048,
            max_model_len=2048,
            dtype="float32",
            device="cpu",
        )
    )
    num_output = sum(r.max_tokens for r in requests)
    timings: dict[str, list[tuple[float, float]]] = {"torch": [], "native": []}
    outputs: dict[str, list] = {}
    for repeat in range(args.repeats):
        for path in timings:
            os.environ["PAGEDINFER_ATTENTION"] = path
            if repeat == 0:
                _drain(engine, _WARMUP, f"warmup-{path}", None)
            engine.kv.pool.reset_prefix_cache()
            wall, cpu = time.perf_counter(), time.process_time()
            outputs[path], _ = _drain(engine, requests, f"{path}-{repeat}", None)
            timings[path].append((time.perf_counter() - wall, time.process_time() - cpu))
    print(f"{args.num_requests} requests, {num_output} output tokens, model {args.model_dir}")
    medians = {}
    for path, runs in timings.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        medians[path] = (num_output / wall, num_output / cpu)
        print(
            f"{path:<7} {medians[path][0]:8.1f} tok/s wall  {medians[path][1]:8.1f} tok/CPU-s  "
            f"runs (wall s) {[round(w, 1) for w, _ in runs]}"
        )
    print(
        f"native/torch: {medians['native'][0] / medians['torch'][0]:.2f}x wall, "
        f"{medians['native'][1] / medians['torch'][1]:.2f}x CPU; same tokens: {outputs['native'] == outputs['torch']}"
    )


if __name__ == "__main__":
    main()
