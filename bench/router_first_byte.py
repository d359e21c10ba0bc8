"""An engine's time to first byte for long prompts at load: what `--upstream-first-byte-timeout-seconds` bounds.

Starts `pagedinfer serve` (CPU; the embedded model, or `--model DIR`) and
sends `--concurrency` streamed completions at a time, `--requests` in all,
each a prompt of `--prompt-tokens` random token ids (no prefix-cache hits:
every prefill is whole). Per request it records the time to the response's
headers (the router's first byte: what the bound covers) and to the first
streamed chunk (the first token: prefill plus queueing, for comparison).

    OMP_NUM_THREADS=1 .venv/bin/python bench/router_first_byte.py
    OMP_NUM_THREADS=1 .venv/bin/python bench/router_first_byte.py --model DIR --prompt-tokens 960
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from pagedinfer.contracts.embedded_model import default_model_dir
from pagedinfer.testing.server_process import free_port, wait_process_healthy


async def one(client: httpx.AsyncClient, url: str, ids: list[int]) -> tuple[float, float]:
    """(seconds to the headers, seconds to the first chunk) of one streamed completion."""
    body = {"model": "m", "prompt": ids, "max_tokens": 16, "stream": True, "ignore_eos": True}
    start = time.perf_counter()
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        headers_s = time.perf_counter() - start
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                return headers_s, time.perf_counter() - start
    raise RuntimeError("the stream ended without a chunk")


async def load(url: str, vocab_size: int, prompt_tokens: int, concurrency: int, requests: int) -> list:
    rng = random.Random(0)
    gate = asyncio.Semaphore(concurrency)

    async def gated() -> tuple[float, float]:
        async with gate:
            return await one(client, url, [rng.randrange(3, vocab_size) for _ in range(prompt_tokens)])

    async with httpx.AsyncClient(timeout=600) as client:
        return await asyncio.gather(*(gated() for _ in range(requests)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a model directory (default: the embedded model)")
    p.add_argument("--max-model-len", type=int, default=None, help="default: the model's, at most 2048")
    p.add_argument("--prompt-tokens", type=int, default=None, help="default: max-model-len - 32")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--requests", type=int, default=24)
    args = p.parse_args()
    model = Path(args.model or default_model_dir())
    config = json.loads((model / "config.json").read_text())
    max_model_len = args.max_model_len or min(2048, config.get("max_position_embeddings", 2048))
    prompt_tokens = args.prompt_tokens or max_model_len - 32
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = Path(tempfile.mkdtemp()) / "engine.log"
    cmd = [
        str(Path(sys.executable).with_name("pagedinfer")),
        "serve",
        "--port",
        str(port),
        "--device",
        "cpu",
        "--max-model-len",
        str(max_model_len),
        "--served-model-name",
        "m",
    ]
    if args.model:
        cmd += ["--model", args.model]
    proc = subprocess.Popen(
        cmd,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
    )
    try:
        wait_process_healthy(url, proc, timeout_seconds=300, log_path=log)
        asyncio.run(load(url, config["vocab_size"], prompt_tokens, 1, 1))  # warm-up
        times = asyncio.run(load(url, config["vocab_size"], prompt_tokens, args.concurrency, args.requests))
    finally:
        proc.terminate()
        proc.wait(60)
    headers, first_chunk = sorted(t[0] for t in times), sorted(t[1] for t in times)
    print(
        f"model {model.name}: {args.requests} streams of {prompt_tokens} prompt tokens, {args.concurrency} at a"
        f" time, load average {os.getloadavg()[0]:.1f}"
    )
    for name, values in (("headers (first byte)", headers), ("first chunk (token)", first_chunk)):
        print(f"  {name}: p50 {values[len(values) // 2]:.3f} s, max {values[-1]:.3f} s")


if __name__ == "__main__":
    main()
