"""Dataclass fields that are also command-line flags: one definition per option.

A field made by `flag_field` carries a `Flag` in its metadata: the flag's
name, help text, argparse type and choices, and whether the operator sets it
on every pod it builds (`managed`). From such a dataclass (`EngineConfig`,
`ServeArgs`) everything else is derived, never written again:

- the argparse options (`add_flags`): default = the field's default (or
  `Flag.cli_default` where the flag takes a text the field holds parsed, as
  `--cpu-memory-budget 2GiB` for `cpu_memory_budget_bytes`); a bool field
  defaulting to True becomes `--x/--no-x`, one defaulting to False `--x`;
  a flag with `Flag.const` may be given without its value (`--overlap`);
- the field values from parsed arguments (`values_from_args`), each through
  `Flag.parse` when it has one;
- the operator's managed flags (`managed_flags`), `--no-x` forms included:
  `spec.engine.extraArgs` may not set them, and the CRD's CEL rule lists them.

Like vLLM's `EngineArgs`, the metadata sits on the field; unlike it, the
fields are those of the config itself, so a flag, its config field and the
`LLM(**kwargs)` keyword are one name. Pure standard library (no torch): the
operator imports it.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

_MISSING = dataclasses.MISSING
_SAME = object()  # Flag.cli_default unset: the flag defaults to the field's default


@dataclass(frozen=True)
class Flag:
    """The command-line side of one dataclass field."""

    name: str  # "--block-size"; argparse's dest is the name without dashes, "-" as "_"
    help: str | None  # None: --help lists the flag without text
    type: Callable[[str], Any] | None = None  # argparse `type=`; None: the text itself (or a bool switch)
    choices: tuple[Any, ...] | None = None
    managed: bool = False  # the operator sets it on every pod; extraArgs may not (nor abbreviate it)
    cli_default: Any = _SAME  # the flag's default where it differs from the field's (a text `parse` reads)
    parse: Callable[[Any], Any] | None = None  # the parsed flag value -> the field's value
    const: Any = _SAME  # set: the value may be left out (`--overlap` alone means `--overlap <const>`)

    def __post_init__(self) -> None:
        if not self.name.startswith("--") or self.name != self.name.lower() or " " in self.name:
            raise ValueError(f"flag: must be a lower-case long flag such as --block-size, got {self.name!r}")

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")


def flag_field(default: Any = _MISSING, *, flag: str, help: str | None, **kwargs: Any) -> Any:
    """A dataclass field (with `default`, or required without one) that is also the flag `flag`."""
    metadata = {"flag": Flag(flag, help, **kwargs)}
    if default is _MISSING:
        return dataclasses.field(metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def flag_fields(cls: type) -> list[tuple[dataclasses.Field, Flag]]:
    """(field, flag) of each field of `cls` that is a flag, in definition order."""
    return [(f, f.metadata["flag"]) for f in dataclasses.fields(cls) if "flag" in f.metadata]


def field_default(cls: type, name: str) -> Any:
    """The default of `cls`'s field `name` (for a mirror of the option elsewhere, as the CRD's EngineSpec)."""
    default = {f.name: f.default for f in dataclasses.fields(cls)}[name]
    if default is _MISSING:
        raise KeyError(f"{cls.__name__}.{name} has no default")
    return default


def flag_default(field: dataclasses.Field, flag: Flag) -> Any:
    """The flag's default: Flag.cli_default when set, else the field's (None for a required field)."""
    if flag.cli_default is not _SAME:
        return flag.cli_default
    return None if field.default is _MISSING else field.default


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    names: Iterable[str] | None = None,
    help_for: dict[str, str] | None = None,
) -> None:
    """Add the flags of `cls`'s fields (those in `names`, in that order; all when None).

    `help_for` replaces the help text of a field (by name) where a command means
    something narrower by it (`plan`'s --max-num-batched-tokens).
    """
    fields = flag_fields(cls)
    if names is not None:
        by_name = {f.name: (f, flag) for f, flag in fields}
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise KeyError(f"{cls.__name__} has no flag fields {unknown}")
        fields = [by_name[n] for n in names]
    for field, flag in fields:
        default = flag_default(field, flag)
        kwargs: dict[str, Any] = {"default": default, "help": (help_for or {}).get(field.name, flag.help)}
        if isinstance(default, bool):
            kwargs["action"] = argparse.BooleanOptionalAction if default else "store_true"
        else:
            if flag.type is not None:
                kwargs["type"] = flag.type
            if flag.choices is not None:
                kwargs["choices"] = flag.choices
            if flag.const is not _SAME:
                kwargs["nargs"], kwargs["const"] = "?", flag.const
        parser.add_argument(flag.name, **kwargs)


def values_from_args(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """{field name: value} for every flag field of `cls` present in `args`, each through its `parse`."""
    values = {}
    for field, flag in flag_fields(cls):
        if hasattr(args, flag.dest):
            value = getattr(args, flag.dest)
            values[field.name] = flag.parse(value) if flag.parse is not None and value is not None else value
    return values


def command_line(classes: Iterable[type], values: Mapping[str, Any]) -> list[str]:
    """The flags that set `values` ({field name: value}, in that order), each the flag of the first of `classes`
    with that field: a text as `--flag TEXT` (the caller formats numbers, so what it renders stays byte-stable),
    a bool as a switch (`--flag`, or `--no-flag` for a True-by-default one; a False-by-default one only when
    True), None as nothing (the engine's default). A name no class has is a KeyError (the operator's builders:
    no flag is spelled out by hand)."""
    by_name: dict[str, tuple[dataclasses.Field, Flag]] = {}
    for cls in reversed(tuple(classes)):
        by_name.update((f.name, (f, flag)) for f, flag in flag_fields(cls))
    out: list[str] = []
    for name, value in values.items():
        if name not in by_name:
            raise KeyError(f"no flag field {name!r} in {[c.__name__ for c in classes]}")
        field, flag = by_name[name]
        if value is None:
            continue
        if isinstance(value, bool):
            if flag_default(field, flag) is True:
                out.append(flag.name if value else "--no-" + flag.name.removeprefix("--"))
            elif value:
                out.append(flag.name)
        elif isinstance(value, str):
            out += [flag.name, value]
        else:
            raise TypeError(f"{flag.name}: give its text (formatted by the caller) or a bool, got {value!r}")
    return out


def managed_flags(*classes: type) -> tuple[str, ...]:
    """Every flag the operator sets, in definition order, with the `--no-` form of a True-by-default switch."""
    out: list[str] = []
    for cls in classes:
        for field, flag in flag_fields(cls):
            if flag.managed:
                out.append(flag.name)
                if flag_default(field, flag) is True:
                    out.append("--no-" + flag.name.removeprefix("--"))
    return tuple(out)
