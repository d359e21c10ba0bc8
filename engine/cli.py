"""The `pagedinfer` command: one entry point, one subcommand per job.

Each subcommand lives in its own module, which exposes `add_parser(subparsers)`
and imports nothing heavy at module level, so `pagedinfer operator` runs in an
image without torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

# (module, description); modules register their own flags.
SUBCOMMANDS = (
    "pagedinfer.engine.cli_generate",  # generate
    "pagedinfer.engine.cli_plan",  # plan
    "pagedinfer.engine.server.cli",  # serve, bench
    "pagedinfer.operator.cli",  # operator
    "pagedinfer.router.cli",  # router
)


class ExactFlagsParser(argparse.ArgumentParser):
    """An ArgumentParser that takes flags only as spelled out (`allow_abbrev=False`).

    argparse otherwise takes any unambiguous prefix for a long flag, so
    `--api-k KEY` or `--num-gpu-blocks=N` would set `--api-key` or
    `--num-gpu-blocks-override` past a check for the flags' exact names (the
    operator's on `spec.engine.extraArgs`). Subparsers are made of the parser's
    own class, so every subcommand, nested ones too, gets the same rule.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = ExactFlagsParser(
        prog="pagedinfer",
        description="Paged-KV-cache LLM inference: engine, OpenAI-compatible server, Kubernetes operator.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in SUBCOMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # A subcommand whose extra is not installed (e.g. no kopf in the
            # engine image) is simply absent; a bug inside our own module is not hidden.
            if exc.name and exc.name.startswith("pagedinfer"):
                if exc.name == module_name:
                    continue
            if exc.name and not exc.name.startswith("pagedinfer"):
                continue
            raise
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except ValueError as exc:
        print(f"pagedinfer {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
