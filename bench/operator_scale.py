"""Operator scale benchmark: N InferenceServices applied at once, against the KubeEmulator on 127.0.0.1.

    .venv/bin/python bench/operator_scale.py --services 100 --rounds 3

Each round starts a fresh emulator (4 GPU nodes) and a fresh operator (the
real kopf runtime and handlers, over HTTP), creates N services at once and
measures:

- wall time until every service is reconciled (Sized=True, observedGeneration
  1, Deployment and Service present), and per-service time to reconciled;
- API requests per service: all requests the operator process made (kopf's
  watches and patches included) and the handlers' own (`KubeApi.calls`);
- a restart with all N services present: requests per service when nothing
  changed (the idempotent apply should only read).

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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "support"))

from kube_emulator import KubeEmulator  # noqa: E402
from operator_harness import (DEPLOYMENTS, FAST_CONFIG, ISVC, SERVICES, add_gpu_node, inference_service,  # noqa: E402
                              running_operator, serving_emulator, write_kubeconfig)

ARCH = {"numLayers": 32, "numKVHeads": 8, "headDim": 128, "numParameters": 8_030_261_248}


def reconciled(emulator: KubeEmulator, name: str) -> bool:
    isvc = emulator.read(ISVC, "default", name)
    status = (isvc or {}).get("status") or {}
    sized = [c for c in status.get("conditions") or [] if c["type"] == "Sized" and c["status"] == "True"]
    return bool(sized and status.get("observedGeneration") == 1
                and emulator.read(DEPLOYMENTS, "default", name) and emulator.read(SERVICES, "default", name))


async def one_round(num_services: int, tmp: Path, timeout_seconds: float) -> dict[str, float]:
    async with serving_emulator() as (emulator, url):
        os.environ["KUBECONFIG"] = str(write_kubeconfig(tmp / "kubeconfig", url))
        for i, memory in enumerate((81559, 81559, 46068, 143771)):
            await add_gpu_node(emulator, f"gpu-{i}", memory)
        names = [f"svc-{i:03d}" for i in range(num_services)]
        async with running_operator() as runtime:
            await asyncio.sleep(0.2)  # let the watches settle before the burst
            calls_before, handler_calls_before = len(emulator.calls), runtime.kube.calls
            started = time.monotonic()
            for name in names:
                await emulator.create(ISVC, inference_service(name, {
                    "model": {"uri": f"hf://org/{name}", "allowDownload": True, "architecture": ARCH}}))
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
            handler_calls = runtime.kube.calls - handler_calls_before
        calls_before = len(emulator.calls)
        async with running_operator() as runtime:
            restart_started = time.monotonic()
            while runtime.metrics.reconciles.labels(result="applied")._value.get() < num_services:
                if time.monotonic() - restart_started > timeout_seconds:
                    raise TimeoutError("the restarted operator did not resume every service")
                await asyncio.sleep(0.01)
            restart_handler_calls = runtime.kube.calls
        restart_calls = len(emulator.calls) - calls_before
        writes_on_restart = sum(1 for access, _ in emulator.calls[calls_before:]
                                if access.verb in ("create", "patch", "update") and access.resource != "events"
                                and access.resource != "inferenceservices")
    return {
        "wall_seconds": wall,
        "median_seconds_to_reconciled": statistics.median(done.values()),
        "p95_seconds_to_reconciled": sorted(done.values())[max(0, int(0.95 * len(done)) - 1)],
        "api_calls_per_service": calls / num_services,
        "handler_api_calls_per_service": handler_calls / num_services,
        "restart_api_calls_per_service": restart_calls / num_services,
        "restart_handler_calls_per_service": restart_handler_calls / num_services,
        "restart_child_writes": writes_on_restart,
    }


def median_of(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


async def main_async(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"operator-scale-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    results = {}
    for n in (1, args.services):
        rounds = [await one_round(n, tmp, args.timeout_seconds) for _ in range(args.rounds)]
        results[str(n)] = median_of(rounds)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", type=int, default=100, help="InferenceServices applied at once (default 100)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per size; medians are reported (default 3)")
    parser.add_argument("--timeout-seconds", type=float, default=300.0)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("kopf").setLevel(logging.CRITICAL)
    results = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    one, many = results["1"], results[str(args.services)]
    print(f"operator scale: {args.services} InferenceServices at once vs 1 (median of {args.rounds} rounds; "
          f"FAST_CONFIG retry delays; emulator on 127.0.0.1)")
    rows = [
        ("wall time until all reconciled (s)", one["wall_seconds"], many["wall_seconds"]),
        ("median time to reconciled (s)", one["median_seconds_to_reconciled"], many["median_seconds_to_reconciled"]),
        ("p95 time to reconciled (s)", one["p95_seconds_to_reconciled"], many["p95_seconds_to_reconciled"]),
        ("API calls per service (all)", one["api_calls_per_service"], many["api_calls_per_service"]),
        ("API calls per service (handlers)", one["handler_api_calls_per_service"],
         many["handler_api_calls_per_service"]),
        ("after restart: API calls per service", one["restart_api_calls_per_service"],
         many["restart_api_calls_per_service"]),
        ("after restart: handler calls per service", one["restart_handler_calls_per_service"],
         many["restart_handler_calls_per_service"]),
        ("after restart: child writes (total)", one["restart_child_writes"], many["restart_child_writes"]),
    ]
    print(f"{'':44}{'N=1':>10}{'N=' + str(args.services):>10}")
    for label, a, b in rows:
        print(f"{label:44}{a:10.3f}{b:10.3f}")
    print(f"per-service wall time at N={args.services} / at N=1: "
          f"{many['wall_seconds'] / args.services / one['wall_seconds']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
