"""The `pagedinfer` command: one entry point, one subcommand per job.

Each subcommand lives in its own module, which exposes `add_parser(subparsers)`
and imports nothing heavy at module level, so `pagedinfer operator` runs in an
image without torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# (module, description); modules register their own flags.
SUBCOMMANDS = (
    "pagedinfer.engine.cli_generate",  # generate
    "pagedinfer.engine.cli_plan",  # plan
    "pagedinfer.engine.server.cli",  # serve, bench
    "pagedinfer.operator.cli",  # operator
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
