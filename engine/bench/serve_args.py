"""Flags of `pagedinfer bench serve` (kept apart so building the parser imports nothing heavy)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pagedinfer.contracts.config import cli_types

DATASETS = ("synthetic", "sharegpt-like")


class DeprecatedAlias(argparse.Action):
    """An old name of a flag: stores into the new flag's dest and says on stderr which name to use.

    `--input-tokens` and `--shared-prefix-tokens` counted words, never tokens;
    they stay (docs/server.md named them) as aliases of the `-words` flags.
    """

    def __init__(self, option_strings: list[str], dest: str, *, replacement: str, **kwargs: Any) -> None:
        self.replacement = replacement
        super().__init__(option_strings, dest, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(
            f"{parser.prog}: warning: {option_string} is deprecated (it counts words, not tokens):"
            f" use {self.replacement}",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)


def add_bench_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        type=cli_types.http_url,
        default="http://127.0.0.1:8000",
        help="server base URL (default http://127.0.0.1:8000)",
    )
    p.add_argument("--model", default=None, help="model name to request (default: the server's first model)")
    p.add_argument("--api-key", default=None, help="Bearer key (default: env PAGEDINFER_API_KEY)")
    p.add_argument("--num-prompts", type=int, default=100, help="requests to send (default 100)")
    p.add_argument(
        "--request-rate",
        type=float,
        default=float("inf"),
        help="requests per second, Poisson arrivals (default inf: all at once)",
    )
    p.add_argument(
        "--max-concurrency",
        type=cli_types.positive_int,
        default=None,
        help="most requests in flight (default: no limit)",
    )
    p.add_argument(
        "--dataset",
        choices=DATASETS,
        default="synthetic",
        help="synthetic: fixed-length random-word prompts; sharegpt-like: varied chat-like lengths",
    )
    p.add_argument(
        "--input-words",
        type=int,
        default=64,
        help="words of each user message (synthetic), their mean (sharegpt-like) (default 64)",
    )
    p.add_argument(
        "--input-tokens",
        type=int,
        dest="input_words",
        action=DeprecatedAlias,
        replacement="--input-words",
        help="deprecated alias of --input-words",
    )
    p.add_argument("--output-tokens", type=int, default=32, help="max_tokens per request (default 32)")
    p.add_argument(
        "--shared-prefix-words",
        type=int,
        default=0,
        help="words of a system prompt shared by every request (default 0)",
    )
    p.add_argument(
        "--shared-prefix-tokens",
        type=int,
        dest="shared_prefix_words",
        action=DeprecatedAlias,
        replacement="--shared-prefix-words",
        help="deprecated alias of --shared-prefix-words",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of prompts and arrival times (default 0)")
    p.add_argument("--timeout-seconds", type=float, default=600.0, help="per-request timeout (default 600)")
    p.add_argument("--json", action="store_true", help="also print the result as one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
