"""CPU paged attention: the native kernel vs the vectorised torch path, one layer, same run.

    cd /tmp && OMP_NUM_THREADS=1 /path/to/.venv/bin/python /path/to/bench/cpu_attention.py [--repeats 7]

Shapes of the issue's 125M model (12 query heads, 4 KV heads, head_dim 64,
block size 16): a decode step of 64 sequences with 512 tokens of context
each, and a 2048-token prefill, in float32 and bfloat16. Both paths read the
same paged cache (shuffled blocks, NaN in every unowned slot) through
`pagedinfer.kernels.cpu.ops.paged_attention` (native) and
`pagedinfer.kernels.cpu.torch_attention.paged_attention` (the fallback); the
write of the step's K/V (`ops.write_kv` vs `reference.write_kv`) is timed
apart. Prints medians of `--repeats` per case and the torch/native ratio, in
thread CPU time (`time.thread_time`: one intra-op thread, so the op runs in
the calling thread; a shared, loaded machine inflates wall time, not this).
The native library is built (or loaded from the cache) before timing.
"""

from __future__ import annotations

import argparse
import statistics
import time

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 12, 4, 64, 16
CASES = {"decode 64 x ctx 512": ([512] * 64, [1] * 64), "prefill 2048": ([2048], [2048])}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per case (default 7)")
    return parser.parse_args()


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        began = time.thread_time()
        fn()
        times.append(time.thread_time() - began)
    return 1e3 * statistics.median(times)


def main() -> None:
    args = parse_args()
    import torch

    from pagedinfer.kernels import reference
    from pagedinfer.kernels.cpu import ops, torch_attention
    from pagedinfer.kernels.problems import make_problem

    if not ops.native_available():
        raise SystemExit("the native CPU kernels could not be built (see the warning above)")
    torch.set_num_threads(1)
    print(f"threads {torch.get_num_threads()}, at::vec capability {torch.backends.cpu.get_cpu_capability()}")
    print(f"{'case':<22} {'dtype':<9} {'op':<10} {'torch ms':>9} {'native ms':>10} {'ratio':>6}")
    for name, (seq_lens, query_lens) in CASES.items():
        for dtype in (torch.float32, torch.bfloat16):
            p = make_problem(seq_lens, query_lens, HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, dtype=dtype)
            timings = {
                "attention": (
                    lambda: torch_attention.paged_attention(p.query, p.key_cache, p.value_cache, p.metadata, p.scale),
                    lambda: ops.paged_attention(p.query, p.key_cache, p.value_cache, p.metadata, p.scale)),
            }
            key = torch.randn(p.metadata.num_tokens, KV_HEADS, HEAD_DIM).to(dtype)
            kc, vc = p.key_cache.clone(), p.value_cache.clone()
            timings["write_kv"] = (lambda: reference.write_kv(key, key, kc, vc, p.metadata.slot_mapping),
                                   lambda: ops.write_kv(key, key, kc, vc, p.metadata.slot_mapping))
            for op, (torch_fn, native_fn) in timings.items():
                torch_ms, native_ms = median_ms(torch_fn, args.repeats), median_ms(native_fn, args.repeats)
                print(f"{name:<22} {str(dtype)[6:]:<9} {op:<10} {torch_ms:>9.3f} {native_ms:>10.3f} "
                      f"{torch_ms / native_ms:>5.1f}x", flush=True)


if __name__ == "__main__":
    main()
