"""Replay a bursty-then-idle load trace through the real autoscaling harness.

The full operator (reconciler + autoscaler) runs under kopf against the
emulated API server; the kubelet harness (pagedinfer.testing.kubelet_harness)
runs one real engine per replica (the Deployment's own command line: the
engine's embedded model, a 32-block KV pool and max_model_len 256 from the
spec) on 127.0.0.x:8000; a closed-loop load generator plays the trace
(phases of `--burst-concurrency` clients, then none).

Every `--sample-seconds` it records the InferenceService's replicas, the
engines running, the autoscaler's view (status.autoscaling.currentMetrics)
and the CPU the engine processes used (from /proc). It prints the samples,
the time from each load change to the next replica decision, and the same
for a simulated CPU-utilization HPA fed the measured CPU: total engine CPU
demand spread over its replicas (1-core request per pod, target 80 %
utilization), decided by the same HPA algorithm (autoscaling.policy.decide)
with HPA's default behaviour (15 s sync period, 300 s scale-down window).

    .venv/bin/python bench/autoscale_trace.py --plot docs/autoscaling_trace.png

Linux only (/proc); needs 127.0.0.x loopback addresses.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from proc_stats import read_stat


@dataclass
class Sample:
    time_seconds: float
    load_on: bool
    replicas: int
    engines: int
    kv_usage: float | None
    cpu_cores: float  # CPU used by all engine processes over the last sample period
    cpu_hpa_replicas: int


def process_cpu_seconds(pid: int) -> float:
    stat = read_stat(pid)
    return stat.cpu_seconds if stat else 0.0


def parse_trace(text: str) -> list[tuple[float, bool]]:
    """'10:off,30:on,40:off' -> [(10.0, False), (30.0, True), (40.0, False)]."""
    phases = []
    for part in text.split(","):
        seconds, _, state = part.partition(":")
        if state not in ("on", "off") or float(seconds) <= 0:
            raise ValueError(f"--trace: expected SECONDS:on|off items, got {part!r}")
        phases.append((float(seconds), state == "on"))
    return phases


async def replay(args: argparse.Namespace, work_dir: Path) -> list[Sample]:
    from pagedinfer.operator.autoscaling import daemon  # noqa: F401
    from pagedinfer.operator.autoscaling.policy import AutoscalerState, MetricSample, Observation, decide
    from pagedinfer.operator.autoscaling.spec import parse_autoscaling_spec
    from pagedinfer.testing.kubelet_harness import KubeletHarness, LoadGenerator
    from pagedinfer.testing.operator_harness import ISVC, running_operator, serving_emulator, write_kubeconfig

    cpu_hpa = parse_autoscaling_spec(
        {
            "minReplicas": 1,
            "maxReplicas": 3,
            "autoscaling": {"enabled": True, "metrics": [{"name": "kvCacheUsage", "target": 0.8}]},
        }
    )  # same formula as CPU utilization
    spec = {
        "resources": {"gpus": 0},
        "engine": {"numGpuBlocksOverride": 32, "maxModelLen": 256},
        "replicas": 1,
        "minReplicas": 1,
        "maxReplicas": 3,
        "autoscaling": {
            "enabled": True,
            "intervalSeconds": args.interval_seconds,
            "scrapeTimeoutSeconds": 2,
            "metrics": [{"name": "kvCacheUsage", "target": 0.5}],
            "scaleUp": {
                "stabilizationWindowSeconds": 0,
                "policies": [{"type": "Pods", "value": 1, "periodSeconds": 2}],
            },
            "scaleDown": {
                "stabilizationWindowSeconds": args.scale_down_window_seconds,
                "policies": [{"type": "Pods", "value": 2, "periodSeconds": 2}],
            },
        },
    }
    samples: list[Sample] = []
    async with serving_emulator() as (emulator, url):
        os.environ["KUBECONFIG"] = str(write_kubeconfig(work_dir / "kubeconfig", url))
        await emulator.create(
            ISVC,
            {
                "apiVersion": "serving.pagedinfer.dev/v1alpha1",
                "kind": "InferenceService",
                "metadata": {"name": "tiny", "namespace": "default"},
                "spec": spec,
            },
        )
        harness = KubeletHarness(emulator, "default", "tiny", work_dir, max_engines=3)
        load = LoadGenerator(
            harness,
            lambda i: f"request {i}: a long story about block {i * 7919 % 1000}",
            concurrency=args.burst_concurrency,
            max_tokens=160,
        )
        stop = asyncio.Event()
        tasks = [asyncio.create_task(harness.run(stop)), asyncio.create_task(load.run(stop))]
        async with running_operator():
            while len(harness.engines) < 1:
                await asyncio.sleep(0.2)
            start = time.monotonic()
            cpu_state, cpu_replicas, last_cpu_sync = AutoscalerState(), 1, None
            previous_cpu = {e.process.pid: process_cpu_seconds(e.process.pid) for e in harness.engines}
            for duration, on in parse_trace(args.trace):
                (load.active.set if on else load.active.clear)()
                phase_end = time.monotonic() + duration
                while time.monotonic() < phase_end:
                    await asyncio.sleep(args.sample_seconds)
                    now = time.monotonic() - start
                    used = {e.process.pid: process_cpu_seconds(e.process.pid) for e in harness.engines}
                    cpu_cores = (
                        sum(max(0.0, used[p] - previous_cpu.get(p, used[p])) for p in used) / args.sample_seconds
                    )
                    previous_cpu = used
                    if last_cpu_sync is None or now - last_cpu_sync >= 15.0:
                        per_pod = min(1.0, cpu_cores / cpu_replicas)
                        observation = Observation(
                            cpu_replicas, cpu_replicas, 0, {"kvCacheUsage": MetricSample(per_pod, cpu_replicas)}
                        )
                        decision = decide(cpu_hpa, observation, cpu_state, now)
                        cpu_replicas, cpu_state, last_cpu_sync = decision.desired_replicas, decision.state, now
                    body = emulator.read(ISVC, "default", "tiny")
                    metrics = ((body.get("status") or {}).get("autoscaling") or {}).get("currentMetrics") or [{}]
                    samples.append(
                        Sample(
                            now,
                            on,
                            body["spec"]["replicas"],
                            len(harness.engines),
                            metrics[0].get("value"),
                            cpu_cores,
                            cpu_replicas,
                        )
                    )
            stop.set()
            await asyncio.gather(*tasks)
    return samples


def decision_latencies(samples: list[Sample], field: str) -> list[tuple[float, str, float | None]]:
    """For each load change: (time, 'on'/'off', seconds until `field` next changed, None if never)."""
    out = []
    for i in range(1, len(samples)):
        if samples[i].load_on == samples[i - 1].load_on:
            continue
        before = getattr(samples[i - 1], field)
        later = next((s for s in samples[i:] if getattr(s, field) != before), None)
        out.append(
            (
                samples[i].time_seconds,
                "on" if samples[i].load_on else "off",
                None if later is None else later.time_seconds - samples[i - 1].time_seconds,
            )
        )
    return out


def plot(samples: list[Sample], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.time_seconds for s in samples]
    fig, ax = plt.subplots(figsize=(9, 4))
    for s0, s1 in zip(samples, samples[1:]):
        if s0.load_on:
            ax.axvspan(s0.time_seconds, s1.time_seconds, color="0.9", lw=0)
    ax.step(t, [s.replicas for s in samples], where="post", label="KV-cache autoscaler (replicas)", lw=2)
    ax.step(t, [s.cpu_hpa_replicas for s in samples], where="post", label="simulated CPU HPA (replicas)", ls="--")
    ax.set_xlabel("seconds (grey: load on)")
    ax.set_ylabel("replicas")
    ax.set_ylim(0, 3.5)
    twin = ax.twinx()
    twin.plot(
        t,
        [s.kv_usage if s.kv_usage is not None else float("nan") for s in samples],
        color="tab:red",
        alpha=0.6,
        label="KV usage (mean of ready pods)",
    )
    twin.set_ylabel("KV usage")
    twin.set_ylim(0, 1.05)
    lines = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(lines, [line.get_label() for line in lines], loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", default="5:off,30:on,35:off", help="phases SECONDS:on|off (default 5:off,30:on,35:off)")
    p.add_argument("--burst-concurrency", type=int, default=4, help="clients while the load is on (default 4)")
    p.add_argument("--interval-seconds", type=float, default=1.0, help="autoscaler interval (default 1)")
    p.add_argument("--scale-down-window-seconds", type=int, default=10, help="scale-down window (default 10)")
    p.add_argument("--sample-seconds", type=float, default=0.5, help="sampling period (default 0.5)")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG plot here")
    args = p.parse_args()
    parse_trace(args.trace)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        samples = asyncio.run(replay(args, Path(tmp)))
    print("time_s  load  replicas  engines  kv_usage  engine_cpu_cores  cpu_hpa_replicas")
    for s in samples[:: max(1, round(1 / args.sample_seconds))]:
        kv = "-" if s.kv_usage is None else f"{s.kv_usage:.2f}"
        print(
            f"{s.time_seconds:6.1f}  {'on ' if s.load_on else 'off'}  {s.replicas:8d}  {s.engines:7d}  {kv:>8}"
            f"  {s.cpu_cores:16.2f}  {s.cpu_hpa_replicas:16d}"
        )
    print("\n| load change at (s) | load | KV autoscaler: s to decision | simulated CPU HPA: s to decision |")
    print("|---|---|---|---|")
    ours = decision_latencies(samples, "replicas")
    theirs = decision_latencies(samples, "cpu_hpa_replicas")
    for (t, state, a), (_, _, b) in zip(ours, theirs):
        fmt = lambda x: "no change in the run" if x is None else f"{x:.1f}"  # noqa: E731
        print(f"| {t:.1f} | {state} | {fmt(a)} | {fmt(b)} |")
    if args.plot:
        plot(samples, args.plot)
        print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
