"""logit_bias: the sampler draws exactly as from the directly biased logits, row by row in a shared batch."""

import pytest
import torch

from pagedinfer.engine.sampler import Sampler
from pagedinfer.engine.sampling_params import SamplingParams
from pagedinfer.engine.sequence import Sequence


def seq(**params):
    return Sequence(request_id="r", prompt_token_ids=[5, 6], params=SamplingParams(**params), arrival_time=0.0)


def sample_rows(logits, seqs, seed=0):
    sampler = Sampler(seed=seed, eos_token_ids={0}, device=torch.device("cpu"))
    return [r.token_id for r in sampler.sample(logits, seqs)]


def biased(logits_row, bias):
    out = logits_row.clone()
    for token, value in bias.items():
        out[token] += value
    return out


def test_greedy_with_a_bias_takes_the_argmax_of_the_biased_logits():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=gen)
    biases = [{3: 5.0, 7: -2.0}, {int(logits[1].argmax()): -100.0}, {}, {11: 100.0}, {0: 0.5, 49: 3.0}, {}]
    seqs = [seq(temperature=0.0, logit_bias=b or None) for b in biases]
    expected = [int(biased(logits[i], b).argmax()) for i, b in enumerate(biases)]
    assert sample_rows(logits, seqs) == expected


@pytest.mark.parametrize("seed", range(5))
def test_a_seeded_draw_with_a_bias_equals_the_draw_from_the_biased_logits(seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, 40, generator=gen)
    bias = {
        int(i): float(v)
        for i, v in zip(torch.randint(0, 40, (6,), generator=gen), torch.empty(6).uniform_(-100, 100, generator=gen))
    }
    with_bias = sample_rows(logits, [seq(temperature=0.8, top_p=0.9, seed=seed, logit_bias=bias)])
    direct = sample_rows(biased(logits[0], bias)[None], [seq(temperature=0.8, top_p=0.9, seed=seed)])
    assert with_bias == direct


def test_logprobs_stay_those_of_the_model_distribution():
    logits = torch.randn(1, 20, generator=torch.Generator().manual_seed(1))
    sampler = Sampler(seed=0, eos_token_ids={0}, device=torch.device("cpu"))
    result = sampler.sample(logits, [seq(temperature=0.0, logprobs=0, logit_bias={4: 100.0})])[0]
    assert result.token_id == 4
    assert result.logprobs[4].logprob == pytest.approx(float(torch.log_softmax(logits[0], -1)[4]))


@pytest.mark.parametrize(
    "bias, needle", [({1: 100.5}, "100.5"), ({-1: 1.0}, ">= 0"), ({1: float("nan")}, "finite"), ("1:1", "dict")]
)
def test_bad_logit_bias_is_a_value_error_naming_it(bias, needle):
    with pytest.raises(ValueError, match="logit_bias") as info:
        SamplingParams(logit_bias=bias)
    assert needle in str(info.value)
