"""Sweep the warm-up's K (`--warmup-prefixes`) and token budget on the scale 2 -> 3 event, by count.

Each setting is one run of bench/routing_lifecycle.py in mode c by count
(`--scenarios scale-up --modes c --trace-requests N --probe-ttft`): the
operator, the kubelet harness with real engine processes, the real router;
the same seeded trace before and after the event in every run. K 0 is the
paired run without warm-up (mode c with warm-up off is mode a for a
scale-up). The runs go side by side (each on its own 127.0.0.x range), so
they share the machine's load; the 1-minute load average is read at each
run's start and every 5 s while it runs (its peak reported).

Per setting: the warm-up prompt tokens the router replayed (its
`pagedinfer_router_warmup_prompt_tokens_total`); the prefill tokens
recomputed over the trace's N requests after the event; the tokens saved
against K 0 and per warm-up token; and the time to the one token of a probe
user's requests (one at a time, `max_tokens` 1) sent from the event until
the new pod is routable: the window that holds the warm-up.

    OMP_NUM_THREADS=1 .venv/bin/python -P bench/warmup_sweep.py --settings 0:32768,4:32768,8:32768,16:32768,32:32768,32:16384

`--from DIR [DIR ...]` only tabulates finished sweeps: each one's table, then each setting over them all.
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
from math import nan
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


def baseline(rows: list[dict]) -> dict:
    """The sweep's run without warm-up (K 0 or budget 0)."""
    return next(r for r in rows if r["prefixes"] == 0 or r["token_budget"] == 0)


def against(row: dict, base: dict) -> tuple[int, float, float]:
    """A run against its sweep's K 0 run: prefill tokens saved, probe TTFT median and p90 deltas (ms)."""
    ttft, base_ttft = row["probe_ttft_ms"], base["probe_ttft_ms"]
    med = (statistics.median(ttft) if ttft else nan) - (statistics.median(base_ttft) if base_ttft else nan)
    return base["recomputed_tokens"] - row["recomputed_tokens"], med, percentile(ttft, 0.9) - percentile(base_ttft, 0.9)


def load_after(row: dict) -> str:
    """The peak load average while the run went (a first version of this script read it at the end only)."""
    return f"peak {row['load_peak']:.1f}" if "load_peak" in row else f"at the end {row.get('load_end', nan):.1f}"


def sweep_table(rows: list[dict]) -> str:
    """rows: one per setting, each a TraceResult's fields plus `prefixes`, `token_budget`, `load_start`, `load_peak`."""
    base = baseline(rows)
    lines = [
        "| K | token budget | warm-up tokens replayed | recomputed prefill tokens | saved against K 0 | saved per"
        " warm-up token | of them in the first quarter | event to routable | probe TTFT median / p90 (n) |"
        " median / p90 against K 0 | load average at the start, peak |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["prefixes"], r["token_budget"])):
        saved, d_med, d_p90 = against(r, base)
        per = f"{saved / r['warmup_tokens']:.2f}" if r["warmup_tokens"] else "-"
        ttft = r["probe_ttft_ms"]
        med, p90 = statistics.median(ttft) if ttft else nan, percentile(ttft, 0.9)
        lines.append(
            f"| {r['prefixes']} | {r['token_budget']:,} | {r['warmup_tokens']:,} | {r['recomputed_tokens']:,} |"
            f" {saved:,} | {per} | {r['recomputed_first_quarter']:,} | {r['event_seconds']:.0f} s |"
            f" {med:.0f} / {p90:.0f} ms ({len(ttft)}) | {d_med:+.0f} / {d_p90:+.0f} ms |"
            f" {r['load_start']:.1f}, {load_after(r)} |"
        )
    return "\n".join(lines)


def summary_table(sweeps: list[list[dict]]) -> str:
    """Each setting over every sweep that ran it, each against its own sweep's K 0 run: the mean and range."""
    by_setting: dict[tuple[int, int], list[tuple[int, int, float, float]]] = {}
    for rows in sweeps:
        base = baseline(rows)
        for r in rows:
            if r is not base:
                by_setting.setdefault((r["prefixes"], r["token_budget"]), []).append(
                    (r["warmup_tokens"], *against(r, base))
                )
    lines = [
        "| K | token budget | sweeps | warm-up tokens replayed (mean) | saved against K 0: mean (range) | saved per"
        " warm-up token | probe TTFT median / p90 against K 0 (mean) |",
        "|---|---|---|---|---|---|---|",
    ]
    for (k, budget), runs in sorted(by_setting.items()):
        warm, saved = [w for w, *_ in runs], [s for _, s, _, _ in runs]
        per = f"{sum(saved) / sum(warm):.2f}" if sum(warm) else "-"
        lines.append(
            f"| {k} | {budget:,} | {len(runs)} | {statistics.mean(warm):,.0f} | {statistics.mean(saved):,.0f}"
            f" ({min(saved):,} .. {max(saved):,}) | {per} | {statistics.mean(m for *_, m, _ in runs):+.0f} /"
            f" {statistics.mean(p for *_, p in runs):+.0f} ms |"
        )
    return "\n".join(lines)


def read_sweep(folder: Path) -> list[dict]:
    """A sweep folder's runs (STEM.json; STEM.run.json is a run's own output)."""
    return [json.loads(f.read_text()) for f in sorted(folder.glob("k*-b*.json")) if not f.name.endswith(".run.json")]


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
    peak = {s: load for s, load, _, _ in procs}  # the highest 1-minute load average seen while each ran
    while any(proc.poll() is None for _, _, proc, _ in procs):
        time.sleep(5.0)
        for s, _, proc, _ in procs:
            if proc.poll() is None:
                peak[s] = max(peak[s], os.getloadavg()[0])
    for s, load_start, proc, log in procs:
        log.close()
        run = args.out / f"{s.stem}.run.json"
        if proc.returncode != 0 or not run.exists():
            print(f"K {s.prefixes}, budget {s.token_budget}: failed (exit {proc.returncode}); see its log", flush=True)
            continue
        row = {**json.loads(run.read_text())[0], "prefixes": s.prefixes, "token_budget": s.token_budget}
        row.update(load_start=load_start, load_peak=peak[s])
        (args.out / f"{s.stem}.json").write_text(json.dumps(row, indent=2))
        print(f"K {s.prefixes}, budget {s.token_budget}: done", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", default="0:32768,4:32768,8:32768,16:32768,32:32768,32:16384", help="K:BUDGET,...")
    p.add_argument("--trace-requests", type=int, default=200)
    p.add_argument("--steady-requests", type=int, default=200)
    p.add_argument("--first-ip", type=int, default=160, help="run i on 127.0.0.x from x = this + 15 i")
    p.add_argument("--out", type=Path, default=Path("warmup-sweep"), help="a folder for each run's log and JSON")
    p.add_argument(
        "--from",
        dest="from_dirs",
        type=Path,
        nargs="+",
        default=None,
        help="only tabulate these sweep folders (each its own K 0 run), then every setting over them",
    )
    args = p.parse_args(argv)
    settings = parse_settings(args.settings)
    if args.from_dirs is None:
        if args.first_ip + 15 * (len(settings) - 1) + 10 > 254:
            raise ValueError("--first-ip: the last run's router would pass 127.0.0.254; fewer settings or a lower one")
        run_sweep(args, settings)
    sweeps = [read_sweep(folder) for folder in args.from_dirs or [args.out]]
    for folder, rows in zip(args.from_dirs or [args.out], sweeps):
        if not any(r["prefixes"] == 0 or r["token_budget"] == 0 for r in rows):
            print(f"{folder}: the run without warm-up (K 0) did not finish: nothing to compare against", flush=True)
            return 1
        print(f"{folder}:\n{sweep_table(rows)}\n")
    if len(sweeps) > 1:
        print(summary_table(sweeps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
