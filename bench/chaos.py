"""Chaos on the KV-event stream: does the router's index stay true? With and without heartbeats.

Two engines (`pagedinfer serve --kv-events` on the embedded model, CPU,
127.0.0.2-3, a pool small enough that they evict) each behind a fault proxy
(`pagedinfer.testing.kv_chaos`, 127.0.0.12-13: TCP relays for HTTP and
replay, a ZeroMQ relay for the PUB stream), and `pagedinfer router` following
the proxies. The tenants and their conversations are bench/routing.py's; the
load goes in waves (every tenant's next turn, in a shuffled order,
`--concurrency` at a time, then a quiet pause of `--pause-seconds`). Cases, each on a fresh router and fresh
tenants:

- drops:    the proxies drop `--drop-fraction` (5 %) of the PUB messages, all along;
- silence:  engine 0's publisher is silenced for waves `--silence-waves` (HTTP answers);
- eviction: no fault; the small pools evict all along (BlockRemoved events).

Each case runs against engines with heartbeats (`--heartbeat-seconds`) and
engines with none (`--kv-events-heartbeat-seconds 0`, the behaviour before).

Reported per run:
- routed hits: answers the router routed as a hit (route header matched_tokens > 0);
- phantom hits: of those, answers with `usage.prompt_tokens_details.cached_tokens` 0
  (and, apart, partial ones: cached below what the router matched);
- convergence: after each fault ends (each wave's end for drops and eviction,
  the resume for silence), the time until the router's view of every engine
  (its `pagedinfer_router_engine_kv_sequence`, not stale) reflects the newest
  batch the engine had sent by then (read from the engine's own PUB socket);
  "never" if not by the next wave's end;
- silence noticed: from the silence until the router marks the engine stale
  (the limit: one heartbeat interval plus `STALE_SLACK_SECONDS`, router/feed_sync.py);
- stale outside a silence: times an engine turned stale with its publisher talking
  (a lost heartbeat, or one later than the slack);
- heartbeat gap max: the longest time between two heartbeats on the engines' own
  PUB sockets during the load (the publisher's lateness the slack must cover);
- evicted: the BlockRemoved hashes the engines published during the load.

    OMP_NUM_THREADS=1 .venv/bin/python bench/chaos.py              # the figures in docs/router.md
    OMP_NUM_THREADS=1 .venv/bin/python bench/chaos.py --smoke      # a tiny run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import routing  # noqa: E402  (bench/routing.py: the workload and the processes)

from pagedinfer.contracts.kv_events.events import BlockRemoved, decode_batch  # noqa: E402
from pagedinfer.contracts.kv_events.frames import HEARTBEAT_SEQ  # noqa: E402
from pagedinfer.testing.kv_chaos import KVChaosProxy  # noqa: E402
from pagedinfer.testing.server_process import wait_process_healthy  # noqa: E402

HOSTS, PROXY_HOSTS = ("127.0.0.2", "127.0.0.3"), ("127.0.0.12", "127.0.0.13")
CASES = ("drops", "silence", "eviction")
SAMPLE_SECONDS = 0.02
STARTUP_TIMEOUT_SECONDS = 600.0  # a shared 2-core machine at load 12 took over 120 s to start an engine


class EngineSeqs:
    """The newest batch each engine has sent, read from its own PUB socket (not through the proxy)."""

    def __init__(self, engine_urls: list[str]) -> None:
        import zmq

        self.latest: dict[str, int] = {}
        self.num_removed_blocks = 0  # BlockRemoved hashes, all engines: the eviction the run caused
        self.last_beat: dict[str, float] = {}
        self.max_beat_gap_seconds = 0.0  # the longest time between two heartbeats of one engine (reset per run)
        self._ctx = zmq.Context()
        self._socks = {}
        for url in engine_urls:
            info = httpx.get(url + "/kv_events", timeout=10).json()
            sock = self._ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            sock.connect(f"tcp://{url.split('//')[1].split(':')[0]}:{info['pub_port']}")
            self._socks[sock] = url
            sequence = httpx.get(url + "/kv_events/snapshot", timeout=10).json()["sequence"]
            self.latest[url] = -1 if sequence is None else sequence
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import zmq

        poller = zmq.Poller()
        for sock in self._socks:
            poller.register(sock, zmq.POLLIN)
        while not self._stop.is_set():
            for sock, _ in poller.poll(50):
                _, seq, payload = sock.recv_multipart()
                seq = int.from_bytes(seq, "big", signed=True)
                url = self._socks[sock]
                if seq == HEARTBEAT_SEQ:
                    now = time.monotonic()
                    if url in self.last_beat:
                        self.max_beat_gap_seconds = max(self.max_beat_gap_seconds, now - self.last_beat[url])
                    self.last_beat[url] = now
                else:
                    self.latest[self._socks[sock]] = max(seq, self.latest[self._socks[sock]])
                    self.num_removed_blocks += sum(
                        len(e.block_hashes) for e in decode_batch(seq, payload).events if isinstance(e, BlockRemoved)
                    )

    def now(self) -> dict[str, int]:
        return dict(self.latest)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in self._socks:
            sock.close()
        self._ctx.term()


@dataclass
class Sample:
    t: float
    view: dict[str, tuple[int, bool]]  # proxy URL -> (router's sequence, stale)


@dataclass
class Run:
    case: str
    heartbeats: bool
    answers: list[tuple[int, int]] = field(default_factory=list)  # (matched_tokens, cached_tokens)
    samples: list[Sample] = field(default_factory=list)
    fault_ends: list[tuple[float, dict[str, int]]] = field(default_factory=list)  # (time, engine seqs then)
    silenced_at: float | None = None
    resumed_at: float | None = None
    silenced_url: str | None = None  # the proxy whose PUB stream is silenced
    max_beat_gap_seconds: float = 0.0  # on the engines' own PUB sockets, during the load
    evicted_blocks: int = 0  # BlockRemoved hashes the engines published during the load


def router_view(client: httpx.Client, router_url: str) -> dict[str, tuple[int, bool]]:
    text = client.get(router_url + "/metrics", timeout=5).text
    seqs = dict(re.findall(r'^pagedinfer_router_engine_kv_sequence\{engine="([^"]+)"\} (\S+)$', text, re.M))
    stale = dict(re.findall(r'^pagedinfer_router_engine_kv_stale\{engine="([^"]+)"\} (\S+)$', text, re.M))
    return {url: (int(float(seqs[url])), float(stale.get(url, "0")) > 0) for url in seqs}


def sample_router(router_url: str, run: Run, stop: threading.Event) -> None:
    with httpx.Client() as client:
        while not stop.is_set():
            try:
                run.samples.append(Sample(time.monotonic(), router_view(client, router_url)))
            except (httpx.HTTPError, KeyError):
                pass
            time.sleep(SAMPLE_SECONDS)


async def drive(
    router_url: str, convs, args, run: Run, proxies: list[KVChaosProxy], seqs: EngineSeqs, engine_of: dict[str, str]
) -> None:
    silence_from, silence_to = args.silence_waves
    sem = asyncio.Semaphore(args.concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0)) as client:

        async def one(messages):
            body = {
                "model": "pagedinfer-default",
                "messages": messages,
                "max_tokens": args.max_tokens,
                "ignore_eos": True,
            }
            async with sem:
                r = await client.post(router_url + "/v1/chat/completions", json=body)
            r.raise_for_status()
            route = dict(p.strip().split("=", 1) for p in r.headers["x-pagedinfer-route"].split(";"))
            cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            run.answers.append((int(route["matched_tokens"]), cached))

        for wave in range(args.turns):
            if run.case == "silence" and wave == silence_from:
                proxies[0].silence()
                run.silenced_url = proxies[0].url
                run.silenced_at = time.monotonic()
            order = random.Random(wave).sample(convs, len(convs))  # a fixed order would make LRU miss every turn
            await asyncio.gather(*(one(conv[wave]) for conv in order))
            if run.case == "silence" and wave == silence_to:
                proxies[0].resume()
                run.resumed_at = time.monotonic()
            if run.case != "silence" or wave == silence_to:
                run.fault_ends.append((time.monotonic(), {p.url: seqs.now()[engine_of[p.url]] for p in proxies}))
            await asyncio.sleep(args.pause_seconds)


def run_case(case: str, heartbeats: bool, urls: list[str], seqs: EngineSeqs, args, logs: Path, seed: int) -> Run:
    engine_of = {}
    proxies = []
    for url, host in zip(urls, PROXY_HOSTS):
        proxy = KVChaosProxy(url, host, args.drop_fraction if case == "drops" else 0.0, seed=seed).start()
        proxies.append(proxy)
        engine_of[proxy.url] = url
    port = routing.free_port("127.0.0.1")
    router_url = f"http://127.0.0.1:{port}"
    flags = [f for p in proxies for f in ("--engine", p.url)]
    name = f"{case}-{'hb' if heartbeats else 'nohb'}"
    router = routing.start(["router", *flags, "--port", str(port), "--log-level", "warning"], logs / f"{name}.log")
    run = Run(case, heartbeats)
    stop = threading.Event()
    try:
        wait_process_healthy(router_url, router, timeout_seconds=STARTUP_TIMEOUT_SECONDS)
        with httpx.Client() as client:  # every feed has its first snapshot
            deadline = time.monotonic() + 60
            while len(router_view(client, router_url)) < len(urls):
                if time.monotonic() > deadline:
                    raise RuntimeError("the router never followed both engines")
                time.sleep(0.1)
            time.sleep(1.0)
        sampler = threading.Thread(target=sample_router, args=(router_url, run, stop), daemon=True)
        sampler.start()
        convs = routing.workload(args.tenants, args.turns, args.system_words, seed=seed)
        removed_before = seqs.num_removed_blocks
        seqs.max_beat_gap_seconds = 0.0
        asyncio.run(drive(router_url, convs, args, run, proxies, seqs, engine_of))
        run.evicted_blocks = seqs.num_removed_blocks - removed_before
        run.max_beat_gap_seconds = seqs.max_beat_gap_seconds
        stop.set()
        sampler.join(5)
    finally:
        stop.set()
        router.terminate()
        router.wait(30)
        for proxy in proxies:
            proxy.stop()
    return run


def convergence_seconds(run: Run, t: float, targets: dict[str, int], until: float) -> float | None:
    for s in run.samples:
        if s.t < t or s.t > until:
            continue
        if all(url in s.view and s.view[url][0] >= target and not s.view[url][1] for url, target in targets.items()):
            return s.t - t
    return None


def stale_outside_silence(run: Run) -> int:
    """Times an engine turned stale (in the samples) while its publisher was not silenced."""
    turned, was = 0, {}
    for s in run.samples:
        silenced = run.silenced_at is not None and run.silenced_at <= s.t and (run.resumed_at or 1e18) >= s.t
        for url, (_, stale) in s.view.items():
            if stale and not was.get(url, False) and not (silenced and url == run.silenced_url):
                turned += 1
            was[url] = stale
    return turned


def summarize(run: Run) -> dict:
    hits = [(m, c) for m, c in run.answers if m > 0]
    phantom = sum(1 for _, c in hits if c == 0)
    partial = sum(1 for m, c in hits if 0 < c < m)
    ends = [t for t, _ in run.fault_ends]
    conv = []
    for i, (t, targets) in enumerate(run.fault_ends):
        until = run.samples[-1].t if run.case == "silence" or i + 1 == len(ends) else ends[i + 1]
        conv.append(convergence_seconds(run, t, targets, until))
    done = [c for c in conv if c is not None]
    noticed = None
    if run.silenced_at is not None:
        first = next(
            (s.t for s in run.samples if s.t >= run.silenced_at and any(stale for _, stale in s.view.values())), None
        )
        noticed = None if first is None else first - run.silenced_at
    return {
        "case": run.case,
        "heartbeats": run.heartbeats,
        "requests": len(run.answers),
        "routed_hits": len(hits),
        "phantom_hits": phantom,
        "phantom_fraction": phantom / len(hits) if hits else 0.0,
        "partial_hits": partial,
        "convergence_median_s": statistics.median(done) if done else None,
        "convergence_max_s": max(done) if done else None,
        "not_converged": len(conv) - len(done),
        "fault_ends": len(conv),
        "silence_noticed_s": noticed,
        "stale_outside_silence": stale_outside_silence(run),
        "max_heartbeat_gap_s": run.max_beat_gap_seconds or None,
        "evicted_blocks": run.evicted_blocks,
    }


def start_engines(args, heartbeat_seconds: float, logs: Path, tag: str):
    procs, urls = [], []
    for i, host in enumerate(HOSTS):
        url, proc = routing.start_engine(
            host,
            args.blocks,
            args.max_model_len,
            logs / f"engine{i}-{tag}.log",
            ("--kv-events-heartbeat-seconds", str(heartbeat_seconds)),
        )
        procs.append(proc)
        urls.append(url)
    try:
        for url, proc in zip(urls, procs):
            wait_process_healthy(url, proc, timeout_seconds=STARTUP_TIMEOUT_SECONDS)
    except BaseException:
        routing.stop_all(procs)
        raise
    return urls, procs


def fmt(value, unit="s") -> str:
    return "-" if value is None else f"{value:.2f}{unit}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tenants", type=int, default=12)
    p.add_argument("--turns", type=int, default=16, help="waves: every tenant's next turn, then a pause")
    p.add_argument("--system-words", type=int, default=100)
    p.add_argument("--blocks", type=int, default=128, help="KV blocks per engine (16 tokens each): they evict")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="requests in flight at once (1: a routed hit can only be lost to the index, not to"
        " another request evicting its blocks before it is scheduled)",
    )
    p.add_argument("--pause-seconds", type=float, default=1.5, help="quiet time after each wave")
    p.add_argument("--drop-fraction", type=float, default=0.05)
    p.add_argument(
        "--silence-waves",
        type=int,
        nargs=2,
        default=(5, 9),
        metavar=("FIRST", "LAST"),
        help="engine 0's publisher is silent from the start of wave FIRST to the end of wave LAST",
    )
    p.add_argument(
        "--heartbeat-seconds",
        type=float,
        default=None,
        help="the engines' --kv-events-heartbeat-seconds (default: the engine's default)",
    )
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--smoke", action="store_true", help="4 tenants, 4 waves: checks the script runs")
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--logs", type=Path, default=Path("chaos-logs"))
    args = p.parse_args(argv)
    if args.smoke:
        args.tenants, args.turns, args.system_words, args.silence_waves, args.pause_seconds = 4, 4, 40, (1, 2), 1.0
    from pagedinfer.contracts.config.serve_args import DEFAULT_HEARTBEAT_INTERVAL_SECONDS

    heartbeat = DEFAULT_HEARTBEAT_INTERVAL_SECONDS if args.heartbeat_seconds is None else args.heartbeat_seconds
    args.logs.mkdir(parents=True, exist_ok=True)
    rows = []
    for heartbeats in (True, False):
        tag = "hb" if heartbeats else "nohb"
        urls, procs = start_engines(args, heartbeat if heartbeats else 0.0, args.logs, tag)
        seqs = EngineSeqs(urls)
        try:
            for seed, case in enumerate(args.cases.split(",")):
                run = run_case(case, heartbeats, urls, seqs, args, args.logs, seed=100 + seed)
                rows.append(summarize(run))
                print(json.dumps(rows[-1]), flush=True)
        finally:
            seqs.close()
            routing.stop_all(procs)
    print(
        f"\nheartbeat interval {heartbeat:g} s; {args.tenants} tenants x {args.turns} waves, 2 engines of"
        f" {args.blocks} blocks; goal: phantom < 1 % of routed hits, convergence within one heartbeat"
    )
    print(
        f"{'case':<10}{'heartbeats':>11}{'requests':>9}{'routed hits':>12}{'phantom':>14}{'partial':>8}"
        f"{'converge p50':>13}{'max':>7}{'never':>6}{'silence seen':>13}{'stale else':>11}{'beat gap':>9}"
        f"{'evicted':>8}"
    )
    for r in rows:
        print(
            f"{r['case']:<10}{'on' if r['heartbeats'] else 'off':>11}{r['requests']:>9}{r['routed_hits']:>12}"
            f"{r['phantom_hits']:>6} ({r['phantom_fraction']:>5.1%}){r['partial_hits']:>8}"
            f"{fmt(r['convergence_median_s']):>13}{fmt(r['convergence_max_s']):>7}"
            f"{r['not_converged']:>3}/{r['fault_ends']:<2}{fmt(r['silence_noticed_s']):>13}"
            f"{r['stale_outside_silence']:>11}{fmt(r['max_heartbeat_gap_s']):>9}{r['evicted_blocks']:>8}"
        )
    if args.json_out:
        args.json_out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
