"""CPU paged attention per layer: the torch path and each native kernel, same run.

    cd /tmp && OMP_NUM_THREADS=1 /path/to/.venv/bin/python /path/to/bench/cpu_attention.py \
        [--repeats 7] [--baseline REV] [--vllm-python /work/vllm-venv/bin/python] [--only SUBSTRING]

Shapes of the issue's 125M model (12 query heads, 4 KV heads, head_dim 64): a
decode step of 8 sequences (K/V in the L3 cache) and of 64 sequences (not)
with 512 tokens of context each at block size 16, the 64 at 32 too, a
512-token prefill chunk after 1536 cached tokens, and a fresh 2048-token
prefill; and of the tiny bench model (8 query heads, 4 KV heads, head_dim 32):
the throughput bench's decode mix (48 sequences, contexts 200-400 mixed) at
block size 16 and 32 and a 256-token prefill; each in float32 and bfloat16.
Every path reads the same paged cache
(shuffled blocks, NaN in every unowned slot): the torch fallback
(`kernels/cpu/torch_attention.py`) and the native library under each kernel
this CPU can run (`ops.attention_isa`: portable, avx2, avx512, avx512_bf16),
and, with `--baseline REV`, the native attention kernel of git revision REV
(e.g. `main`), built as that revision built it (a single-file kernel, before
issue 16's second round: `-O3 -march=native`; a multi-file one: `-O3`, its
level chosen at run time, its C++ namespace renamed) under its own extension
and op namespace. The paths run in turn at every repeat, so a
change of the machine's load hits them all. Prints medians of `--repeats` per
case, in thread CPU time (`time.thread_time`: one intra-op thread, so the op
runs in the calling thread; a shared, loaded machine inflates wall time, not
this), and the baseline's (else the portable kernel's) time over the fastest
kernel's, and the GB/s of K/V the fastest kernel reads (against the one-thread
copy bandwidth printed first: a torch copy of 256 MB, read + written bytes).

With `--vllm-python PATH` (a vLLM-CPU venv's python), vLLM's own CPU paged
attention (`torch.ops._C.cpu_attention_with_kv_cache`, the op its CPU_ATTN
backend calls, with the scheduler metadata it builds once per step) runs in a
subprocess of that python on the same cases: the same query, K and V (passed
in a file), written by its own `cpu_attn_reshape_and_cache` into its own
layout (head-major blocks, K transposed in each block) at the case's block
size (vLLM picks its `vec16` kernel for block size 16, `vec` for 32). Its
output is checked against the reference, and its median thread CPU time is
printed next to our fastest kernel's, with the ratio vLLM / ours (> 1: ours
is faster). The two processes time in turn, not interleaved.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Case:
    seq_lens: list[int]
    query_lens: list[int]
    block_size: int
    heads: int
    kv_heads: int
    head_dim: int


def _m125(seq_lens, query_lens, block_size):
    return Case(seq_lens, query_lens, block_size, 12, 4, 64)


def _tiny(seq_lens, query_lens, block_size):
    return Case(seq_lens, query_lens, block_size, 8, 4, 32)


TINY_DECODE_CONTEXTS = [200 + (i * 83) % 201 for i in range(48)]  # 48 contexts spread over 200-400
# bench/throughput.py's tiny run (192 requests): a step decodes ~120 sequences of 150-450 keys
TINY_STEP_CONTEXTS = [150 + (i * 97) % 301 for i in range(120)]
CASES = {
    "125m decode 8x512 bs16": _m125([512] * 8, [1] * 8, 16),  # its K/V (4 MB in bf16) fit in the L3 cache
    "125m decode 64x512 bs16": _m125([512] * 64, [1] * 64, 16),
    "125m decode 64x512 bs32": _m125([512] * 64, [1] * 64, 32),
    "125m prefill 512 af 1536": _m125([2048], [512], 16),
    "125m prefill 2048": _m125([2048], [2048], 16),
    "tiny decode 48x200-400 bs16": _tiny(TINY_DECODE_CONTEXTS, [1] * 48, 16),
    "tiny decode 48x200-400 bs32": _tiny(TINY_DECODE_CONTEXTS, [1] * 48, 32),
    "tiny decode 120x150-450 bs16": _tiny(TINY_STEP_CONTEXTS, [1] * 120, 16),
    "tiny prefill 256": _tiny([256], [256], 16),
}
REPO = Path(__file__).resolve().parent.parent
BASELINE_NAMESPACE = "pagedinfer_baseline"
_baseline_library = None  # the torch.library.Library holding the baseline's schemas, kept alive


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per case (default 7)")
    parser.add_argument(
        "--baseline", metavar="REV", help="also time the single-file native kernel of this git revision"
    )
    parser.add_argument(
        "--vllm-python",
        metavar="PATH",
        help="a vLLM-CPU venv's python: also time vLLM's CPU paged attention on the same cases",
    )
    parser.add_argument("--only", metavar="SUBSTRING", default="", help="run only the cases whose name contains this")
    parser.add_argument(
        "--vllm-only",
        action="store_true",
        help="with --vllm-python: only the comparison with vLLM (and the baseline), not every kernel",
    )
    parser.add_argument("--vllm-child", metavar="FILE", help=argparse.SUPPRESS)  # the subprocess's side
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


# the attention's translation units of a multi-file kernel (issue 16's second round on), baseline x86-64
# ones first as kernels/cpu/build.py links them; headers are copied beside them
BASELINE_SOURCES = (
    "paged_attention.cpp",
    "isa.cpp",
    "attention_vec_default.cpp",
    "attention_avx512.cpp",
    "attention_vec_avx2.cpp",
    "attention_vec_avx512.cpp",
)


def git_show(rev: str, path: str) -> str:
    shown = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{path}"], capture_output=True, text=True)
    if shown.returncode != 0:
        raise SystemExit(f"--baseline {rev}: {shown.stderr.strip()}")
    return shown.stdout


def load_baseline(rev: str):
    """Build REV's attention kernel as REV did, under its own op namespace; returns its attention op.

    A single-file kernel (before issue 16's second round) is built `-O3 -march=native`; a multi-file
    one as kernels/cpu/build.py builds it (`-O3`, baseline x86-64, ISA chosen at run time), its C++
    namespace renamed by a macro so that its symbols never meet the current library's.
    """
    global _baseline_library
    import torch
    from torch.utils import cpp_extension

    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"], capture_output=True, text=True
    )
    if commit.returncode != 0:
        raise SystemExit(f"--baseline {rev}: {commit.stderr.strip()}")
    folder = Path(tempfile.gettempdir()) / f"pagedinfer-baseline-{commit.stdout.strip()[:12]}"  # rebuilt only if new
    folder.mkdir(exist_ok=True)
    main_source = git_show(rev, "kernels/cpu/csrc/paged_attention.cpp")
    rename = {
        "TORCH_LIBRARY_IMPL(pagedinfer,": f"TORCH_LIBRARY_IMPL({BASELINE_NAMESPACE},",
        "TORCH_LIBRARY_FRAGMENT(pagedinfer,": f"TORCH_LIBRARY_FRAGMENT({BASELINE_NAMESPACE},",
    }
    single_file = '#include "' not in main_source
    if single_file:
        names = ["paged_attention.cpp"]
        capability = torch.backends.cpu.get_cpu_capability()
        flags = [
            "-O3",
            "-march=native",
            *(
                ["-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"]
                if capability.startswith("AVX512")
                else ["-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"]
                if capability == "AVX2"
                else []
            ),
        ]
    else:
        listed = subprocess.run(
            ["git", "-C", str(REPO), "ls-tree", "--name-only", rev, "kernels/cpu/csrc/"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        headers = [Path(path).name for path in listed if path.endswith(".h")]
        names = [*BASELINE_SOURCES, *headers]
        flags = ["-O3", f"-Dpagedinfer_cpu={BASELINE_NAMESPACE}_cpu"]
    for name in names:
        text = git_show(rev, f"kernels/cpu/csrc/{name}")
        for old, new in rename.items():
            text = text.replace(old, new)
        (folder / name).write_text(text)
    _baseline_library = torch.library.Library(BASELINE_NAMESPACE, "DEF")
    _baseline_library.define(
        "cpu_paged_attention(Tensor query, Tensor key_cache, Tensor value_cache, "
        "Tensor block_tables, Tensor seq_lens, Tensor query_start_loc, float scale, "
        "int? sliding_window) -> Tensor"
    )
    _baseline_library.define(
        "cpu_write_kv(Tensor key, Tensor value, Tensor(a!) key_cache, "
        "Tensor(b!) value_cache, Tensor slot_mapping) -> ()"
    )
    sources = [str(folder / name) for name in names if name.endswith(".cpp")]
    cpp_extension.load(
        name=f"pagedinfer_cpu_kernels_baseline_{len(sources)}",
        sources=sources,
        extra_cflags=flags,
        build_directory=str(folder),
        is_python_module=False,
        verbose=False,
    )
    return getattr(torch.ops, BASELINE_NAMESPACE).cpu_paged_attention


def copy_bandwidth_gbs(megabytes: int = 256, repeats: int = 5) -> float:
    """One thread's memory bandwidth: a torch copy of `megabytes`, (read + written bytes) / median time."""
    import torch

    src = torch.ones(megabytes * 2**20 // 4)
    dst = torch.empty_like(src)
    seconds = median_ms([lambda: dst.copy_(src)], repeats)[0] / 1e3
    return 2 * src.numel() * 4 / seconds / 1e9


def kv_bytes(case: Case, dtype) -> int:
    """The K and V bytes a step of `case` reads (every key of every sequence, every KV head, once)."""
    return 2 * sum(case.seq_lens) * case.kv_heads * case.head_dim * dtype.itemsize


def vllm_child(path: str) -> None:
    """The subprocess's side, in vLLM's venv: serve timings of its CPU attention on the runs in `path`.

    Writes "ready", then answers each line "<run index> <what>" from stdin (what: "attend", its
    attention op; "metadata", its per-step scheduler metadata; "write", its KV write of a decode
    step's token per sequence) with the thread CPU ms of one call; on "quit" saves each run's
    output and ISA beside `path`.
    """
    import torch
    import vllm._custom_ops as vops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    torch.set_num_threads(1)
    job = torch.load(path)
    calls, results = [], {}
    for run in job["runs"]:
        seq_lens, query_lens, bs, dtype = run["seq_lens"], run["query_lens"], run["block_size"], run["dtype"]
        kv_heads, head_dim = run["kv_heads"], run["head_dim"]
        generator = torch.Generator().manual_seed(0)
        needed = [-(-n // bs) for n in seq_lens]
        num_blocks = sum(needed) + 3
        pool = torch.randperm(num_blocks, generator=generator).tolist()
        width = max(needed)
        tables, slots, used = [], [], 0
        for seq_len, count in zip(seq_lens, needed):
            table = pool[used : used + count]
            used += count
            tables.append(table + [0] * (width - count))
            slots += [table[pos // bs] * bs + pos % bs for pos in range(seq_len)]
        kv_cache = torch.zeros(num_blocks, kv_heads, bs, 2 * head_dim, dtype=dtype)
        key_cache, value_cache = kv_cache.view(num_blocks, kv_heads, 2 * bs, head_dim).chunk(2, dim=2)
        isa = _get_attn_isa(dtype, bs, head_dim)
        slot_mapping = torch.tensor(slots, dtype=torch.int64)
        vops.cpu_attn_reshape_and_cache(run["keys"], run["values"], key_cache, value_cache, slot_mapping, isa)
        block_table = torch.tensor(tables, dtype=torch.int32)
        lens = torch.tensor(seq_lens, dtype=torch.int32)
        starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
        query = run["query"]
        out = torch.empty_like(query)
        last = [sum(seq_lens[: i + 1]) - 1 for i in range(len(seq_lens))]  # each sequence's newest token

        def metadata(
            lens=lens, starts=starts, query=query, isa=isa, dtype=dtype, n=len(seq_lens), kvh=kv_heads, hd=head_dim
        ):
            return vops.cpu_attn_get_scheduler_metadata(
                num_reqs=n,
                num_heads=query.shape[1],
                num_kv_heads=kvh,
                head_dim=hd,
                seq_lens=lens,
                dtype=dtype,
                query_start_loc=starts,
                causal=True,
                sliding_window_size=-1,
                isa=isa,
                enable_kv_split=True,
            )

        def attend(
            query=query,
            key_cache=key_cache,
            value_cache=value_cache,
            out=out,
            starts=starts,
            lens=lens,
            scale=run["scale"],
            block_table=block_table,
            scheduler_metadata=metadata(),
        ):
            vops.cpu_attention_with_kv_cache(
                query=query,
                key_cache=key_cache,
                value_cache=value_cache,
                output=out,
                query_start_loc=starts,
                seq_lens=lens,
                scale=scale,
                causal=True,
                alibi_slopes=None,
                sliding_window=-1,
                block_table=block_table,
                softcap=0.0,
                scheduler_metadata=scheduler_metadata,
                s_aux=None,
            )

        def write(
            keys=run["keys"][last],
            values=run["values"][last],
            key_cache=key_cache,
            value_cache=value_cache,
            step_slots=slot_mapping[last],
            isa=isa,
        ):
            vops.cpu_attn_reshape_and_cache(keys, values, key_cache, value_cache, step_slots, isa)

        calls.append({"attend": attend, "metadata": metadata, "write": write})
        attend()
        results[run["key"]] = {"isa": isa, "out": out}
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        index, what = line.split()
        began = time.thread_time()
        calls[int(index)][what]()
        print(1e3 * (time.thread_time() - began), flush=True)
    torch.save(results, path + ".out")


class VllmChild:
    """vLLM's attention in a subprocess of its venv's python (see `vllm_child`), timed one call at a time."""

    def __init__(self, python: str, runs: list[dict], folder: str):
        import torch

        self.path = os.path.join(folder, "job.pt")
        torch.save({"runs": runs}, self.path)
        self.process = subprocess.Popen(
            [python, str(Path(__file__).resolve()), "--vllm-child", self.path],
            cwd=folder,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        if self.process.stdout.readline().strip() != "ready":
            raise SystemExit(f"--vllm-python {python}: the vLLM subprocess failed (its error is above)")

    def time_ms(self, index: int, what: str) -> float:
        self.process.stdin.write(f"{index} {what}\n")
        self.process.stdin.flush()
        return float(self.process.stdout.readline())

    def finish(self) -> dict:
        """Each run's output and ISA."""
        import torch

        self.process.stdin.write("quit\n")
        self.process.stdin.flush()
        if self.process.wait(timeout=300) != 0:
            raise SystemExit("the vLLM subprocess failed (its error is above)")
        return torch.load(self.path + ".out")


def compare_with_vllm(python: str, cases: dict, repeats: int, baseline=None, baseline_name: str = "") -> None:
    """Our kernel (the best this CPU runs), the baseline's if given, and vLLM's, timed in turn at every repeat."""
    import torch

    from pagedinfer.kernels import reference
    from pagedinfer.kernels.cpu import ops
    from pagedinfer.kernels.problems import gather_sequence, make_problem

    keys = [(name, dtype) for name in cases for dtype in (torch.float32, torch.bfloat16)]
    runs = []
    for name, dtype in keys:
        case = cases[name]
        p = make_problem(
            case.seq_lens, case.query_lens, case.heads, case.kv_heads, case.head_dim, case.block_size, dtype=dtype
        )
        gathered = [
            (gather_sequence(p.key_cache, t, n), gather_sequence(p.value_cache, t, n))
            for t, n in zip(p.block_tables, case.seq_lens)
        ]
        runs.append(
            {
                "key": f"{name} {str(dtype)[6:]}",
                "dtype": dtype,
                "seq_lens": case.seq_lens,
                "query_lens": case.query_lens,
                "block_size": case.block_size,
                "kv_heads": case.kv_heads,
                "head_dim": case.head_dim,
                "scale": p.scale,
                "query": p.query,
                "keys": torch.cat([k for k, _ in gathered]),
                "values": torch.cat([v for _, v in gathered]),
            }
        )
    with tempfile.TemporaryDirectory(prefix="pagedinfer-vllm-attn-") as folder:
        child = VllmChild(python, runs, folder)
        print(
            "\nours (the best kernel here) vs vLLM-CPU's cpu_attention_with_kv_cache, timed in turn at every "
            "repeat (thread CPU ms, medians; vllm/ours > 1: ours faster)"
        )
        print(
            f"{'case':<28} {'dtype':<9}"
            + (f" {baseline_name[:8]:>8}" if baseline else "")
            + f" {'ours':>8} {'vllm':>8} {'vllm/ours':>9} {'vllm isa':>8} {'ours err':>8}"
            f" {'vllm err':>8} {'sched md':>8} {'our write':>9} {'vllm write':>10}"
        )
        try:
            for index, (name, dtype) in enumerate(keys):
                case = cases[name]
                p = make_problem(
                    case.seq_lens,
                    case.query_lens,
                    case.heads,
                    case.kv_heads,
                    case.head_dim,
                    case.block_size,
                    dtype=dtype,
                )
                call = (p.query, p.key_cache, p.value_cache, p.metadata, p.scale)
                decode = all(n == 1 for n in case.query_lens)
                step_key = torch.randn(len(case.seq_lens), case.kv_heads, case.head_dim).to(dtype)
                kc, vc = p.key_cache.clone(), p.value_cache.clone()
                ours_out = ops.paged_attention(*call)
                ours, vllm, metadata, our_write, vllm_write, base = [], [], [], [], [], []
                m = p.metadata
                for _ in range(repeats + 1):  # the first round warms up, untimed
                    if baseline:
                        began = time.thread_time()
                        baseline(
                            p.query,
                            p.key_cache,
                            p.value_cache,
                            m.block_tables,
                            m.seq_lens,
                            m.query_start_loc,
                            p.scale,
                            None,
                        )
                        base.append(1e3 * (time.thread_time() - began))
                    began = time.thread_time()
                    ops.paged_attention(*call)
                    ours.append(1e3 * (time.thread_time() - began))
                    vllm.append(child.time_ms(index, "attend"))
                    metadata.append(child.time_ms(index, "metadata"))
                    if decode:
                        began = time.thread_time()
                        ops.write_kv(step_key, step_key, kc, vc, p.metadata.slot_mapping)
                        our_write.append(1e3 * (time.thread_time() - began))
                        vllm_write.append(child.time_ms(index, "write"))
                expected = reference.paged_attention(*call).float()
                runs[index]["expected"], runs[index]["ours"] = expected, statistics.median(ours[1:])
                runs[index]["base"] = statistics.median(base[1:]) if baseline else None
                runs[index]["ours_err"] = (ours_out.float() - expected).abs().max().item()
                runs[index]["vllm"], runs[index]["metadata"] = (
                    statistics.median(vllm[1:]),
                    statistics.median(metadata[1:]),
                )
                runs[index]["writes"] = (
                    (statistics.median(our_write[1:]), statistics.median(vllm_write[1:])) if decode else None
                )
        finally:
            results = child.finish()
        for run in runs:
            got = results[run["key"]]
            err = (got["out"].float() - run["expected"]).abs().max().item()
            name, dtype = run["key"].rsplit(" ", 1)
            writes = f"{run['writes'][0]:>9.3f} {run['writes'][1]:>10.3f}" if run["writes"] else ""
            print(
                f"{name:<28} {dtype:<9}"
                + (f" {run['base']:>8.3f}" if baseline else "")
                + f" {run['ours']:>8.3f} {run['vllm']:>8.3f} {run['vllm'] / run['ours']:>8.2f}x"
                f" {got['isa']:>8} {run['ours_err']:>8.1e} {err:>8.1e} {run['metadata']:>8.3f} {writes}",
                flush=True,
            )


def main() -> None:
    args = parse_args()
    if args.vllm_child:
        vllm_child(args.vllm_child)
        return
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
    levels = list(order[: order.index(best) + 1])
    print(
        f"threads {torch.get_num_threads()}, native kernels on this CPU: {', '.join(levels)}"
        + (f", baseline {args.baseline}" if baseline else "")
    )
    print(f"one-thread copy bandwidth (torch copy of 256 MB, read + written bytes): {copy_bandwidth_gbs():.1f} GB/s")
    columns = ["torch", *([f"base {args.baseline}"] if baseline else []), *levels]
    if not args.vllm_only:
        print(
            f"{'case':<28} {'dtype':<9}"
            + "".join(f" {c[:12]:>12}" for c in columns)
            + f" {'speed-up':>9} {'GB/s':>6}  (ms)"
        )
    try:
        for name, case in CASES.items():
            if args.only not in name or args.vllm_only:
                continue
            for dtype in (torch.float32, torch.bfloat16):
                p = make_problem(
                    case.seq_lens,
                    case.query_lens,
                    case.heads,
                    case.kv_heads,
                    case.head_dim,
                    case.block_size,
                    dtype=dtype,
                )
                call = (p.query, p.key_cache, p.value_cache, p.metadata, p.scale)
                m = p.metadata
                fns = [lambda: torch_attention.paged_attention(*call)]
                if baseline:
                    fns.append(
                        lambda: baseline(
                            p.query,
                            p.key_cache,
                            p.value_cache,
                            m.block_tables,
                            m.seq_lens,
                            m.query_start_loc,
                            p.scale,
                            None,
                        )
                    )
                fns += [at_level(ops, level, lambda: ops.paged_attention(*call)) for level in levels]
                times = median_ms(fns, args.repeats)
                before = times[1] if baseline else times[-len(levels)]
                fastest = min(times[-len(levels) :])
                print(
                    f"{name:<28} {str(dtype)[6:]:<9}"
                    + "".join(f" {t:>12.3f}" for t in times)
                    + f" {before / fastest:>8.2f}x {kv_bytes(case, dtype) / fastest / 1e6:>6.1f}",
                    flush=True,
                )
    finally:
        ops.attention_isa("auto")
    key = torch.randn(64, 4, 64)
    p = make_problem([512] * 64, [1] * 64, 12, 4, 64, 16)
    kc, vc = p.key_cache.clone(), p.value_cache.clone()
    torch_ms, native_ms = median_ms(
        [
            lambda: reference.write_kv(key, key, kc, vc, p.metadata.slot_mapping),
            lambda: ops.write_kv(key, key, kc, vc, p.metadata.slot_mapping),
        ],
        args.repeats,
    )
    print(
        f"write_kv of a 64-sequence decode step (125m shapes), float32: torch {torch_ms:.3f} ms, "
        f"native {native_ms:.3f} ms"
    )
    if args.vllm_python:
        compare_with_vllm(
            args.vllm_python,
            {name: case for name, case in CASES.items() if args.only in name},
            args.repeats,
            baseline,
            args.baseline or "",
        )


if __name__ == "__main__":
    main()
