"""Does the prefix-cache hit rate still fall as replicas are added, once a router fronts them?

The autoscaler lets `prefixCacheHitRate` vote only while `kvCacheUsage` asks
for more replicas (docs/autoscaling.md): behind a plain Service, every replica
added spread each tenant over more engines and lowered every engine's hit
rate, so a hit-rate vote on its own would have scaled up without end. This
runs bench/routing.py's workload (the same tenants and turns, the same
request sequence) on N = `--replicas` engines of `--blocks` KV blocks each,
behind `pagedinfer router` with each policy, and reports the aggregate hit
rate (the engines' own counters) per N.

    OMP_NUM_THREADS=1 .venv/bin/python bench/routing_replicas.py --replicas 1,2,4 --policies round-robin,prefix
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import routing  # noqa: E402  (bench/routing.py: the workload, the processes and the counters)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", default="1,2,4", help="engine counts, comma-separated (at most 4)")
    p.add_argument("--policies", default="round-robin,prefix")
    p.add_argument("--tenants", type=int, default=16)
    p.add_argument("--turns", type=int, default=12)
    p.add_argument("--system-words", type=int, default=200)
    p.add_argument("--blocks", type=int, default=352, help="KV blocks per engine (16 tokens each)")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--logs", type=Path, default=Path("routing-logs"))
    p.add_argument("--json-out", type=Path, default=None)
    args = p.parse_args(argv)
    counts = [int(n) for n in args.replicas.split(",")]
    if not all(1 <= n <= len(routing.HOSTS) for n in counts):
        p.error(f"--replicas: each count must be 1..{len(routing.HOSTS)}, got {args.replicas}")
    args.logs.mkdir(parents=True, exist_ok=True)
    convs = routing.workload(args.tenants, args.turns, args.system_words)
    rows = []
    for policy in args.policies.split(","):
        for n in counts:
            args.engines = n
            r = routing.run_system(f"{policy}-{n}", policy, args, convs, args.logs)
            rows.append({"policy": policy, "replicas": n, **r})
            print(
                f"{policy:<12}{n:>3} replicas  hit rate {r['hit_rate']:6.1%}  TTFT p90 {r['ttft_p90']:.3f}s"
                f"  {r['tok_per_s']:.1f} tok/s  requests per engine {r['requests_per_engine']}",
                flush=True,
            )
    if args.json_out:
        args.json_out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
