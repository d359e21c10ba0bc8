"""Flags of `pagedinfer bench serve` (kept apart so building the parser imports nothing heavy)."""

from __future__ import annotations

import argparse

from pagedinfer.engine.server import cli_types

DATASETS = ("synthetic", "sharegpt-like")


def add_bench_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", type=cli_types.http_url, default="http://127.0.0.1:8000", help="server base URL (default http://127.0.0.1:8000)")
    p.add_argument("--model", default=None, help="model name to request (default: the server's first model)")
    p.add_argument("--api-key", default=None, help="Bearer key (default: env PAGEDINFER_API_KEY)")
    p.add_argument("--num-prompts", type=int, default=100, help="requests to send (default 100)")
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests per second, Poisson arrivals (default inf: all at once)")
    p.add_argument("--max-concurrency", type=cli_types.positive_int, default=None, help="most requests in flight (default: no limit)")
    p.add_argument("--dataset", choices=DATASETS, default="synthetic",
                   help="synthetic: fixed-length random-word prompts; sharegpt-like: varied chat-like lengths")
    p.add_argument("--input-tokens", type=int, default=64, help="synthetic: prompt words per request (default 64)")
    p.add_argument("--output-tokens", type=int, default=32, help="max_tokens per request (default 32)")
    p.add_argument("--shared-prefix-tokens", type=int, default=0,
                   help="words of a system prompt shared by every request (default 0)")
    p.add_argument("--seed", type=int, default=0, help="seed of prompts and arrival times (default 0)")
    p.add_argument("--timeout-seconds", type=float, default=600.0, help="per-request timeout (default 600)")
    p.add_argument("--json", action="store_true", help="also print the result as one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
