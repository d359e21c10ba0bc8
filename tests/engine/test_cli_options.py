"""The command lines are derived from one definition; no flag of today's is lost, renamed or changed.

`data/cli_options.json` is the option set of `pagedinfer serve`, `generate`
and `plan` as it stood before the flags were derived from
`engine/engine_args.py` (flags, default, help, type, choices, dest, nargs).
A flag may be added beside them, never taken away or changed silently: a
deliberate change edits the snapshot in the same commit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path

import pytest

from pagedinfer.contracts.config import options
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
            "flags": list(action.option_strings),
            "dest": action.dest,
            "default": repr(action.default),
            "help": action.help,
            "choices": None if action.choices is None else list(action.choices),
            "type": None if type_ is None else f"{type_.__module__.rpartition('.')[2]}.{type_.__qualname__}",
            "nargs": action.nargs,
            "required": action.required,
            "action": type(action).__name__,
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


def test_every_engine_option_is_a_config_field_an_llm_keyword_and_a_flag_of_serve_and_generate():
    """The flags of serve and generate are EngineConfig's flag fields; parsed, they build the config."""
    from pagedinfer.contracts.config.engine_config import EngineConfig
    from pagedinfer.contracts.config.options import flag_fields
    from pagedinfer.engine.engine_args import engine_config_from_args

    names = {flag.name for _, flag in flag_fields(EngineConfig)}
    assert {f.name for f in dataclasses.fields(EngineConfig)} - {f.name for f, _ in flag_fields(EngineConfig)} == {
        "watermark"
    }  # the one field that is not an option
    for command in ("serve", "generate"):
        assert names <= set(describe(subcommand(command)))
    args = build_parser().parse_args(
        [
            "serve",
            "--model",
            "m",
            "--block-size",
            "32",
            "--no-enable-prefix-caching",
            "--cpu-memory-budget",
            "3GiB",
            "--dtype",
            "float32",
            "--seed",
            "7",
        ]
    )
    config = engine_config_from_args(args)
    assert config == EngineConfig(
        model="m", block_size=32, enable_prefix_caching=False, cpu_memory_budget_bytes=3 << 30, dtype="float32", seed=7
    )
    assert engine_config_from_args(build_parser().parse_args(["generate"]), model="m") == EngineConfig(model="m")


def test_served_model_name_is_the_servers_option_only():
    """EngineConfig.served_model_name was never read; the name lives in ServeArgs (--served-model-name)."""
    from pagedinfer.contracts.config.engine_config import EngineConfig
    from pagedinfer.contracts.config.serve_args import ServeArgs

    assert "served_model_name" not in {f.name for f in dataclasses.fields(EngineConfig)}
    args = build_parser().parse_args(["serve", "--served-model-name", "llama", "--port", "9000"])
    assert ServeArgs.from_args(args) == ServeArgs(served_model_name="llama", port=9000)


def test_the_managed_flags_are_the_fields_marked_managed_with_their_no_forms():
    from pagedinfer.contracts.config.engine_config import EngineConfig
    from pagedinfer.contracts.config.options import managed_flags
    from pagedinfer.contracts.config.serve_args import ServeArgs
    from pagedinfer.operator.spec.crd_model import MANAGED_FLAGS

    assert MANAGED_FLAGS == managed_flags(EngineConfig, ServeArgs)
    assert {"--enable-prefix-caching", "--no-enable-prefix-caching", "--cpu-memory-budget", "--api-key"} <= set(
        MANAGED_FLAGS
    )
    assert not {"--seed", "--device", "--preemption-mode", "--tokenizer", "--log-level"} & set(MANAGED_FLAGS)


REPO = Path(__file__).resolve().parents[2]


def documented_flags(doc: Path, header: str) -> dict[str, str]:
    """{flag: its Default cell} of the Markdown table whose header row starts with `header`."""
    lines = doc.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.lower().startswith(header.lower()))
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        first, default = (cell.strip() for cell in line.strip("|").split("|")[:2])
        for flag in re.findall(r"`(--[a-z0-9-]+)`", first):
            rows[flag] = default
    return rows


def shown(value) -> str:
    """How the README writes a default: on/off for a switch, 4.0 as 4."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def test_the_readmes_engine_flag_table_is_the_definitions_flags_with_their_defaults():
    from pagedinfer.contracts.config.engine_config import EngineConfig
    from pagedinfer.contracts.config.options import flag_fields

    rows = documented_flags(REPO / "README.md", "| flag | default | meaning |")
    expected = {}
    for field, flag in flag_fields(EngineConfig):
        default = options.flag_default(field, flag)
        expected[flag.name] = default
        if default is True:
            expected["--no-" + flag.name[2:]] = default
    assert set(rows) == set(expected)
    for name, default in expected.items():
        if default is not None:
            assert rows[name] == shown(default), name


def test_the_server_docs_flag_table_is_the_servers_flags():
    from pagedinfer.contracts.config.options import flag_fields
    from pagedinfer.contracts.config.serve_args import ServeArgs

    rows = documented_flags(REPO / "docs" / "server.md", "| Flag | Default | What |")
    timeouts = {"--request-header-timeout-seconds", "--request-body-timeout-seconds"}
    assert set(rows) == {flag.name for _, flag in flag_fields(ServeArgs)} | timeouts | {"--model"}


def test_a_flag_field_derives_switches_defaults_and_parsing():
    @dataclasses.dataclass(frozen=True)
    class Toy:
        size: int = options.flag_field(4, flag="--size", type=int, help="h", managed=True)
        on: bool = options.flag_field(True, flag="--on", help="h", managed=True)
        off: bool = options.flag_field(False, flag="--off", help="h")
        budget_bytes: int = options.flag_field(
            1024, flag="--budget", cli_default="1KiB", help="h", parse=lambda text: {"1KiB": 1024, "2KiB": 2048}[text]
        )
        plain: float = 0.5  # no flag

    parser = argparse.ArgumentParser()
    options.add_flags(parser, Toy)
    assert options.values_from_args(Toy, parser.parse_args([])) == {
        "size": 4,
        "on": True,
        "off": False,
        "budget_bytes": 1024,
    }
    args = parser.parse_args(["--size", "8", "--no-on", "--off", "--budget", "2KiB"])
    assert Toy(**options.values_from_args(Toy, args)) == Toy(size=8, on=False, off=True, budget_bytes=2048)
    assert options.managed_flags(Toy) == ("--size", "--on", "--no-on")
    with pytest.raises(KeyError, match="no flag fields"):
        options.add_flags(argparse.ArgumentParser(), Toy, ("plain",))
    with pytest.raises(ValueError, match="flag: must be a lower-case long flag"):
        options.flag_field(1, flag="-s", help="h")


def test_command_line_renders_fields_as_the_flags_the_parser_reads_back():
    from pagedinfer.contracts.config.engine_config import EngineConfig
    from pagedinfer.contracts.config.serve_args import ServeArgs

    argv = options.command_line(
        (EngineConfig, ServeArgs),
        {
            "model": "/m",
            "block_size": "32",
            "max_model_len": None,
            "enable_prefix_caching": False,
            "enable_chunked_prefill": True,
            "kv_events": True,
            "kv_events_port": "5557",
            "compile": False,
            "cpu_memory_budget_bytes": str(3 * 2**30),
            "served_model_name": "llama",
        },
    )
    assert argv == [
        "--model",
        "/m",
        "--block-size",
        "32",
        "--no-enable-prefix-caching",
        "--enable-chunked-prefill",
        "--kv-events",
        "--kv-events-port",
        "5557",
        "--cpu-memory-budget",
        str(3 * 2**30),
        "--served-model-name",
        "llama",
    ]  # None and a False store_true switch: left out
    args = build_parser().parse_args(["serve", *argv])
    assert (args.model, args.block_size, args.enable_prefix_caching, args.kv_events, args.kv_events_port) == (
        "/m",
        32,
        False,
        True,
        5557,
    )
    with pytest.raises(KeyError, match="no flag field 'block_sise'"):
        options.command_line((EngineConfig,), {"block_sise": "32"})
    with pytest.raises(TypeError, match="--block-size: give its text"):
        options.command_line((EngineConfig,), {"block_size": 32})
