"""`pagedinfer serve --kv-events` on the tiny model as a child process, for tests that signal or kill it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def tiny_serve_args(model: Path | str, port: int, max_model_len: int = 1024, num_gpu_blocks: int = 96) -> list[str]:
    """`serve` and the flags every test's tiny server takes (after the executable: the console script, or a
    wrapper script that runs it): the model served as "tiny" on `port`, on the CPU, with a small fixed pool."""
    flags = {
        "--model": str(model),
        "--served-model-name": "tiny",
        "--port": str(port),
        "--device": "cpu",
        "--max-model-len": str(max_model_len),
        "--num-gpu-blocks-override": str(num_gpu_blocks),
    }
    return ["serve", *(word for flag in flags.items() for word in flag)]


def serve_process(
    model: Path, port: int, log: Path, host: str = "127.0.0.1", extra_args: tuple[str, ...] = ()
) -> subprocess.Popen:
    """The real console script, output appended to `log`; wait for it with server_process.wait_process_healthy.

    extra_args: more `serve` flags; one given here again wins over the default above."""
    cli = Path(sys.executable).with_name("pagedinfer")
    return subprocess.Popen(
        [
            str(cli),
            *tiny_serve_args(model, port),
            "--host",
            host,
            "--kv-events",
            "--kv-events-port",
            "0",
            *extra_args,
        ],
        stdout=log.open("a"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
