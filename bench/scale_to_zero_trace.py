"""Replay a bursty trace with idle gaps through the router's hold queue against a service that scales to zero.

The sibling of bench/autoscale_trace.py (the same harnesses): the full operator under kopf against the
emulated API server, the kubelet harness running one REAL engine process per replica from the Deployment's
own command line (the engine's embedded tiny model, a 32-block pool, max_model_len 256), and a REAL
`pagedinfer router` process run from the router Deployment's own command line (its hold queue, its demand
annotation over HTTP to the emulated API server, its Pod object ready so the autoscaler reads its queue).
The EndpointSlice controller is played here: the engines' headless Service's slice lists the ready engines.

The trace (in trace seconds, compressed by `--compression` into wall seconds): bursts of open-loop arrivals
(Poisson, seeded) separated by idle gaps longer than the idle rule; every request is a streamed completion
through the router. Each configuration runs the same trace:

- zero:  minReplicas 0, idle.afterSeconds 60 (trace s), kvCacheUsage target 0.5, short windows;
- min1:  the same with minReplicas 1 (never below one replica);
- hpa:   minReplicas 1 with HPA's default behaviour (15 s sync, 300 s scale-down window) on kvCacheUsage;
- standby: as zero, with standby 1 (one replica kept asleep, woken by the router) [optional].

Every time constant of the spec is divided by the compression; the engines' cold start is real (not
compressed), which counts against scale to zero. Reported: requests dropped (any answer but a finished 200
stream); added latency of the requests that arrived with no engine ready (time to first token minus the
median of those that found one, in wall seconds); replica-seconds (the Deployment's spec.replicas over the
trace, in trace seconds) of each configuration and their ratios. `--plot` draws replicas and the router's
queue length over trace time.

    OMP_NUM_THREADS=1 .venv/bin/python bench/scale_to_zero_trace.py --runs zero,min1,hpa,standby \
        --compression 2 --bursts 0:30:1.0,200:40:0.6,400:20:1.5 --plot docs/scale_to_zero_trace.png
    OMP_NUM_THREADS=1 .venv/bin/python bench/scale_to_zero_trace.py --runs zero,min1,hpa,standby \
        --plot docs/scale_to_zero_trace_4x.png

(the figures in docs/autoscaling.md; the replica-seconds count the Deployment's spec.replicas, what the
operator asked for).

Linux only; needs 127.0.0.x loopback addresses.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

NS, NAME = "default", "tiny"
# (start, duration, arrivals per second), trace seconds; gaps of 110-150 s against a 60 s idle rule.
DEFAULT_BURSTS = "0:30:1.0,180:40:0.6,330:20:1.5,480:30:0.8"
DEFAULT_TRACE_SECONDS = 600.0
IDLE_SECONDS = 60.0  # the idle rule, trace seconds
RUNS = ("zero", "min1", "hpa", "standby")


@dataclass
class RequestRecord:
    arrival_s: float  # wall seconds from the trace's start
    at_zero: bool  # no ready engine awake when it arrived
    status: int | None = None
    ttft_s: float | None = None  # wall seconds to the first token (SSE comments do not count)
    done: bool = False  # the stream ended with [DONE]
    error: str = ""

    @property
    def dropped(self) -> bool:
        return not (self.status == 200 and self.done)


@dataclass
class Sample:
    time_s: float  # wall seconds from the trace's start
    replicas: int  # the InferenceService's spec.replicas
    engines: int  # ready engine processes
    queued: int | None  # the router's queue length


@dataclass
class RunResult:
    name: str
    samples: list[Sample] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    replica_seconds: float = 0.0  # trace seconds
    cold_starts_s: list[float] = field(default_factory=list)  # wall s from a request at zero to an engine ready
    scale_ups_s: list[float] = field(default_factory=list)  # wall s from a request at zero to spec.replicas >= 1


def parse_bursts(text: str) -> list[tuple[float, float, float]]:
    """'0:30:1.0,180:40:0.6' -> [(0, 30, 1.0), (180, 40, 0.6)] (start, duration, rate)."""
    bursts = []
    for part in text.split(","):
        start, duration, rate = (float(x) for x in part.split(":"))
        if start < 0 or duration <= 0 or rate <= 0:
            raise ValueError(f"--bursts: expected START:DURATION:RATE with positive duration and rate, got {part!r}")
        bursts.append((start, duration, rate))
    return bursts


def arrivals(bursts: list[tuple[float, float, float]], seed: int) -> list[float]:
    """Poisson arrival times (trace seconds) within each burst."""
    rng, out = random.Random(seed), []
    for start, duration, rate in bursts:
        t = start + rng.expovariate(rate)
        while t < start + duration:
            out.append(t)
            t += rng.expovariate(rate)
    return sorted(out)


def service_spec(run: str, compression: float) -> dict:
    """The InferenceService spec of one configuration, its times divided by the compression."""

    def s(trace_seconds: float) -> int:
        return max(1, round(trace_seconds / compression))

    fast = {
        "scaleUp": {"stabilizationWindowSeconds": 0, "policies": [{"type": "Pods", "value": 1, "periodSeconds": s(8)}]},
        "scaleDown": {
            "stabilizationWindowSeconds": s(30),
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": s(8)}],
        },
    }
    hpa = {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "policies": [
                {"type": "Pods", "value": 4, "periodSeconds": s(15)},
                {"type": "Percent", "value": 100, "periodSeconds": s(15)},
            ],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": s(300),
            "policies": [{"type": "Percent", "value": 100, "periodSeconds": s(15)}],
        },
    }
    autoscaling = {
        "enabled": True,
        "scrapeTimeoutSeconds": 2,
        "intervalSeconds": (15 if run == "hpa" else 4) / compression,
        "metrics": [{"name": "kvCacheUsage", "target": 0.5}],
        **(hpa if run == "hpa" else fast),
    }
    spec = {
        "resources": {"gpus": 0},
        "engine": {"numGpuBlocksOverride": 32, "maxModelLen": 256},
        "replicas": 1,
        "minReplicas": 1,
        "maxReplicas": 2,
        "router": {"enabled": True, "replicas": 1, "queue": {"maxRequests": 256, "timeoutSeconds": 180}},
        "autoscaling": autoscaling,
    }
    if run in ("zero", "standby"):
        spec["minReplicas"] = 0
        autoscaling["idle"] = {"afterSeconds": s(IDLE_SECONDS)}
    if run == "standby":
        autoscaling["standby"] = 1
    return spec


async def stream_completion(session, url: str, index: int, record: RequestRecord) -> None:
    """One streamed completion; fills `record` (status, time to first token, whether [DONE] came)."""
    import aiohttp

    body = {
        "model": NAME,
        "prompt": f"request {index}: tell a story about the number {index * 7919 % 1000}",
        "max_tokens": 16,
        "temperature": 0.0,
        "stream": True,
    }
    sent = time.monotonic()
    try:
        async with session.post(f"{url}/v1/completions", json=body) as response:
            record.status = response.status
            if response.status != 200:
                record.error = (await response.text())[:200]
                return
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue  # blank lines and ': keep-alive' comments
                if line == "data: [DONE]":
                    record.done = True
                elif record.ttft_s is None and json.loads(line[6:]).get("choices"):
                    record.ttft_s = time.monotonic() - sent
    except (TimeoutError, aiohttp.ClientError) as e:
        record.error = f"{type(e).__name__}: {e}"


async def awake_engines(session, harness) -> int:
    """Ready engines that are not asleep (GET /is_sleeping; an engine that does not answer counts as awake)."""

    async def awake(engine_url: str) -> bool:
        with contextlib.suppress(Exception):
            async with session.get(f"{engine_url}/is_sleeping", timeout=1.0) as response:
                return not (await response.json()).get("is_sleeping")
        return True

    return sum(await asyncio.gather(*(awake(u) for u in harness.urls)))


async def router_queue(session, url: str) -> int | None:
    from pagedinfer.operator.autoscaling.readings import parse_router_queue_length

    with contextlib.suppress(Exception):
        async with session.get(f"{url}/metrics") as response:
            return parse_router_queue_length(await response.text())
    return None


async def play_endpoint_slices(emulator, harness, slices, stop: asyncio.Event) -> None:
    """The EndpointSlice controller's part: the engines' headless Service's slice lists the ready engines."""
    from pagedinfer.testing.kubelet_harness import pause

    name = f"{NAME}-engines-abcde"
    await emulator.create(
        slices,
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "addressType": "IPv4",
            "metadata": {"name": name, "namespace": NS, "labels": {"kubernetes.io/service-name": f"{NAME}-engines"}},
            "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
            "endpoints": [],
        },
    )
    written: list[str] = []
    while not stop.is_set():
        ips = list(harness.ips)
        if ips != written:
            await emulator.merge(
                slices, NS, name, {"endpoints": [{"addresses": [ip], "conditions": {"ready": True}} for ip in ips]}
            )
            written = ips
        await pause(stop, 0.1)


async def run_once(run: str, args: argparse.Namespace, work_dir: Path) -> RunResult:
    import aiohttp

    from pagedinfer.testing.kubelet_harness import (
        DEPLOYMENTS,
        KubeletHarness,
        add_ready_pod,
        loopback_ip,
        pause,
        pod_from_template,
    )
    from pagedinfer.testing.operator_harness import (
        ISVC,
        inference_service,
        running_operator,
        serving_emulator,
        write_kubeconfig,
    )
    from pagedinfer.testing.pod_process import local_process

    result = RunResult(run)
    trace = arrivals(parse_bursts(args.bursts), args.seed)
    work_dir.mkdir(parents=True)
    async with serving_emulator() as (emulator, api_url):
        os.environ["KUBECONFIG"] = str(write_kubeconfig(work_dir / "kubeconfig", api_url))
        slices = emulator.register("discovery.k8s.io/v1", "EndpointSlice", "endpointslices")
        await emulator.create(ISVC, inference_service(NAME, service_spec(run, args.compression)))
        # a cold start on a loaded 2-core machine has taken over 120 s (the harness's default bound)
        harness = KubeletHarness(emulator, NS, NAME, work_dir, max_engines=2, ready_timeout_seconds=600)
        router = None
        stop = asyncio.Event()
        async with harness.running(), running_operator():
            try:
                while emulator.read(DEPLOYMENTS, NS, f"{NAME}-router") is None or not harness.engines:
                    await asyncio.sleep(0.2)
                template = emulator.read(DEPLOYMENTS, NS, f"{NAME}-router")["spec"]["template"]
                ip = loopback_ip(set(harness.ips))
                local = local_process(template["spec"], ip, work_dir / "router-pod", Path(sys.executable).parent)
                with open(work_dir / "router.log", "wb") as log:
                    router = subprocess.Popen(
                        [*local.argv, "--kube-api", api_url, "--namespace", NS],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env={**os.environ, **local.env, "OMP_NUM_THREADS": "1"},
                    )
                slice_task = asyncio.create_task(play_endpoint_slices(emulator, harness, slices, stop))
                url = f"http://{ip}:8000"
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
                    while True:  # the router is up and routes to the engine: one warm-up request
                        warm = RequestRecord(0.0, False)
                        await stream_completion(session, url, -1, warm)
                        if not warm.dropped:
                            break
                        if router.poll() is not None:
                            raise RuntimeError(f"router exited: {(work_dir / 'router.log').read_text()[-2000:]}")
                        await asyncio.sleep(0.5)
                    # ready (its probe answered): the kubelet's Pod status, which the autoscaler reads the queue by
                    await add_ready_pod(emulator, NS, pod_from_template(f"{NAME}-router-0", template, ip))
                    start = time.monotonic()
                    tasks = []

                    async def sample() -> None:
                        while not stop.is_set():
                            body = emulator.read(ISVC, NS, NAME)
                            result.samples.append(
                                Sample(
                                    time.monotonic() - start,
                                    body["spec"]["replicas"],
                                    len(harness.engines),
                                    await router_queue(session, url),
                                )
                            )
                            await pause(stop, args.sample_seconds)

                    sampler = asyncio.create_task(sample())
                    for i, t in enumerate(trace):
                        await asyncio.sleep(max(0.0, start + t / args.compression - time.monotonic()))
                        record = RequestRecord(time.monotonic() - start, not await awake_engines(session, harness))
                        result.requests.append(record)
                        tasks.append(asyncio.create_task(stream_completion(session, url, i, record)))
                    await asyncio.sleep(max(0.0, start + args.trace_seconds / args.compression - time.monotonic()))
                    end = time.monotonic()
                    await asyncio.gather(*tasks)
                    stop.set()
                    await asyncio.gather(sampler, slice_task)
                result.replica_seconds = replica_seconds(harness.history, start, end) * args.compression
                result.cold_starts_s = back_from_zero(result, ready=True)
                result.scale_ups_s = back_from_zero(result, ready=False)
            finally:
                stop.set()
                if router is not None:
                    router.terminate()
                    await asyncio.to_thread(router.wait, 30)
    return result


def replica_seconds(history: list[tuple[float, int]], start: float, end: float) -> float:
    """The integral over [start, end] (wall seconds) of the desired replicas, from the harness's history of
    (time, count) changes."""
    total = 0.0
    for (t, count), (t_next, _) in zip(history, history[1:] + [(end, 0)]):
        total += count * max(0.0, min(t_next, end) - max(t, start))
    return total


def back_from_zero(result: RunResult, ready: bool) -> list[float]:
    """Per episode without an awake engine that a request saw (from its first such request until an engine is
    ready): wall seconds from that first request to the first sample with spec.replicas >= 1 (`ready` False:
    the operator's decision) or with an engine ready (`ready` True: that plus the cold start, or the wake)."""
    out: list[float] = []
    episode_end = None
    for record in (r for r in result.requests if r.at_zero):
        if episode_end is not None and record.arrival_s < episode_end:
            continue
        episode_end = next((s.time_s for s in result.samples if s.time_s >= record.arrival_s and s.engines), None)
        back = next(
            (s.time_s for s in result.samples if s.time_s >= record.arrival_s and (s.engines if ready else s.replicas)),
            None,
        )
        if back is not None:
            out.append(back - record.arrival_s)
        if episode_end is None:
            break
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def seconds(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values) or "-"


def report(results: list[RunResult]) -> None:
    by_name = {r.name: r for r in results}
    print(
        "| configuration | requests | dropped | arrived at zero | added latency at zero p50 / p99 (s) "
        "| replica-seconds | vs min1 | vs hpa |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        warm = [x.ttft_s for x in r.requests if not x.at_zero and x.ttft_s is not None]
        base = statistics.median(warm) if warm else 0.0
        cold = [x.ttft_s - base for x in r.requests if x.at_zero and x.ttft_s is not None]
        added = f"{percentile(cold, 50):.1f} / {percentile(cold, 99):.1f}" if cold else "-"
        ratio = lambda other: (
            f"{r.replica_seconds / by_name[other].replica_seconds:.2f}"  # noqa: E731
            if other in by_name and by_name[other].replica_seconds
            else "-"
        )
        dropped = sum(x.dropped for x in r.requests)
        print(
            f"| {r.name} | {len(r.requests)} | {dropped} | {sum(x.at_zero for x in r.requests)} | {added} "
            f"| {r.replica_seconds:.0f} | {ratio('min1')} | {ratio('hpa')} |"
        )
    for r in results:
        warm = [x.ttft_s for x in r.requests if not x.at_zero and x.ttft_s is not None]
        print(
            f"{r.name}: warm time to first token median {statistics.median(warm) if warm else float('nan'):.2f} s;"
            f" from a request at zero to spec.replicas >= 1: {seconds(r.scale_ups_s)} s, to an engine ready:"
            f" {seconds(r.cold_starts_s)} s (wall)"
        )
        for x in r.requests:
            if x.dropped:
                print(f"  dropped at {x.arrival_s:.1f} s: status {x.status} {x.error}")


def plot(results: list[RunResult], bursts: list[tuple[float, float, float]], compression: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    for ax in (top, bottom):
        for start, duration, _ in bursts:
            ax.axvspan(start, start + duration, color="0.92", lw=0)
    styles = {"zero": dict(lw=2), "min1": dict(ls="--"), "hpa": dict(ls=":"), "standby": dict(ls="-.")}
    for r in results:
        t = [s.time_s * compression for s in r.samples]
        top.step(
            t, [s.replicas for s in r.samples], where="post", label=f"{r.name}: spec.replicas", **styles.get(r.name, {})
        )
        if r.name in ("zero", "standby"):
            top.step(t, [s.engines for s in r.samples], where="post", label=f"{r.name}: engines ready", lw=1, alpha=0.5)
        queued = [s.queued if s.queued is not None else float("nan") for s in r.samples]
        if r.name in ("zero", "standby"):
            bottom.step(t, queued, where="post", label=f"{r.name}: router queue length", **styles.get(r.name, {}))
    top.set_ylabel("replicas")
    top.set_ylim(-0.1, 2.5)
    top.legend(loc="upper right", fontsize=8)
    bottom.set_ylabel("requests held")
    bottom.set_xlabel(f"trace seconds (grey: bursts; replayed {compression:g}x faster)")
    bottom.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--runs", default="zero,min1,hpa", help=f"configurations, of {', '.join(RUNS)} (default zero,min1,hpa)"
    )
    p.add_argument(
        "--bursts", default=DEFAULT_BURSTS, help=f"START:DURATION:RATE,... trace seconds (default {DEFAULT_BURSTS})"
    )
    p.add_argument(
        "--trace-seconds",
        type=float,
        default=DEFAULT_TRACE_SECONDS,
        help=f"the trace's length in trace seconds (default {DEFAULT_TRACE_SECONDS:g})",
    )
    p.add_argument("--compression", type=float, default=4.0, help="trace seconds per wall second (default 4)")
    p.add_argument("--seed", type=int, default=0, help="arrival times' seed (default 0)")
    p.add_argument("--sample-seconds", type=float, default=0.25, help="sampling period, wall (default 0.25)")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG plot here")
    args = p.parse_args()
    runs = args.runs.split(",")
    if not set(runs) <= set(RUNS) or args.compression <= 0:
        p.error(f"--runs: of {', '.join(RUNS)}; --compression > 0")
    bursts = parse_bursts(args.bursts)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            print(f"run {run} ...", file=sys.stderr, flush=True)
            results.append(asyncio.run(run_once(run, args, Path(tmp) / run)))
    print(
        f"trace: {len(arrivals(bursts, args.seed))} requests in {args.trace_seconds:g} trace s ({args.bursts}),"
        f" idle rule {IDLE_SECONDS:g} trace s, replayed {args.compression:g}x faster"
    )
    report(results)
    if args.plot:
        plot(results, bursts, args.compression, args.plot)
        print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
