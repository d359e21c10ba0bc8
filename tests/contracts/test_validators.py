"""The bounded-number checks (contracts/validators.py): one wording for dataclasses and argparse alike."""

import argparse
import math
import re

import pytest

from pagedinfer.contracts import validators
from pagedinfer.contracts.config import cli_types
from pagedinfer.contracts.config.engine_config import EngineConfig
from pagedinfer.contracts.model_shape import ModelShape


@pytest.mark.parametrize("bad", [0, -3, True, 2.0, "4", None])
def test_positive_int_refuses_what_is_not_an_integer_from_one_and_names_it(bad):
    with pytest.raises(ValueError, match="^" + re.escape(f"max_num_seqs: must be an integer >= 1, got {bad!r}") + "$"):
        validators.positive_int("max_num_seqs", bad)


def test_positive_int_bounds_none_and_the_value_returned():
    assert validators.positive_int("n", 7, maximum=7) == 7
    assert validators.positive_int("n", None, allow_none=True) is None
    with pytest.raises(ValueError, match=r"^n: must be at most 7, got 8$"):
        validators.positive_int("n", 8, maximum=7)
    assert validators.non_negative_int("n", 0) == 0
    with pytest.raises(ValueError, match=r"^n: must be an integer >= 0, got -1$"):
        validators.non_negative_int("n", -1)


@pytest.mark.parametrize("bad", [0, -1.5, math.inf, math.nan, True, "1"])
def test_positive_seconds_refuses_zero_negatives_infinities_and_non_numbers(bad):
    with pytest.raises(ValueError, match=r"^t: must be a finite number > 0, got "):
        validators.positive_seconds("t", bad)
    assert validators.positive_seconds("t", 0.25) == 0.25
    assert validators.non_negative_seconds("t", 0) == 0


def test_the_argparse_types_and_the_dataclasses_use_the_same_words():
    with pytest.raises(argparse.ArgumentTypeError, match=r"^must be an integer >= 1, got 0$"):
        cli_types.positive_int("0")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^must be a finite number > 0, got 'inf'$"):
        cli_types.positive_seconds("inf")
    with pytest.raises(ValueError, match=r"max_num_seqs: must be an integer >= 1, got 0"):
        EngineConfig(model="m", max_num_seqs=0)
    with pytest.raises(ValueError, match=r"^head_dim: must be at most "):
        ModelShape(num_layers=1, num_kv_heads=1, head_dim=10**9, dtype="float32", num_parameters=1)
