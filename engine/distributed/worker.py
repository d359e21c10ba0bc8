"""Rank r > 0 of a tensor-parallel replica: `python -P -m pagedinfer.engine.distributed.worker ...`.

Started by rank 0 (`workers.py`). It connects to rank 0's store, says
`rank<r>/started`, reads the pickled EngineConfig at `config`, joins the
replica's groups, loads its shard, reports `rank<r>/ready`, then
repeats: receive rank 0's message, run it (allocate the KV pool, or one
step's block moves and forward), until STOP. Any exception is written to
`rank<r>/error` and ends the process with code 1. A watchdog thread ends it
as soon as its parent (rank 0) is gone, whatever killed the parent.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import threading
import time
import traceback

_PARENT_POLL_SECONDS = 0.2


def _watch_parent(parent_pid: int) -> None:
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(_PARENT_POLL_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="pagedinfer-tp-parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pagedinfer-tp-worker")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--store-port", type=int, required=True)
    p.add_argument("--parent-pid", type=int, required=True)
    p.add_argument("--num-threads", type=int, required=True)
    args = p.parse_args(argv)
    _watch_parent(args.parent_pid)

    import torch

    from pagedinfer.engine.distributed import step_message
    from pagedinfer.engine.distributed.channel import StepChannel
    from pagedinfer.engine.distributed.group import TPGroup, connect_store
    from pagedinfer.engine.runner.loading import tp_device
    from pagedinfer.engine.runner.model_runner import ModelRunner

    torch.set_num_threads(args.num_threads)
    store = connect_store(args.store_port, args.world_size)
    try:
        store.set(f"rank{args.rank}/started", b"")
        config = pickle.loads(store.get("config"))
        group = TPGroup.join(store, args.rank, args.world_size, tp_device(config, args.rank))
        runner = ModelRunner(config, group)
        store.set(
            f"rank{args.rank}/ready",
            json.dumps(
                {
                    "weight_bytes": runner.weight_bytes,
                    "sharded_weight_bytes": runner.sharded_weight_bytes,
                    "num_packed_linears": len(runner.linear_packing.packed) if runner.linear_packing else 0,
                }
            ),
        )
        channel = StepChannel(group, step_message.capacity_words(config.max_num_batched_tokens, config.max_num_seqs))
        while True:
            message = channel.recv()
            if message.kind == step_message.STOP:
                return 0
            if message.kind == step_message.ALLOCATE:
                runner.allocate_kv_cache(message.num_gpu_blocks, message.num_cpu_blocks)
            else:
                runner.run_step(message.step)
    except BaseException as exc:  # noqa: BLE001 - reported to rank 0 through the store
        traceback.print_exc()
        try:
            store.set(f"rank{args.rank}/error", f"{type(exc).__name__}: {exc}")
        except Exception:  # noqa: BLE001 - rank 0 (the store) is gone: nobody to tell
            pass
        sys.stderr.flush()
        os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
