"""`pagedinfer bench serve`: the parser is built without importing httpx or tqdm; `run` imports them."""

from __future__ import annotations

import argparse

from pagedinfer.engine.bench.serve_args import add_bench_serve_args


def add_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks", description="Benchmarks against a running server.")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="BENCH", required=True)
    bench_serve = bench_sub.add_parser(
        "serve", help="load a running server with timed requests; print throughput, TTFT, ITL, cache hit rate"
    )
    add_bench_serve_args(bench_serve)
    bench_serve.set_defaults(func=run_bench_serve)


def run_bench_serve(args: argparse.Namespace) -> int:
    from pagedinfer.engine.bench.serve import main

    return main(args)
