"""`pagedinfer serve --kv-events` on the tiny model as a child process, for tests that signal or kill it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def serve_process(
    model: Path, port: int, log: Path, host: str = "127.0.0.1", extra_args: tuple[str, ...] = ()
) -> subprocess.Popen:
    """The real console script, output appended to `log`; wait for it with server_process.wait_process_healthy.

    extra_args: more `serve` flags; one given here again wins over the default above."""
    cli = Path(sys.executable).with_name("pagedinfer")
    return subprocess.Popen(
        [
            str(cli),
            "serve",
            "--model",
            str(model),
            "--served-model-name",
            "tiny",
            "--host",
            host,
            "--port",
            str(port),
            "--device",
            "cpu",
            "--max-model-len",
            "1024",
            "--num-gpu-blocks-override",
            "96",
            "--kv-events",
            "--kv-events-port",
            "0",
            *extra_args,
        ],
        stdout=log.open("a"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
