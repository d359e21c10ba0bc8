"""Warm caches through lifecycle events: scale 3 -> 2, scale 2 -> 3 and a rolling update, measured.

The operator runs under kopf against the emulated API server; the kubelet
harness (`lifecycle`: graceful deletion with the preStop hook, ReplicaSet
victim order, rolling updates) runs one real engine process per pod (the
Deployment's own command line: the embedded model, `--kv-events`); the
emulator's EndpointSlice controller keeps the engines' Service's slice; one
real `pagedinfer router` process (the router Deployment's command line) is
in front. Closed-loop clients send `--tenants` tenants' prompts (a fixed
`--prefix-tokens` token prefix each, then a fresh question), tenants drawn
with Zipf(1) popularity, through the router. After `--steady-seconds` the
event happens; the run goes on for `--window-seconds` after it.

Modes:
- a: no deletion cost (the ReplicaSet's default victim: the newest pod) and
  no warm-up (`spec.router.warmup.prefixes: 0`): new pods start cold;
- b: deletion cost only (today): before a scale-in each pod is annotated with
  the hit tokens it served over the last interval (the autoscaler's
  `deletion_costs`), so the coldest goes; no warm-up;
- c: deletion cost and warm-up (the router's hot-prefix replays to a new
  engine before it takes traffic and to the survivors of a scale-in).
For scale-up and the rollout a and b are the same system (no pod is chosen
by cost), so b is run for scale-in only. Every mode drains before
termination (the operator's preStop, the router dropping terminating
endpoints).

Reported per run (requests counted by their start time): the prefix-cache hit
rate (cached / prompt tokens, from each response's usage) over the
`--steady-seconds` before the event; prefill tokens recomputed (prompt -
cached) in the window after it; the time from the event until a
`--bin-seconds` bin's hit rate is back within 0.02 of the level before it;
aborted requests (any answer but a 200).

    OMP_NUM_THREADS=1 .venv/bin/python bench/routing_lifecycle.py --plot docs/routing_lifecycle.png

By count instead of by time (`--trace-requests N`, bench/lifecycle_trace.py):
`--steady-requests` requests of a seeded trace before the event, no traffic
during it, then, once the engines are settled and routable, the trace's next
N requests: the same prompts in the same order in every mode, so the
recomputed prefill tokens of (a) and (c) compare request for request. With
`--probe-ttft` one more user sends requests while the event happens (each
one's time to its single token, and the router's warm-up tokens, recorded):
bench/warmup_sweep.py sweeps K and the token budget with it.

    OMP_NUM_THREADS=1 .venv/bin/python bench/routing_lifecycle.py --scenarios scale-up --modes a,c --trace-requests 200

Linux only; needs 127.0.0.x loopback addresses. `--smoke` is a few seconds' check of the pieces.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lifecycle_trace import (  # noqa: E402  (bench/lifecycle_trace.py: the trace by count)
    Record,
    TraceResult,
    hit_rate,
    post_prompt,
    probe_ttft,
    router_warmup_tokens,
    send_trace,
    summarize_trace,
    trace,
    trace_table,
    zipf_weights,
)

NS, NAME = "default", "tiny"
SCENARIOS = ("scale-in", "scale-up", "rollout")
MODES = {"scale-in": ("a", "b", "c"), "scale-up": ("a", "c"), "rollout": ("a", "c")}
RECOVERY_TOLERANCE = 0.02


@dataclass
class Result:
    scenario: str
    mode: str
    hit_rate_before: float
    requests_in_window: int
    recomputed_tokens: int
    recovery_seconds: float | None
    aborted: int
    bins: list[tuple[float, float]] = field(default_factory=list)  # (seconds from the event, hit rate)
    prompt_tokens_in_window: int = 0  # of the requests that succeeded

    def excess_recomputed_tokens(self, prompt_tokens_per_request: int) -> int:
        """Recomputed tokens above what the hit rate before the event would have recomputed for the same
        requests: the cache the event lost (negative: the window did better than before)."""
        prompt = self.prompt_tokens_in_window or self.requests_in_window * prompt_tokens_per_request
        return round(self.recomputed_tokens - prompt * (1.0 - self.hit_rate_before))


def tenant_prefixes(tenants: int, tokens: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, 2000) for _ in range(tokens)] for _ in range(tenants)]


async def client_loop(
    url: str,
    prefixes: list[list[int]],
    records: list[Record],
    origin: float,
    stop: asyncio.Event,
    seed: int,
    question_tokens: int,
) -> None:
    import httpx

    rng = random.Random(seed)
    weights = zipf_weights(len(prefixes))
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as client:
        while not stop.is_set():
            tenant = rng.choices(range(len(prefixes)), weights)[0]
            prompt = prefixes[tenant] + [rng.randrange(10, 2000) for _ in range(question_tokens)]
            records.append(await post_prompt(client, url, NAME, prompt, origin))
            if not records[-1].ok:
                await asyncio.sleep(0.2)


def summarize(
    scenario: str, mode: str, records: list[Record], event: float, steady: float, window: float, bin_seconds: float
) -> Result:
    before = hit_rate([r for r in records if event - steady <= r.start < event])
    after = [r for r in records if event <= r.start < event + window]
    bins = []
    for i in range(int(window // bin_seconds)):
        inside = [r for r in after if event + i * bin_seconds <= r.start < event + (i + 1) * bin_seconds]
        if inside:
            bins.append((i * bin_seconds, hit_rate(inside)))
    recovery = next((t + bin_seconds for t, rate in bins if rate >= before - RECOVERY_TOLERANCE), None)
    return Result(
        scenario,
        mode,
        before,
        len(after),
        sum(r.prompt_tokens - r.cached_tokens for r in after if r.ok),
        recovery,
        sum(1 for r in after if not r.ok),
        bins,
        sum(r.prompt_tokens for r in after if r.ok),
    )


async def annotate_deletion_costs_now(emulator, engines, interval_seconds: float) -> None:
    """What the autoscaler does before a scale-in: each pod's hit tokens over the last interval as its cost."""
    import httpx

    from pagedinfer.contracts import metric_names as m
    from pagedinfer.operator.autoscaling.readings import PodReading
    from pagedinfer.operator.routing.deletion_cost import DELETION_COST_ANNOTATION, deletion_costs
    from pagedinfer.testing.kubelet_harness import PODS

    async def hits(client, e) -> float:
        text = (await client.get(f"http://{e.ip}:{e.port}/metrics")).text
        line = next(ln for ln in text.splitlines() if ln.startswith(m.PREFIX_CACHE_HITS.sample))
        return float(line.rsplit(" ", 1)[1])

    async with httpx.AsyncClient(timeout=5.0) as client:
        first = {e.pod_name: await hits(client, e) for e in engines.engines}
        await asyncio.sleep(interval_seconds)
        second = {e.pod_name: await hits(client, e) for e in engines.engines}
    readings = {name: PodReading(prefix_cache_hit_tokens=second[name] - first[name]) for name in second}
    for name, cost in deletion_costs(readings).items():
        await emulator.merge(PODS, NS, name, {"metadata": {"annotations": {DELETION_COST_ANNOTATION: str(cost)}}})


async def run_one(args: argparse.Namespace, scenario: str, mode: str, work: Path) -> Result:
    from pagedinfer.testing.endpoint_slices import EndpointSliceController
    from pagedinfer.testing.kubelet_harness import KubeletHarness, loopback_ip
    from pagedinfer.testing.operator_harness import (
        DEPLOYMENTS,
        ISVC,
        running_operator,
        serving_emulator,
        write_kubeconfig,
    )
    from pagedinfer.testing.pod_process import local_process

    asyncio.get_running_loop().add_signal_handler(  # `kill -USR2 PID`: every task's stack
        signal.SIGUSR2, lambda: [t.print_stack(file=sys.stderr) for t in asyncio.all_tasks()]
    )
    start_replicas = 2 if scenario == "scale-up" else 3
    spec = {
        "resources": {"gpus": 0},
        "replicas": start_replicas,
        "maxReplicas": 3,
        "engine": {"numGpuBlocksOverride": args.blocks, "maxModelLen": args.prefix_tokens + 256},
        "router": {
            "replicas": 1,
            "warmup": {"prefixes": args.warmup_prefixes if mode == "c" else 0, "tokenBudget": args.warmup_token_budget},
        },
    }
    prefixes = tenant_prefixes(args.tenants, args.prefix_tokens)
    records: list[Record] = []
    router = None
    async with serving_emulator() as (emulator, api_url):
        os.environ["KUBECONFIG"] = str(write_kubeconfig(work / "kubeconfig", api_url))
        await emulator.create(
            ISVC,
            {
                "apiVersion": "serving.pagedinfer.dev/v1alpha1",
                "kind": "InferenceService",
                "metadata": {"name": NAME, "namespace": NS},
                "spec": spec,
            },
        )
        engines = KubeletHarness(
            emulator, NS, NAME, work, max_engines=3, lifecycle=True, ready_timeout_seconds=300, first_ip=args.first_ip
        )
        slices = EndpointSliceController(emulator, NS, NAME + "-engines")
        stop = asyncio.Event()
        async with engines.running(), slices.running(), running_operator():
            # The router first: with warm-up on the engine pods turn Ready only once it has opened their gate.
            while emulator.read(DEPLOYMENTS, NS, NAME + "-router") is None:
                await asyncio.sleep(0.3)
            template = emulator.read(DEPLOYMENTS, NS, NAME + "-router")["spec"]["template"]
            ip = loopback_ip(first=args.first_ip + 10)  # above the engines' addresses
            local = local_process(template["spec"], ip, work / "router-pod", Path(sys.executable).parent)
            with open(work / "router.log", "wb") as log:
                router = subprocess.Popen(
                    [*local.argv, "--kube-api", api_url, "--namespace", NS],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **local.env, "OMP_NUM_THREADS": "1"},
                )
            url = f"http://{ip}:8000"
            while len(engines.engines) < start_replicas:
                await asyncio.sleep(0.3)
            await wait_routable(url, start_replicas)
            origin = time.monotonic()
            if args.trace_requests:
                try:
                    return await by_count(args, scenario, mode, url, prefixes, emulator, engines, origin)
                finally:
                    router.terminate()
                    router.wait(30)
                    await engines.stop_all()
            clients = [
                asyncio.create_task(client_loop(url, prefixes, records, origin, stop, seed, args.question_tokens))
                for seed in range(args.concurrency)
            ]
            try:
                await asyncio.sleep(args.steady_seconds)
                if scenario == "scale-in" and mode in ("b", "c"):
                    await annotate_deletion_costs_now(emulator, engines, args.cost_interval_seconds)
                event = time.monotonic() - origin
                await start_event(args, scenario, "a", emulator, engines)  # the costs, if any, are written
                await asyncio.sleep(args.window_seconds)
                await settled(emulator, engines)
                if scenario == "rollout":
                    done = rolled(emulator, engines)
                    print(f"  rollout {'complete' if done else 'NOT complete'} at the window's end", flush=True)
            finally:
                stop.set()
                await asyncio.gather(*clients)
                if router is not None:
                    router.terminate()
                    router.wait(30)
                await engines.stop_all()  # while the operator runs: it must see its pods go
    return summarize(scenario, mode, records, event, args.steady_seconds, args.window_seconds, args.bin_seconds)


def rolled(emulator, engines) -> bool:
    """Every engine runs the Deployment's current pod template (a rolling update is over)."""
    from pagedinfer.testing.operator_harness import DEPLOYMENTS
    from pagedinfer.testing.pod_lifecycle import template_key

    current = template_key(emulator.read(DEPLOYMENTS, NS, NAME)["spec"]["template"])
    return all(template_key(e.template) == current for e in engines.engines)


async def settled(emulator, engines, bound_seconds: float = 180.0) -> None:
    """Until no pod is terminating and the harness runs the Deployment's replicas (the operator must still be
    running while the kubelet harness deletes pods), at most `bound_seconds`."""
    from pagedinfer.testing.kubelet_harness import PODS

    deadline = time.monotonic() + bound_seconds
    while time.monotonic() < deadline:
        pods = emulator.read_all(PODS, NS)
        if len(engines.engines) == engines.desired_replicas() == len(pods) and not any(
            p["metadata"].get("deletionTimestamp") for p in pods
        ):
            return
        await asyncio.sleep(0.5)


async def wait_routable(url: str, engines: int) -> None:
    """Until the router has `engines` healthy engines (a pod waiting on its gate is healthy but not routable:
    callers wait for the pods to be Ready first), then one discovery poll and one health check more."""
    import re

    import httpx

    async with httpx.AsyncClient(timeout=10.0) as client:
        for _ in range(600):
            try:
                text = (await client.get(url + "/metrics")).text
                if len(re.findall(r"^pagedinfer_router_engine_healthy\{[^}]*\} 1", text, re.M)) >= engines:
                    await asyncio.sleep(2.0)
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.5)
    raise RuntimeError(f"the router at {url} never had {engines} healthy engines")


async def by_count(args, scenario: str, mode: str, url: str, prefixes, emulator, engines, origin: float) -> TraceResult:
    """The steady trace, the event with no traffic, then the next `--trace-requests` of the same trace."""
    prompts = trace(prefixes, args.steady_requests + args.trace_requests, seed=7, question_tokens=args.question_tokens)
    before = await send_trace(url, NAME, prompts[: args.steady_requests], args.concurrency, origin)
    stop_probe, event_at = asyncio.Event(), time.monotonic()
    probe_prompts = trace(prefixes, 10_000, seed=11, question_tokens=args.question_tokens) if args.probe_ttft else []
    probe = asyncio.create_task(probe_ttft(url, NAME, probe_prompts, stop_probe))
    desired = await start_event(args, scenario, mode, emulator, engines)
    await asyncio.sleep(1.0)  # the Deployment changed; the harness acts at its next pass
    await settled(emulator, engines, bound_seconds=600.0)
    while scenario == "rollout" and not rolled(emulator, engines):  # settled also between two of its steps
        await asyncio.sleep(1.0)
        await settled(emulator, engines, bound_seconds=600.0)
    await wait_routable(url, desired)
    event_seconds = time.monotonic() - event_at
    stop_probe.set()
    ttft_ms = await probe
    after = await send_trace(url, NAME, prompts[args.steady_requests :], args.concurrency, origin)
    result = summarize_trace(scenario, mode, before, after)
    result.warmup_tokens, result.event_seconds = await router_warmup_tokens(url), event_seconds
    result.probe_ttft_ms = ttft_ms
    return result


async def start_event(args, scenario: str, mode: str, emulator, engines) -> int:
    """Make the event happen (its deletion costs first in modes b and c); the replicas it leads to."""
    from pagedinfer.testing.operator_harness import ISVC

    if scenario == "scale-in" and mode in ("b", "c"):
        await annotate_deletion_costs_now(emulator, engines, args.cost_interval_seconds)
    if scenario == "scale-in":
        await emulator.merge(ISVC, NS, NAME, {"spec": {"replicas": 2}})
        return 2
    if scenario == "scale-up":
        await emulator.merge(ISVC, NS, NAME, {"spec": {"replicas": 3}})
        return 3
    await emulator.merge(ISVC, NS, NAME, {"spec": {"engine": {"env": [{"name": "ROLL", "value": "2"}]}}})
    return 3


def plot(results: list[Result], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SCENARIOS), figsize=(15, 4), sharey=True)
    labels = {"a": "a: default victim, cold pods", "b": "b: deletion cost only", "c": "c: drain + warm-up + cost"}
    for ax, scenario in zip(axes, SCENARIOS):
        for r in (r for r in results if r.scenario == scenario):
            xs = [t for t, _ in r.bins]
            ax.plot(xs, [h for _, h in r.bins], marker=".", label=labels[r.mode])
            ax.axhline(r.hit_rate_before, linestyle=":", linewidth=0.8, color=ax.lines[-1].get_color())
        ax.legend(loc="lower right", fontsize=7)
        ax.set_title(f"{scenario} (dotted: each run's level before the event)")
        ax.set_xlabel("seconds after the event")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("prefix-cache hit rate (cached / prompt tokens)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(results: list[Result], prompt_tokens_per_request: int) -> str:
    lines = [
        "| event | mode | hit rate before | requests in window | recomputed prefill tokens | of them above the"
        " level before | back to level after | aborted |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        recovery = "not within the window" if r.recovery_seconds is None else f"{r.recovery_seconds:.0f} s"
        lines.append(
            f"| {r.scenario} | {r.mode} | {r.hit_rate_before:.1%} | {r.requests_in_window} |"
            f" {r.recomputed_tokens:,} | {r.excess_recomputed_tokens(prompt_tokens_per_request):,} |"
            f" {recovery} | {r.aborted} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--modes", default="a,b,c", help="which of a, b, c to run (each scenario runs those it has)")
    p.add_argument("--tenants", type=int, default=30)
    p.add_argument("--prefix-tokens", type=int, default=1024)
    p.add_argument("--question-tokens", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=6)
    p.add_argument("--blocks", type=int, default=1200, help="KV blocks per engine (16 tokens each)")
    p.add_argument("--steady-seconds", type=float, default=40.0)
    p.add_argument("--window-seconds", type=float, default=120.0)
    p.add_argument("--bin-seconds", type=float, default=5.0)
    p.add_argument("--cost-interval-seconds", type=float, default=5.0)
    p.add_argument("--warmup-prefixes", type=int, default=32)
    p.add_argument("--warmup-token-budget", type=int, default=32768)
    p.add_argument(
        "--first-ip",
        type=int,
        default=2,
        help="engines on 127.0.0.x from x = this, the router 10 above (apart ranges for parallel runs)",
    )
    p.add_argument("--plot", type=Path, default=None)
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument(
        "--plot-from",
        type=Path,
        nargs="*",
        default=None,
        help="only plot and tabulate these --json-out files (runs made apart, e.g. in parallel)",
    )
    p.add_argument(
        "--trace-requests",
        type=int,
        default=0,
        help="by count (bench/lifecycle_trace.py): send this many requests of a fixed trace after the event,"
        " none during it (0: by time, --steady-seconds and --window-seconds)",
    )
    p.add_argument("--steady-requests", type=int, default=200, help="with --trace-requests: the trace before the event")
    p.add_argument(
        "--probe-ttft",
        action="store_true",
        help="with --trace-requests: one more user sends requests (max_tokens 1) while the event happens,"
        " each one's time to its token recorded (bench/warmup_sweep.py)",
    )
    p.add_argument("--smoke", action="store_true", help="2 tenants, 1 s windows, scale-in mode c only")
    args = p.parse_args(argv)
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID`: every thread's stack, for a run that seems stuck
    if args.smoke:
        args.scenarios, args.modes, args.tenants, args.prefix_tokens = "scale-in", "c", 2, 64
        args.steady_seconds, args.window_seconds, args.bin_seconds, args.cost_interval_seconds = 3.0, 3.0, 1.0, 0.5
        args.blocks, args.concurrency = 64, 2
    if args.plot_from:
        merged = [
            Result(**{**r, "bins": [tuple(b) for b in r["bins"]]})
            for path in args.plot_from
            for r in json.loads(path.read_text())
        ]
        merged.sort(key=lambda r: (SCENARIOS.index(r.scenario), r.mode))
        print(table(merged, args.prefix_tokens + args.question_tokens))
        if args.plot:
            plot(merged, args.plot)
        return 0
    results: list = []
    show = trace_table if args.trace_requests else lambda rs: table(rs, args.prefix_tokens + args.question_tokens)
    for scenario in args.scenarios.split(","):
        for mode in (m for m in MODES[scenario] if m in args.modes.split(",")):
            with tempfile.TemporaryDirectory(prefix=f"lifecycle-{scenario}-{mode}-") as work:
                print(f"{scenario} mode {mode} ...", flush=True)
                result = asyncio.run(run_one(args, scenario, mode, Path(work)))
            results.append(result)
            if args.json_out:  # after each run: a later failure loses nothing
                args.json_out.write_text(json.dumps([asdict(r) for r in results], indent=2))
            print(show([result]).splitlines()[-1], flush=True)
    print(show(results))
    if args.json_out:
        args.json_out.write_text(json.dumps([asdict(r) for r in results], indent=2))
    if args.plot and not args.trace_requests:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
