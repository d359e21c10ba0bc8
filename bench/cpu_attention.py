"""CPU paged attention per layer: the torch path and each native kernel, same run.

    cd /tmp && OMP_NUM_THREADS=1 /path/to/.venv/bin/python /path/to/bench/cpu_attention.py \
        [--repeats 7] [--baseline REV]

Shapes of the issue's 125M model (12 query heads, 4 KV heads, head_dim 64): a
decode step of 8 sequences (K/V in the L3 cache) and of 64 sequences (not)
with 512 tokens of context each at block size 16, the 64 at 32 too, a
512-token prefill chunk after 1536 cached tokens, and a fresh 2048-token
prefill, in float32 and bfloat16. Every path reads the same paged cache
(shuffled blocks, NaN in every unowned slot): the torch fallback
(`kernels/cpu/torch_attention.py`) and the native library under each kernel
this CPU can run (`ops.attention_isa`: portable, avx2, avx512, avx512_bf16),
and, with `--baseline REV`, the single-file native kernel of git revision REV
(e.g. `main` before issue 16's second round), built as that revision built it
(`-O3 -march=native`, `at::vec` at the machine's capability) under its own
extension and op namespace. The paths run in turn at every repeat, so a
change of the machine's load hits them all. Prints medians of `--repeats` per
case, in thread CPU time (`time.thread_time`: one intra-op thread, so the op
runs in the calling thread; a shared, loaded machine inflates wall time, not
this), and the baseline's (else the portable kernel's) time over the fastest
kernel's.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

HEADS, KV_HEADS, HEAD_DIM = 12, 4, 64
# name -> (seq_lens, query_lens, block_size)
CASES = {
    "decode 8 x ctx 512 bs16": ([512] * 8, [1] * 8, 16),  # its K/V (4 MB in bf16) fit in the L3 cache
    "decode 64 x ctx 512 bs16": ([512] * 64, [1] * 64, 16),
    "decode 64 x ctx 512 bs32": ([512] * 64, [1] * 64, 32),
    "prefill 512 after 1536": ([2048], [512], 16),
    "prefill 2048": ([2048], [2048], 16),
}
REPO = Path(__file__).resolve().parent.parent
BASELINE_NAMESPACE = "pagedinfer_baseline"
_baseline_library = None  # the torch.library.Library holding the baseline's schemas, kept alive


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per case (default 7)")
    parser.add_argument("--baseline", metavar="REV",
                        help="also time the single-file native kernel of this git revision")
    return parser.parse_args()


def median_ms(fns: list, repeats: int) -> list[float]:
    """Median thread CPU ms of each fn, the fns run in turn at every repeat (a load change hits them all)."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, spent in zip(fns, times):
            began = time.thread_time()
            fn()
            spent.append(time.thread_time() - began)
    return [1e3 * statistics.median(spent) for spent in times]


def at_level(ops, level: str, fn):
    """fn run with the native kernel of `level` forced."""
    def run():
        ops.attention_isa(level)
        return fn()
    return run


def load_baseline(rev: str):
    """Build REV's kernels/cpu/csrc/paged_attention.cpp as REV did; returns its attention op."""
    global _baseline_library
    import torch
    from torch.utils import cpp_extension

    shown = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:kernels/cpu/csrc/paged_attention.cpp"],
                           capture_output=True, text=True)
    if shown.returncode != 0:
        raise SystemExit(f"--baseline {rev}: {shown.stderr.strip()}")
    if '#include "' in shown.stdout:
        raise SystemExit(f"--baseline {rev}: its kernel spans several files; give a revision whose "
                         "paged_attention.cpp stands alone")
    source = shown.stdout.replace("TORCH_LIBRARY_IMPL(pagedinfer,", f"TORCH_LIBRARY_IMPL({BASELINE_NAMESPACE},")
    _baseline_library = torch.library.Library(BASELINE_NAMESPACE, "DEF")
    _baseline_library.define("cpu_paged_attention(Tensor query, Tensor key_cache, Tensor value_cache, "
                             "Tensor block_tables, Tensor seq_lens, Tensor query_start_loc, float scale, "
                             "int? sliding_window) -> Tensor")
    _baseline_library.define("cpu_write_kv(Tensor key, Tensor value, Tensor(a!) key_cache, "
                             "Tensor(b!) value_cache, Tensor slot_mapping) -> ()")
    capability = torch.backends.cpu.get_cpu_capability()
    flags = (["-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"] if capability.startswith("AVX512") else
             ["-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"] if capability == "AVX2" else [])
    path = Path(tempfile.mkdtemp(prefix="pagedinfer-baseline-")) / "paged_attention.cpp"
    path.write_text(source)
    cpp_extension.load(name="pagedinfer_cpu_kernels_baseline", sources=[str(path)],
                       extra_cflags=["-O3", "-march=native", *flags], is_python_module=False, verbose=False)
    return getattr(torch.ops, BASELINE_NAMESPACE).cpu_paged_attention


def main() -> None:
    args = parse_args()
    import torch

    from pagedinfer.kernels import reference
    from pagedinfer.kernels.cpu import ops, torch_attention
    from pagedinfer.kernels.problems import make_problem

    if not ops.native_available():
        raise SystemExit("the native CPU kernels could not be built (see the warning above)")
    baseline = load_baseline(args.baseline) if args.baseline else None
    torch.set_num_threads(1)
    best = ops.attention_isa("auto")
    order = ("portable", "avx2", "avx512", "avx512_bf16")
    levels = list(order[:order.index(best) + 1])
    print(f"threads {torch.get_num_threads()}, native kernels on this CPU: {', '.join(levels)}"
          + (f", baseline {args.baseline}" if baseline else ""))
    columns = ["torch", *([f"base {args.baseline}"] if baseline else []), *levels]
    print(f"{'case':<26} {'dtype':<9}" + "".join(f" {c[:14]:>14}" for c in columns) + f" {'speed-up':>9}  (ms)")
    try:
        for name, (seq_lens, query_lens, block_size) in CASES.items():
            for dtype in (torch.float32, torch.bfloat16):
                p = make_problem(seq_lens, query_lens, HEADS, KV_HEADS, HEAD_DIM, block_size, dtype=dtype)
                call = (p.query, p.key_cache, p.value_cache, p.metadata, p.scale)
                m = p.metadata
                fns = [lambda: torch_attention.paged_attention(*call)]
                if baseline:
                    fns.append(lambda: baseline(p.query, p.key_cache, p.value_cache, m.block_tables, m.seq_lens,
                                                m.query_start_loc, p.scale, None))
                fns += [at_level(ops, level, lambda: ops.paged_attention(*call)) for level in levels]
                times = median_ms(fns, args.repeats)
                before = times[1] if baseline else times[-len(levels)]
                print(f"{name:<26} {str(dtype)[6:]:<9}" + "".join(f" {t:>14.3f}" for t in times)
                      + f" {before / min(times[-len(levels):]):>8.2f}x", flush=True)
    finally:
        ops.attention_isa("auto")
    key = torch.randn(64, KV_HEADS, HEAD_DIM)
    p = make_problem([512] * 64, [1] * 64, HEADS, KV_HEADS, HEAD_DIM, 16)
    kc, vc = p.key_cache.clone(), p.value_cache.clone()
    torch_ms, native_ms = median_ms([lambda: reference.write_kv(key, key, kc, vc, p.metadata.slot_mapping),
                                     lambda: ops.write_kv(key, key, kc, vc, p.metadata.slot_mapping)], args.repeats)
    print(f"write_kv of a 64-sequence decode step, float32: torch {torch_ms:.3f} ms, native {native_ms:.3f} ms")


if __name__ == "__main__":
    main()
