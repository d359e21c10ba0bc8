"""Bounded numbers, checked once: integers >= 1 (or >= 0) and finite seconds > 0 (or >= 0).

Each check has one wording. The `*_problem` functions say what is wrong with a value (None: nothing), so
argparse types (`config/cli_types.py`: `argument --port: must be ...`) and the ValueErrors of our
dataclasses (`max_num_seqs: must be an integer >= 1, got 0`) read alike. A bool is never an integer here
(`True` is not a block count). Pure, standard library only.
"""

from __future__ import annotations

import math
from typing import Any


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def int_problem(value: Any, minimum: int, maximum: int | None = None) -> str | None:
    """What is wrong with `value` as an integer in [minimum, maximum], without the value; None if nothing."""
    if not _is_int(value) or value < minimum:
        return f"must be an integer >= {minimum}"
    if maximum is not None and value > maximum:
        return f"must be at most {maximum}"
    return None


def seconds_problem(value: Any, allow_zero: bool) -> str | None:
    """What is wrong with `value` as a finite number of seconds > 0 (>= 0 with allow_zero); None if nothing."""
    number = (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)
    if not number or value < 0 or (value == 0 and not allow_zero):
        return f"must be a finite number {'>= 0' if allow_zero else '> 0'}"
    return None


def _check(name: str, value: Any, problem: str | None) -> Any:
    if problem is not None:
        raise ValueError(f"{name}: {problem}, got {value!r}")
    return value


def positive_int(name: str, value: Any, maximum: int | None = None, allow_none: bool = False) -> Any:
    """`value` when an integer in [1, maximum] (or None with allow_none); else a ValueError naming `name`."""
    if value is None and allow_none:
        return None
    return _check(name, value, int_problem(value, 1, maximum))


def non_negative_int(name: str, value: Any, allow_none: bool = False) -> Any:
    """`value` when an integer >= 0 (or None with allow_none); else a ValueError naming `name`."""
    if value is None and allow_none:
        return None
    return _check(name, value, int_problem(value, 0))


def positive_seconds(name: str, value: Any) -> Any:
    """`value` when a finite number > 0; else a ValueError naming `name`."""
    return _check(name, value, seconds_problem(value, allow_zero=False))


def non_negative_seconds(name: str, value: Any) -> Any:
    """`value` when a finite number >= 0; else a ValueError naming `name`."""
    return _check(name, value, seconds_problem(value, allow_zero=True))
