"""The `pagedinfer` command: one entry point, one subcommand per job.

Each subcommand lives in its own module, which exposes `add_parser(subparsers)`
and imports nothing heavy at module level, so `pagedinfer operator` runs in an
image without torch. Every subcommand is listed whatever is installed; one
whose extra is missing (`serve` in an install of `pagedinfer[operator]`)
stops with one line naming the extra to install and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

# (module, the extra its commands need, or None for none); modules register their own flags.
SUBCOMMANDS = (
    ("pagedinfer.engine.cli_generate", "engine"),  # generate
    ("pagedinfer.engine.cli_plan", None),  # plan: pure arithmetic over a config.json
    ("pagedinfer.engine.server.cli", "engine"),  # serve
    ("pagedinfer.engine.bench.cli", "engine"),  # bench
    ("pagedinfer.operator.cli", "operator"),  # operator
    ("pagedinfer.router.cli", "router"),  # router
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
    for module_name, extra in SUBCOMMANDS:
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
        known = set(sub.choices)
        module.add_parser(sub)
        for name in set(sub.choices) - known:
            sub.choices[name].set_defaults(extra=extra)
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
    except ModuleNotFoundError as exc:
        extra = getattr(args, "extra", None)
        if extra is None or not exc.name or exc.name.partition(".")[0] == "pagedinfer":
            raise  # not a missing extra: a bug of ours, shown in full
        print(
            f"pagedinfer {args.command}: error: needs the '{extra}' extra, which is not installed (no module"
            f" named '{exc.name}'): pip install 'pagedinfer[{extra}]'",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
