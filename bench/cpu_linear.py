"""GFLOP/s of the CPU linear kernels on the 125M Llama's shapes: F.linear (MKL / oneDNN per call)
against weights packed once (oneDNN `_linear_pointwise`, MKL `_mkl_linear`), fp32 and bf16.

    .venv/bin/python bench/cpu_linear.py --threads 1

Shapes are the 125M model's (hidden 768, 4 KV heads of 64, MLP 2048, vocab 32000):
q/o 768x768, k/v 768->256, gate/up 768->2048, down 2048->768, lm_head 768->32000.
M (the step's token count) covers decode (1..256) and prefill (512..2048); the lm_head
only sees the sampled rows (at most max_num_seqs = 256). Each cell is the median of
`--repeats` timed calls after one warm-up; every kernel's result is checked against
F.linear first. MKL's packed GEMM packs for one M and needs the unpacked weight besides
(two copies), so the engine could not use it for every step size; it is shown for comparison.

`--fused` times instead the packed q/k/v (three GEMMs) against one GEMM over their concatenated
weight, and gate/up likewise (what engine/cpu/fused_projections.py does at load): microseconds per
call, medians of `--repeats` calls alternating between the two, and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = {  # name: (out_features, in_features)
    "q/o 768x768": (768, 768),
    "k/v 768->256": (256, 768),
    "gate/up 768->2048": (2048, 768),
    "down 2048->768": (768, 2048),
    "lm_head 768->32000": (32000, 768),
}
LM_HEAD_MAX_M = 256
FUSED = {"q+k+v 768->768+256+256": (768, 256, 256), "gate+up 768->2048+2048": (2048, 2048)}  # output sizes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--m", type=int, nargs="+", default=[1, 16, 64, 256, 512, 2048], help="token counts")
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--fused", action="store_true", help="separate vs fused q/k/v and gate/up GEMMs instead")
    return p.parse_args(argv)


def kernels(weight: torch.Tensor, m: int) -> dict:
    """name -> f(x) for the weight [out, in]; the packed weights are built here, outside the timing."""
    out = {"F.linear": lambda x: F.linear(x, weight)}
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
    out["onednn packed"] = lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    if weight.dtype == torch.float32:
        mkl = torch.ops.mkl._mkl_reorder_linear_weight(weight, m)
        out["mkl packed (+orig)"] = lambda x: torch.ops.mkl._mkl_linear(x, mkl, weight, None, m)
    return out


def median_seconds(fn, x: torch.Tensor, repeats: int) -> float:
    fn(x)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def packed_linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


def fused_rows(dtype: torch.dtype, m: int, out_sizes: tuple[int, ...], repeats: int) -> tuple[float, float]:
    """Median seconds of the separate packed GEMMs and of the one fused GEMM, alternating; results checked."""
    weights = [torch.randn(n, 768, dtype=dtype) / 768**0.5 for n in out_sizes]
    separate = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in weights]
    fused = torch.ops.mkldnn._reorder_linear_weight(torch.cat(weights), None)
    x = torch.randn(m, 768, dtype=dtype)
    kernels = {
        "separate": lambda: [packed_linear(x, w) for w in separate],
        "fused": lambda: packed_linear(x, fused).split(out_sizes, dim=-1),
    }
    for a, b in zip(kernels["separate"](), kernels["fused"]()):
        if (a.float() - b.float()).abs().max().item() > (1e-4 if dtype == torch.float32 else 1e-2):
            raise SystemExit(f"fused {out_sizes} M={m}: the fused GEMM's output differs from the separate ones")
    times: dict[str, list[float]] = {name: [] for name in kernels}
    for _ in range(repeats + 1):
        for name, fn in kernels.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return statistics.median(times["separate"][1:]), statistics.median(times["fused"][1:])


def main_fused(args: argparse.Namespace) -> int:
    print(f"torch {torch.__version__}, {args.threads} thread(s); oneDNN packed, separate vs fused, us per call")
    for dtype_name in args.dtypes:
        for name, out_sizes in FUSED.items():
            for m in args.m:
                separate, fused = fused_rows(getattr(torch, dtype_name), m, out_sizes, args.repeats)
                print(
                    f"{dtype_name:8s} {name:23s} M={m:<5d} separate {separate * 1e6:9.1f}"
                    f" | fused {fused * 1e6:9.1f} | x{separate / fused:.2f}",
                    flush=True,
                )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.fused:
        return main_fused(args)
    print(f"torch {torch.__version__}, {args.threads} thread(s); GFLOP/s = 2*M*N*K / median seconds")
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for shape_name in args.shapes:
            n, k = SHAPES[shape_name]
            weight = torch.randn(n, k, dtype=dtype) / k**0.5
            for m in args.m:
                if shape_name.startswith("lm_head") and m > LM_HEAD_MAX_M:
                    continue
                x = torch.randn(m, k, dtype=dtype)
                ref = F.linear(x, weight).float()
                cells = []
                for name, fn in kernels(weight, m).items():
                    err = (fn(x).float() - ref).abs().max().item()
                    if err > (1e-3 if dtype == torch.float32 else 5e-2):
                        raise SystemExit(f"{name} {shape_name} M={m} {dtype_name}: max error {err}")
                    seconds = median_seconds(fn, x, args.repeats)
                    cells.append(f"{name} {2 * m * n * k / seconds / 1e9:7.1f}")
                print(f"{dtype_name:8s} {shape_name:19s} M={m:<5d} " + " | ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
