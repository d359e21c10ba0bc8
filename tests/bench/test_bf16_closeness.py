"""bench/bf16_closeness.py's measures and flags (cheap: no model is run; the script itself is not run here)."""

from __future__ import annotations

import math

import pytest
import torch
from bf16_closeness import measure, parse_args
from bf16_swaps import apply_swaps


def test_measure_counts_first_tokens_logprob_error_and_the_margin_of_flipped_requests():
    reference = torch.log_softmax(torch.tensor([[3.0, 1.0, 0.0], [0.0, 2.0, 1.9], [0.0, 0.0, 5.0]]), dim=-1)
    ref = reference.tolist()
    # request 0 and 2 as the reference, request 1 flipped to its runner-up, 0.1 nats off on every token
    top = [[(0, ref[0][0]), (1, ref[0][1])], [(2, ref[1][2] + 0.1), (1, ref[1][1] - 0.1)], [(2, ref[2][2])]]
    own = [[(0, 0.0)], [(1, 0.0)], [(1, 0.0)]]
    found = measure("x bfloat16", top, reference, own)
    assert found.num_requests == 3
    assert found.agreement.first_token == pytest.approx(2 / 3)
    assert found.agreement.first_token_stderr == pytest.approx(math.sqrt(2 / 9 / 3))
    assert found.first_token_own == pytest.approx(1 / 3)  # only request 0's argmax equals its own fp32 one
    assert found.mean_abs_logprob_error == pytest.approx(0.2 / 5, abs=1e-6)
    assert found.median_margin_flipped == pytest.approx(ref[1][1] - ref[1][2], abs=1e-6)
    assert math.isclose(found.median_margin_flipped, 0.1, abs_tol=1e-5)
    assert "66.7% +-27.2%" in found.row()


def test_measure_without_own_float32_or_flips_says_so():
    reference = torch.log_softmax(torch.tensor([[1.0, 0.0]]), dim=-1)
    found = measure("x float32", [[(0, float(reference[0, 0]))]], reference, None)
    assert (found.agreement.first_token, found.first_token_own, found.median_margin_flipped) == (1.0, None, None)
    assert found.mean_abs_logprob_error == 0.0


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--swaps", "norm,bogus"], "--swaps"),
        (["--systems", "vllm"], "--vllm-python"),
        (["--top-k", "21"], "--top-k"),
        (["--num-requests", "0"], "--num-requests"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(argv, named, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert named in capsys.readouterr().err


def test_an_unknown_swap_is_refused_before_anything_is_patched():
    with pytest.raises(ValueError, match="unknown bogus"):
        apply_swaps(("norm", "bogus"))
    from transformers.models.llama import modeling_llama

    assert modeling_llama.LlamaRMSNorm.forward.__module__ == modeling_llama.__name__
