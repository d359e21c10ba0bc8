"""Operator scale benchmark: N InferenceServices applied at once, against the KubeEmulator on 127.0.0.1.

    .venv/bin/python bench/operator_scale.py --services 100 --rounds 3 --nodes 10,100,1000

Each round starts a fresh emulator (with `--nodes` GPU nodes, one table per
count) and a fresh operator (the real kopf runtime and handlers, over HTTP),
creates N services at once and measures:

- wall time until every service is reconciled (Sized=True, observedGeneration
  1, Deployment and Service present), and per-service time to reconciled;
- API requests per service: all requests the operator process made (kopf's
  watches and patches included) and the handlers' own (`KubeApi.calls`);
- a restart with all N services present: requests per service when nothing
  changed (the idempotent apply should only read);
- node LISTs during the burst: sizing reads the nodes from kopf's index
  (one LIST and one watch at start), so neither this nor the calls per
  service may grow with the node count.

The peer measured in the same run is a single service (N=1): the report gives
the ratio of per-service time at N to it. Medians over rounds. Timings depend
on the machine and its load; compare ratios, not absolute numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path

from pagedinfer.testing.kube_emulator import KubeEmulator
from pagedinfer.testing.operator_harness import (
    DEPLOYMENTS,
    ISVC,
    NODES,
    SERVICES,
    add_gpu_node,
    inference_service,
    running_operator,
    serving_emulator,
    write_kubeconfig,
)

ARCH = {"numLayers": 32, "numKVHeads": 8, "headDim": 128, "numParameters": 8_030_261_248}
SPEC = {"model": {"uri": "hf://org/llama", "allowDownload": True, "architecture": ARCH}}


def reconciled(emulator: KubeEmulator, name: str) -> bool:
    isvc = emulator.read(ISVC, "default", name)
    status = (isvc or {}).get("status") or {}
    sized = [c for c in status.get("conditions") or [] if c["type"] == "Sized" and c["status"] == "True"]
    return bool(
        sized
        and status.get("observedGeneration") == 1
        and emulator.read(DEPLOYMENTS, "default", name)
        and emulator.read(SERVICES, "default", name)
    )


NODE_MEMORY_MIB = (81559, 81559, 46068, 143771)  # H100 80GB, L40S-like 45 GiB, H200


def node_lists(emulator: KubeEmulator, since: int) -> int:
    return sum(1 for access, _ in emulator.calls[since:] if access.verb == "list" and access.resource == "nodes")


async def one_round(num_services: int, num_nodes: int, tmp: Path, timeout_seconds: float) -> dict[str, float]:
    async with serving_emulator() as (emulator, url):
        os.environ["KUBECONFIG"] = str(write_kubeconfig(tmp / "kubeconfig", url))
        for i in range(num_nodes):
            await add_gpu_node(emulator, f"gpu-{i}", NODE_MEMORY_MIB[i % len(NODE_MEMORY_MIB)])
        names = [f"svc-{i:03d}" for i in range(num_services)]
        async with running_operator() as runtime:
            # One service first, untimed and uncounted: kopf starts handlers only once its
            # node index holds every node, and that one-off listing is not a service's cost.
            await emulator.create(ISVC, inference_service("warm-up", SPEC))
            while not reconciled(emulator, "warm-up"):
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)  # let the warm-up's rollout reports settle before the burst
            calls_before, handler_calls_before = len(emulator.calls), runtime.kube.calls
            started = time.monotonic()
            for name in names:
                await emulator.create(ISVC, inference_service(name, SPEC))
            done: dict[str, float] = {}
            while len(done) < len(names):
                now = time.monotonic()
                if now - started > timeout_seconds:
                    raise TimeoutError(f"only {len(done)}/{len(names)} reconciled in {timeout_seconds}s")
                for name in names:
                    if name not in done and reconciled(emulator, name):
                        done[name] = now - started
                await asyncio.sleep(0.01)
            wall = max(done.values())
            await asyncio.sleep(0.5)  # rollout reports that follow the last reconcile
            calls = len(emulator.calls) - calls_before
            burst_node_lists = node_lists(emulator, calls_before)
            node_list_bytes = len(json.dumps(emulator.read_all(NODES)))
            handler_calls = runtime.kube.calls - handler_calls_before
        calls_before = len(emulator.calls)
        async with running_operator() as runtime:
            restart_started = time.monotonic()
            while runtime.metrics.reconciles.labels(result="applied")._value.get() < num_services + 1:
                if time.monotonic() - restart_started > timeout_seconds:
                    raise TimeoutError("the restarted operator did not resume every service")
                await asyncio.sleep(0.01)
            restart_handler_calls = runtime.kube.calls
        restart_calls = len(emulator.calls) - calls_before
        writes_on_restart = sum(
            1
            for access, _ in emulator.calls[calls_before:]
            if access.verb in ("create", "patch", "update")
            and access.resource != "events"
            and access.resource != "inferenceservices"
        )
    return {
        "wall_seconds": wall,
        "median_seconds_to_reconciled": statistics.median(done.values()),
        "p95_seconds_to_reconciled": sorted(done.values())[max(0, int(0.95 * len(done)) - 1)],
        "api_calls_per_service": calls / num_services,
        "node_lists_per_service": burst_node_lists / num_services,
        "node_kib_listed_per_service": burst_node_lists * node_list_bytes / 1024 / num_services,
        "handler_api_calls_per_service": handler_calls / num_services,
        "restart_api_calls_per_service": restart_calls / (num_services + 1),  # the warm-up service too
        "restart_handler_calls_per_service": restart_handler_calls / (num_services + 1),
        "restart_child_writes": writes_on_restart,
    }


def median_of(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


async def main_async(args: argparse.Namespace) -> dict[str, dict[str, dict[str, float]]]:
    """{nodes: {services: medians}} for every node count and N in (1, --services)."""
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"operator-scale-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, dict[str, float]]] = {}
    for nodes in args.nodes:
        results[str(nodes)] = {}
        for n in (1, args.services):
            rounds = [await one_round(n, nodes, tmp, args.timeout_seconds) for _ in range(args.rounds)]
            results[str(nodes)][str(n)] = median_of(rounds)
    return results


def node_counts(text: str) -> list[int]:
    counts = [int(part) for part in text.split(",")]
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected node counts >= 1 such as 10,100,1000, got {text!r}")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", type=int, default=100, help="InferenceServices applied at once (default 100)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per size; medians are reported (default 3)")
    parser.add_argument(
        "--nodes",
        type=node_counts,
        default=[4],
        help="GPU nodes in the cluster, one table per count: e.g. 10,100,1000 (default 4)",
    )
    parser.add_argument("--timeout-seconds", type=float, default=300.0)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("kopf").setLevel(logging.CRITICAL)
    results = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for nodes, by_services in results.items():
        print_table(args, int(nodes), by_services["1"], by_services[str(args.services)])
    if len(results) > 1:
        many = {nodes: r[str(args.services)] for nodes, r in results.items()}
        print(
            f"API calls per service at N={args.services} by node count: "
            + ", ".join(f"{nodes} nodes {r['api_calls_per_service']:.2f}" for nodes, r in many.items())
        )
    return 0


def print_table(args: argparse.Namespace, nodes: int, one: dict[str, float], many: dict[str, float]) -> None:
    print(
        f"operator scale: {args.services} InferenceServices at once vs 1, {nodes} GPU nodes (median of "
        f"{args.rounds} rounds; FAST_CONFIG retry delays; emulator on 127.0.0.1)"
    )
    rows = [
        ("wall time until all reconciled (s)", one["wall_seconds"], many["wall_seconds"]),
        ("median time to reconciled (s)", one["median_seconds_to_reconciled"], many["median_seconds_to_reconciled"]),
        ("p95 time to reconciled (s)", one["p95_seconds_to_reconciled"], many["p95_seconds_to_reconciled"]),
        ("API calls per service (all)", one["api_calls_per_service"], many["api_calls_per_service"]),
        (
            "API calls per service (handlers)",
            one["handler_api_calls_per_service"],
            many["handler_api_calls_per_service"],
        ),
        ("node LISTs per service", one["node_lists_per_service"], many["node_lists_per_service"]),
        ("node KiB listed per service", one["node_kib_listed_per_service"], many["node_kib_listed_per_service"]),
        (
            "after restart: API calls per service",
            one["restart_api_calls_per_service"],
            many["restart_api_calls_per_service"],
        ),
        (
            "after restart: handler calls per service",
            one["restart_handler_calls_per_service"],
            many["restart_handler_calls_per_service"],
        ),
        ("after restart: child writes (total)", one["restart_child_writes"], many["restart_child_writes"]),
    ]
    print(f"{'':44}{'N=1':>10}{'N=' + str(args.services):>10}")
    for label, a, b in rows:
        print(f"{label:44}{a:10.3f}{b:10.3f}")
    print(
        f"per-service wall time at N={args.services} / at N=1: "
        f"{many['wall_seconds'] / args.services / one['wall_seconds']:.3f}"
    )


if __name__ == "__main__":
    sys.exit(main())
