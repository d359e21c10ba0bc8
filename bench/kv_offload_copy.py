"""The host tier's copies, measured: device -> host (store) and host -> device (load) against a copy within the
device pool (copy-on-write's `copy_blocks`), in GB/s, through the engine's own `TierCopier`.

On CUDA the host pool is pinned and the tier's copies run on their own stream (engine/kv_offload/copies.py);
on a CPU both pools are host memory. The peer is the device copy in the same run.

    OMP_NUM_THREADS=1 .venv/bin/python -P bench/kv_offload_copy.py          # the CPU figure in docs/kv-offload.md
    python -P bench/kv_offload_copy.py --device cuda --layers 32 --num-blocks 2048   # a GPU (not run yet)
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import torch

from pagedinfer.engine.kv_offload.copies import TierCopier
from pagedinfer.engine.kv_offload.tier import LOAD, STORE
from pagedinfer.kernels import dispatch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn, repeats: int) -> float:
    """Median seconds of fn() over repeats, after one warm-up."""
    fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=256, help="blocks in each pool")
    p.add_argument("--copies", type=int, default=64, help="blocks moved per copy call (a step's)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    shape = (2, args.layers, args.num_blocks, args.block_size, args.kv_heads, args.head_dim)
    kv = torch.randn(shape, dtype=torch.float32, device=device).to(dtype)
    host = torch.empty(shape, dtype=dtype, device="cpu", pin_memory=device.type == "cuda")
    rng = random.Random(0)
    src, dst = rng.sample(range(args.num_blocks), args.copies), rng.sample(range(args.num_blocks), args.copies)
    pairs = tuple(zip(src, dst))
    copier = TierCopier(device)
    block_bytes = kv[:, :, 0].numel() * kv.element_size()
    moved = block_bytes * args.copies
    store = timed(device, lambda: copier.copy(STORE, kv, host, pairs), args.repeats)
    load = timed(device, lambda: copier.copy(LOAD, host, kv, pairs), args.repeats)
    disjoint = tuple((s, d) for s, d in zip(src, range(args.num_blocks)) if d not in src)[: args.copies // 2]
    mapping = torch.tensor(disjoint, dtype=torch.long, device=device).view(-1, 2)
    keys, values = [kv[0, i] for i in range(args.layers)], [kv[1, i] for i in range(args.layers)]
    device_copy = timed(device, lambda: dispatch.copy_blocks(keys, values, mapping), args.repeats)
    device_bytes = block_bytes * len(disjoint)
    print(
        f"{args.device}: {args.copies} blocks of {block_bytes / 2**20:.2f} MiB ({args.layers} layers,"
        f" {args.kv_heads} KV heads x {args.head_dim}, {args.dtype}) per call, medians of {args.repeats}"
    )
    for name, seconds, num_bytes in (
        ("store (device -> host)", store, moved),
        ("load (host -> device)", load, moved),
        ("device copy (peer)", device_copy, device_bytes),
    ):
        print(
            f"  {name:<24}{num_bytes / seconds / 1e9:>8.2f} GB/s  {seconds / (num_bytes / block_bytes) * 1e3:.3f}"
            " ms per block"
        )
    print(f"  load / device copy bandwidth: {(moved / load) / (device_bytes / device_copy):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
