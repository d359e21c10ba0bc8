"""`serve --kv-events`: real ZeroMQ subscribers read the engine's prefix-cache events.

The engine publishes vLLM's wire format; a consumer that knows only the HTTP
URL discovers the ports, computes the engine's block hashes from token ids,
replays missed batches and recovers from dropped ones with a snapshot.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import zmq
from engine_process import tiny_serve_args
from kv_feed_follow import follow_while
from serving_harness import start_server, stop_server

from pagedinfer.contracts.kv_events.events import BlockStored, decode_batch
from pagedinfer.contracts.kv_events.frames import HEARTBEAT_SEQ, seq_from_bytes
from pagedinfer.engine.kv_events.publisher import KVEventsConfig
from pagedinfer.router.hashing import prefix_block_hashes
from pagedinfer.router.kv_feed import KVFeed, replay
from pagedinfer.testing.server_process import free_port, wait_process_healthy

BLOCK = 16


def _complete(url: str, prompt: list[int], max_tokens: int = 2) -> None:
    r = httpx.post(
        url + "/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": max_tokens}, timeout=60
    )
    assert r.status_code == 200, r.text


def _receive(sub, until_hashes: set[bytes], timeout_seconds: float = 30.0) -> list:
    """(seq, batch) pairs until every hash in until_hashes was stored."""
    got, stored = [], set()
    deadline = time.monotonic() + timeout_seconds
    while not until_hashes <= stored:
        assert time.monotonic() < deadline, "the stored events never arrived"
        if sub.poll(200):
            topic, seq, payload = sub.recv_multipart()
            if seq_from_bytes(seq) == HEARTBEAT_SEQ:
                continue  # heartbeats interleave (tests/router/test_feed_sync.py reads them)
            batch = decode_batch(seq_from_bytes(seq), payload)
            got.append(batch)
            for e in batch.events:
                if isinstance(e, BlockStored):
                    stored.update(e.block_hashes)
    return got


@pytest.mark.slow
def test_a_serve_process_publishes_the_block_hashes_a_consumer_computes_and_replays_them(tiny_llama, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cli = Path(sys.executable).with_name("pagedinfer")
    log = (tmp_path / "server.log").open("w+")
    proc = subprocess.Popen(
        [
            str(cli),
            *tiny_serve_args(tiny_llama, port, max_model_len=256, num_gpu_blocks=64),
            "--kv-events",
            "--kv-events-port",
            "0",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        wait_process_healthy(url, proc)
        info = httpx.get(url + "/kv_events", timeout=10).json()
        assert info["enabled"] and info["block_size"] == BLOCK and info["format"] == "vllm-kv-events-msgpack"
        ctx = zmq.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://127.0.0.1:{info['pub_port']}")
        time.sleep(0.3)  # a PUB socket drops what it sends before the subscription arrives
        prompt = [(7 * i) % 90 + 3 for i in range(40)]
        _complete(url, prompt)
        expected = set(prefix_block_hashes(prompt, BLOCK))  # 2 full blocks of the prompt
        batches = _receive(sub, expected)
        seqs = [b.seq for b in batches]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # gapless, increasing by one

        snap = httpx.get(url + "/kv_events/snapshot", timeout=10).json()
        assert snap["sequence"] >= seqs[-1]
        assert expected <= {bytes.fromhex(h) for h in snap["block_hashes"]}

        replayed = asyncio.run(_replay(f"tcp://127.0.0.1:{info['replay_port']}", seqs[0]))
        assert [b.seq for b in replayed][: len(batches)] == seqs
        assert [b.events for b in replayed][: len(batches)] == [b.events for b in batches]
        sub.close()
    finally:
        proc.kill()  # how it shuts down is tests/server/test_sigterm.py's business
        proc.wait(30)


async def _replay(endpoint: str, start: int):
    import zmq.asyncio

    return await replay(zmq.asyncio.Context.instance(), endpoint, start)


def test_a_feed_follows_the_engine_and_recovers_dropped_batches_from_a_snapshot(tiny_llama):
    """With room for one pending event, the publisher drops and skips sequence numbers; the feed still ends
    equal to the engine's cache (the snapshot), having re-snapshotted."""
    running = start_server(tiny_llama, kv_events=KVEventsConfig(port=0, max_pending_events=1))
    try:
        feed, hashes = asyncio.run(_follow(running.url, [[(5 * i + k) % 80 + 2 for i in range(50)] for k in range(6)]))
        assert feed.num_snapshots >= 2 and hashes
    finally:
        stop_server(running)


def test_a_feed_without_drops_applies_every_batch_and_matches_the_snapshot(tiny_llama):
    running = start_server(tiny_llama, kv_events=KVEventsConfig(port=0))
    try:
        feed, hashes = asyncio.run(_follow(running.url, [[(3 * i + k) % 70 + 2 for i in range(40)] for k in range(4)]))
        assert feed.num_snapshots == 1 and feed.num_replays == 0
        assert len(hashes) >= 8
    finally:
        stop_server(running)


async def _follow(url: str, prompts: list[list[int]]):
    """Follow url with a KVFeed while the prompts run; the feed's final set and the snapshot's must agree."""

    async def send(client: httpx.AsyncClient) -> None:
        for p in prompts:
            r = await client.post(
                url + "/v1/completions", json={"model": "tiny", "prompt": p, "max_tokens": 3}, timeout=60
            )
            assert r.status_code == 200, r.text

    feed, _, snap = await follow_while(url, send)
    assert feed.hashes == {bytes.fromhex(h) for h in snap["block_hashes"]}
    return feed, set(feed.hashes)


def test_a_kv_events_port_in_use_is_one_line_naming_the_flag_and_exit_2(tiny_llama):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cli = Path(sys.executable).with_name("pagedinfer")
        run = subprocess.run(
            [
                str(cli),
                "serve",
                "--model",
                str(tiny_llama),
                "--device",
                "cpu",
                "--port",
                str(free_port()),
                "--kv-events",
                "--kv-events-port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1].startswith("pagedinfer serve: error: --kv-events-port: cannot bind")


def test_without_kv_events_discovery_says_so_and_the_snapshot_is_404(server):
    assert httpx.get(server.url + "/kv_events", timeout=10).json() == {"enabled": False}
    r = httpx.get(server.url + "/kv_events/snapshot", timeout=10)
    assert r.status_code == 404 and "--kv-events" in r.json()["error"]["message"]


def test_a_feed_that_missed_batches_recovers_them_from_the_replay_socket(tiny_llama):
    """The feed is handed only the newest batch, as after a gap; it replays the ones before it."""
    running = start_server(tiny_llama, kv_events=KVEventsConfig(port=0))
    try:
        asyncio.run(_replay_gap(running.url))
    finally:
        stop_server(running)


async def _replay_gap(url: str) -> None:
    import zmq.asyncio

    from pagedinfer.router.kv_feed import discover

    ctx = zmq.asyncio.Context.instance()
    async with httpx.AsyncClient() as client:
        info = await discover(client, url)
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(info.pub_endpoint)
        await asyncio.sleep(0.3)
        for k in range(3):
            r = await client.post(
                url + "/v1/completions",
                timeout=60,
                json={"model": "tiny", "prompt": [(k + 3 * i) % 60 + 2 for i in range(40)], "max_tokens": 2},
            )
            assert r.status_code == 200
        snap = (await client.get(url + "/kv_events/snapshot")).json()
        batches = []
        while not batches or batches[-1].seq < snap["sequence"]:
            _, seq, payload = await asyncio.wait_for(sub.recv_multipart(), 30)
            if seq_from_bytes(seq) != HEARTBEAT_SEQ:
                batches.append(decode_batch(seq_from_bytes(seq), payload))
        sub.close()
        assert batches[0].seq == 0 and len(batches) >= 2

        feed = KVFeed(url, lambda hashes, seq, block_size: None, client)  # state: nothing seen yet
        await feed._receive(batches[-1], info, ctx)
        assert (feed.num_replays, feed.num_snapshots, feed.seq) == (1, 0, batches[-1].seq)
        assert feed.hashes == {bytes.fromhex(h) for h in snap["block_hashes"]}
