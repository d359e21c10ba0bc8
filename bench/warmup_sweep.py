"""Sweep the warm-up's K (`--warmup-prefixes`) and token budget on the scale 2 -> 3 event, by count.

Each setting is one run of bench/routing_lifecycle.py in mode c by count
(`--scenarios scale-up --modes c --trace-requests N --probe-ttft`): the
operator, the kubelet harness with real engine processes, the real router;
the same seeded trace before and after the event in every run. K 0 is the
paired run without warm-up (mode c with warm-up off is mode a for a
scale-up). The runs go side by side (each on its own 127.0.0.x range), so
they share the machine's load; the load average is read at each run's start
and end.

Per setting: the warm-up prompt tokens the router replayed (its
`pagedinfer_router_warmup_prompt_tokens_total`); the prefill tokens
recomputed over the trace's N requests after the event; the tokens saved
against K 0 and per warm-up token; and the time to the one token of a probe
user's requests (one at a time, `max_tokens` 1) sent from the event until
the new pod is routable: the window that holds the warm-up.

    OMP_NUM_THREADS=1 .venv/bin/python -P bench/warmup_sweep.py --settings 0:32768,4:32768,8:32768,16:32768,32:32768,32:16384

`--from DIR` only tabulates a finished sweep's JSON files.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Setting:
    prefixes: int  # K
    token_budget: int

    @property
    def stem(self) -> str:
        return f"k{self.prefixes}-b{self.token_budget}"


def parse_settings(text: str) -> list[Setting]:
    """`K:BUDGET,K:BUDGET,...`; one of them must have K 0 (the run without warm-up every other is compared to)."""
    settings = []
    for item in text.split(","):
        k, _, budget = item.partition(":")
        if not (k.isdigit() and budget.isdigit()):
            raise ValueError(f"--settings: each item is K:BUDGET (two integers >= 0), got {item!r}")
        settings.append(Setting(int(k), int(budget)))
    if not any(s.prefixes == 0 or s.token_budget == 0 for s in settings):
        raise ValueError("--settings: one setting must turn warm-up off (K 0), the baseline the others save against")
    return settings


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by the nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def sweep_table(rows: list[dict]) -> str:
    """rows: one per setting, each a TraceResult's fields plus `prefixes`, `token_budget`, `load_start`, `load_end`."""
    base = next(r for r in rows if r["prefixes"] == 0 or r["token_budget"] == 0)
    base_ttft = base["probe_ttft_ms"]
    lines = [
        "| K | token budget | warm-up tokens replayed | recomputed prefill tokens | saved against K 0 | saved per"
        " warm-up token | of them in the first quarter | event to routable | probe TTFT median / p90 (n) |"
        " median / p90 against K 0 | load average |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["prefixes"], r["token_budget"])):
        saved = base["recomputed_tokens"] - r["recomputed_tokens"]
        per = f"{saved / r['warmup_tokens']:.2f}" if r["warmup_tokens"] else "-"
        ttft = r["probe_ttft_ms"]
        med, p90 = statistics.median(ttft) if ttft else float("nan"), percentile(ttft, 0.9)
        d_med = med - (statistics.median(base_ttft) if base_ttft else float("nan"))
        d_p90 = p90 - percentile(base_ttft, 0.9)
        lines.append(
            f"| {r['prefixes']} | {r['token_budget']:,} | {r['warmup_tokens']:,} | {r['recomputed_tokens']:,} |"
            f" {saved:,} | {per} | {r['recomputed_first_quarter']:,} | {r['event_seconds']:.0f} s |"
            f" {med:.0f} / {p90:.0f} ms ({len(ttft)}) | {d_med:+.0f} / {d_p90:+.0f} ms |"
            f" {r['load_start']:.1f} -> {r['load_end']:.1f} |"
        )
    return "\n".join(lines)


def run_sweep(args: argparse.Namespace, settings: list[Setting]) -> None:
    """Start one bench/routing_lifecycle.py per setting, side by side; write DIR/STEM.json with the load averages."""
    args.out.mkdir(parents=True, exist_ok=True)
    procs = []
    for i, s in enumerate(settings):
        argv = [
            sys.executable,
            "-P",
            str(BENCH / "routing_lifecycle.py"),
            *("--scenarios", "scale-up", "--modes", "c", "--probe-ttft"),
            *("--trace-requests", str(args.trace_requests), "--steady-requests", str(args.steady_requests)),
            *("--warmup-prefixes", str(s.prefixes), "--warmup-token-budget", str(s.token_budget)),
            *("--first-ip", str(args.first_ip + i * 15), "--json-out", str(args.out / f"{s.stem}.run.json")),
        ]
        log = open(args.out / f"{s.stem}.log", "wb")  # noqa: SIM115  (closed once the run ends, below)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs.append(
            (s, os.getloadavg()[0], subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env), log)
        )
        print(f"started K {s.prefixes}, budget {s.token_budget} (log {args.out / s.stem}.log)", flush=True)
    for s, load_start, proc, log in procs:
        rc = proc.wait()
        log.close()
        run = args.out / f"{s.stem}.run.json"
        if rc != 0 or not run.exists():
            print(f"K {s.prefixes}, budget {s.token_budget}: failed (exit {rc}); see its log", flush=True)
            continue
        row = {**json.loads(run.read_text())[0], "prefixes": s.prefixes, "token_budget": s.token_budget}
        row.update(load_start=load_start, load_end=os.getloadavg()[0], finished=time.time())
        (args.out / f"{s.stem}.json").write_text(json.dumps(row, indent=2))
        print(f"K {s.prefixes}, budget {s.token_budget}: done", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", default="0:32768,4:32768,8:32768,16:32768,32:32768,32:16384", help="K:BUDGET,...")
    p.add_argument("--trace-requests", type=int, default=200)
    p.add_argument("--steady-requests", type=int, default=200)
    p.add_argument("--first-ip", type=int, default=160, help="run i on 127.0.0.x from x = this + 15 i")
    p.add_argument("--out", type=Path, default=Path("warmup-sweep"), help="a folder for each run's log and JSON")
    p.add_argument("--from", dest="from_dir", type=Path, default=None, help="only tabulate this folder's runs")
    args = p.parse_args(argv)
    settings = parse_settings(args.settings)
    if args.from_dir is None:
        if args.first_ip + 15 * (len(settings) - 1) + 10 > 254:
            raise ValueError("--first-ip: the last run's router would pass 127.0.0.254; fewer settings or a lower one")
        run_sweep(args, settings)
    folder = args.from_dir or args.out
    rows = [
        json.loads((folder / f"{s.stem}.json").read_text()) for s in settings if (folder / f"{s.stem}.json").exists()
    ]
    if not any(r["prefixes"] == 0 or r["token_budget"] == 0 for r in rows):
        print("the run without warm-up (K 0) did not finish: nothing to compare against", flush=True)
        return 1
    print(sweep_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
