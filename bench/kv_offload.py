"""The prefix cache's host tier, measured: a multi-turn chat workload whose working set is several times the
KV pool, through `pagedinfer serve` with the tier off and on (and through `pagedinfer router` with 2 engines).

Workload (bench/routing.py's): `--users` users, each a system prompt of `--system-words` words and a
conversation that grows by one user turn and one answer per request (`--turns`). Every user runs its turns
in order and all users run at once behind `--concurrency` slots; the slots are granted in arrival order, so
a user's next turn waits behind every other user's: each user returns after an idle gap of about
users / concurrency requests, by which time its blocks have left a pool smaller than the working set.

The model is a random-weight Llama with the embedded model's tokenizer (`--hidden-size`, `--layers`), big
enough that a prompt's prefill costs more than copying its blocks back. Every system sees the same requests
on fresh engines (`--blocks` KV blocks each; the tier `--kv-offloading-size` GiB).

Reported per system, from the engines' own counters: prefix hit rate (hits / queries, prompt tokens), the
tokens of those hits served from the tier, prompt tokens recomputed (queries - hits), TTFT p50/p90 (the
first streamed token), output tok/s over the run; and the working set over the pool.

    .venv/bin/python bench/kv_offload.py                  # the figures in docs/kv-offload.md
    .venv/bin/python bench/kv_offload.py --router         # 2 engines behind the router, tier off and on
    .venv/bin/python bench/kv_offload.py --smoke          # a tiny run (tests/bench)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import routing  # noqa: E402  (bench/routing.py: the workload, the processes, the load and the quantiles)

from pagedinfer.testing.server_process import wait_process_healthy  # noqa: E402


def make_model(out: Path, hidden_size: int, layers: int) -> Path:
    """A random-weight Llama with the embedded model's tokenizer (and chat template), cached at `out`."""
    from pagedinfer.contracts.embedded_model import default_model_dir
    from pagedinfer.engine.tiny_model import make_tiny_model

    if (out / "config.json").exists():
        return out
    return make_tiny_model(
        out,
        tokenizer_dir=default_model_dir(),
        hidden_size=hidden_size,
        intermediate_size=3 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        vocab_size=2048,
    )


def counters(url: str) -> dict[str, float]:
    from pagedinfer.contracts import metric_names as m
    from pagedinfer.engine.bench.scrape import sample_totals

    names = {
        "hits": m.PREFIX_CACHE_HITS.sample,
        "queries": m.PREFIX_CACHE_QUERIES.sample,
        "tier_hits": m.PREFIX_CACHE_OFFLOAD_HITS.sample,
        "prompt_tokens": m.PROMPT_TOKENS.sample,
        "blocks": m.KV_CACHE_NUM_BLOCKS.sample,
        "copy_seconds": m.KV_OFFLOAD_COPY_SECONDS.sample,
        "copy_bytes": m.KV_OFFLOAD_BYTES.sample,
    }
    totals = sample_totals(httpx.get(url + "/metrics", timeout=10).text, names.values())
    return {key: totals[name] or 0.0 for key, name in names.items()}  # copies: both directions summed


def cold_prefill_seconds(url: str, num_tokens: int) -> float:
    """The time to first token of one prompt of never-seen token ids on an idle engine (its prefill, all computed)."""
    body = {"model": "pagedinfer-default", "prompt": [7 + (i * 31) % 1900 for i in range(num_tokens)], "max_tokens": 1}
    t0 = time.monotonic()
    httpx.post(url + "/v1/completions", json=body, timeout=600).raise_for_status()
    return time.monotonic() - t0


def run_system(name: str, tier_gib: float, engines: int, args, convs, logs: Path) -> dict:
    procs, urls = [], []
    extra = (
        "--model",
        str(args.model),
        "--served-model-name",
        "pagedinfer-default",
        "--max-num-batched-tokens",
        str(args.max_num_batched_tokens),
        *(("--kv-offloading-size", f"{tier_gib:g}") if tier_gib else ()),
    )
    try:
        for i, host in enumerate(routing.HOSTS[:engines]):
            url, proc = routing.start_engine(
                host, args.blocks, args.max_model_len, logs / f"{name}-engine{i}.log", extra
            )
            procs.append(proc)
            urls.append(url)
        for url, proc in zip(urls, procs):
            wait_process_healthy(url, proc, timeout_seconds=300)
        target = urls[0]
        if engines > 1:
            port = routing.free_port("127.0.0.1")
            proc = routing.start(
                [
                    "router",
                    *[f for u in urls for f in ("--engine", u)],
                    "--policy",
                    "prefix",
                    "--port",
                    str(port),
                    "--log-level",
                    "warning",
                ],
                logs / f"{name}-router.log",
            )
            procs.append(proc)
            target = f"http://127.0.0.1:{port}"
            wait_process_healthy(target, proc)
            time.sleep(1.0)  # the router's KV feeds take their first snapshots
        result = asyncio.run(routing.run_load(target, convs, args.max_tokens, args.concurrency))
        totals = [counters(u) for u in urls]
        prefill = cold_prefill_seconds(urls[0], 64 * 16)  # 64 blocks, after the load: what a block costs to compute
    finally:
        routing.stop_all(procs)
    sums = {k: sum(t[k] for t in totals) for k in totals[0]}
    per_block = block_bytes(args.model)
    return {
        "system": name,
        "hit_rate": sums["hits"] / sums["queries"] if sums["queries"] else 0.0,
        "tier_hit_tokens": sums["tier_hits"],
        "recomputed_prompt_tokens": sums["queries"] - sums["hits"],
        "prompt_tokens_computed": sums["prompt_tokens"],
        "query_tokens": sums["queries"],
        "pool_blocks": sums["blocks"],
        "ttft_p50": statistics.median(result["ttfts"]),
        "ttft_p90": routing.quantile(result["ttfts"], 0.9),
        "tok_per_s": result["tokens"] / result["wall"],
        "requests": len(result["ttfts"]),
        "prefill_seconds_per_block": prefill / 64,
        "copy_seconds_per_block": (
            sums["copy_seconds"] / (sums["copy_bytes"] / per_block) if sums["copy_bytes"] else 0.0
        ),
    }


def block_bytes(model: Path, block_size: int = 16) -> int:
    """Bytes of one KV block of the model (float32, as the CPU engine runs it)."""
    config = json.loads((model / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 4 * block_size


def working_set_blocks(convs, model: Path, block_size: int = 16) -> int:
    """Blocks of every user's longest conversation (its last turn's prompt), the cache the workload would keep."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(model))

    def num_tokens(messages) -> int:
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return len(tok(text, add_special_tokens=False).input_ids)

    return sum(-(-num_tokens(c[-1]) // block_size) for c in convs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--users", type=int, default=24)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--system-words", type=int, default=150)
    p.add_argument("--blocks", type=int, default=300, help="KV blocks per engine (16 tokens each)")
    p.add_argument("--kv-offloading-size", type=float, default=0.25, help="GiB of host tier per engine (on)")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--repeats", type=int, default=1, help="runs per system, in alternating order; medians reported")
    p.add_argument("--router", action="store_true", help="2 engines behind `pagedinfer router` (policy prefix)")
    p.add_argument("--smoke", action="store_true", help="4 users, 2 turns, a tiny model: checks the script runs")
    p.add_argument("--model", type=Path, default=None, help="model directory (default: made under --logs)")
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--logs", type=Path, default=Path("kv-offload-logs"))
    args = p.parse_args(argv)
    if args.smoke:
        args.users, args.turns, args.system_words, args.blocks, args.max_tokens = 4, 2, 40, 24, 2
        args.hidden_size, args.layers, args.kv_offloading_size, args.max_model_len = 64, 2, 0.01, 384
    args.logs.mkdir(parents=True, exist_ok=True)
    args.model = args.model or make_model(
        args.logs / f"model-h{args.hidden_size}-l{args.layers}", args.hidden_size, args.layers
    )
    convs = routing.workload(args.users, args.turns, args.system_words)
    engines = 2 if args.router else 1
    working_set = working_set_blocks(convs, args.model)
    print(
        f"working set {working_set} blocks; {engines} engine(s) x {args.blocks} blocks: "
        f"{working_set / (engines * args.blocks):.1f}x the pool"
    )
    systems = [("tier off", 0.0), (f"tier on ({args.kv_offloading_size:g} GiB)", args.kv_offloading_size)]
    runs: dict[str, list[dict]] = {name: [] for name, _ in systems}
    for r in range(args.repeats):  # alternating order, so a load change on a shared machine hits both
        for name, gib in systems if r % 2 == 0 else systems[::-1]:
            runs[name].append(run_system(name.split(" (")[0].replace(" ", "-"), gib, engines, args, convs, args.logs))
    rows = [
        {"system": name, **{k: statistics.median(r[k] for r in runs[name]) for k in runs[name][0] if k != "system"}}
        for name, _ in systems
    ]
    print(
        f"{'system':<24}{'hit rate':>9}{'tier hits':>10}{'recomputed':>11}{'TTFT p50':>10}{'TTFT p90':>10}"
        f"{'tok/s':>8}  (prompt tokens; {engines} engine(s); medians of {args.repeats})"
    )
    for r in rows:
        print(
            f"{r['system']:<24}{r['hit_rate']:>8.1%}{r['tier_hit_tokens']:>10.0f}"
            f"{r['recomputed_prompt_tokens']:>11.0f}{r['ttft_p50']:>9.3f}s{r['ttft_p90']:>9.3f}s"
            f"{r['tok_per_s']:>8.1f}"
        )
    off, on = rows
    if on["recomputed_prompt_tokens"]:
        ratio = off["recomputed_prompt_tokens"] / on["recomputed_prompt_tokens"]
        print(f"recomputed prompt tokens, off / on: {ratio:.2f}x")
    print(
        f"TTFT p50 off / on: {off['ttft_p50'] / on['ttft_p50']:.2f}x; p90: {off['ttft_p90'] / on['ttft_p90']:.2f}x;"
        f" tok/s on / off: {on['tok_per_s'] / off['tok_per_s']:.2f}x"
    )
    if on["copy_seconds_per_block"]:
        print(
            f"a block: copied (either way) in {on['copy_seconds_per_block'] * 1e3:.3f} ms, prefilled in"
            f" {on['prefill_seconds_per_block'] * 1e3:.2f} ms: a tier hit costs"
            f" {on['copy_seconds_per_block'] / on['prefill_seconds_per_block']:.3f} of computing it"
            " (router/policy.py TIER_HIT_COST)"
        )
    if args.json_out:
        args.json_out.write_text(
            json.dumps({"working_set_blocks": working_set, "summary": rows, "runs": runs}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
