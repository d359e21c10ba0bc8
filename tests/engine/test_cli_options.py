"""The command lines are derived from one definition; no flag of today's is lost, renamed or changed.

`data/cli_options.json` is the option set of `pagedinfer serve`, `generate`
and `plan` as it stood before the flags were derived from
`engine/engine_args.py` (flags, default, help, type, choices, dest, nargs).
A flag may be added beside them, never taken away or changed silently: a
deliberate change edits the snapshot in the same commit.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from pagedinfer.engine.cli import build_parser

SNAPSHOT = Path(__file__).parent / "data" / "cli_options.json"
COMMANDS = ("serve", "generate", "plan")


def describe(parser: argparse.ArgumentParser) -> dict[str, dict]:
    """Each option of a parser, by its first flag: what `--help` shows and what parsing does."""
    out = {}
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        type_ = action.type
        out[action.option_strings[0]] = {
            "flags": list(action.option_strings), "dest": action.dest, "default": repr(action.default),
            "help": action.help, "choices": None if action.choices is None else list(action.choices),
            "type": None if type_ is None else f"{type_.__module__.rpartition('.')[2]}.{type_.__qualname__}",
            "nargs": action.nargs, "required": action.required, "action": type(action).__name__,
        }
    return out


def subcommand(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


@pytest.mark.parametrize("command", COMMANDS)
def test_no_option_of_the_snapshot_is_lost_renamed_or_changed(command):
    expected = json.loads(SNAPSHOT.read_text())[command]
    actual = describe(subcommand(command))
    assert set(expected) <= set(actual), f"lost or renamed: {sorted(set(expected) - set(actual))}"
    for flag, option in expected.items():
        assert actual[flag] == option, flag
