"""SamplingParams: what counts as greedy."""

import pytest
import torch

from pagedinfer.engine.sampler import Sampler
from pagedinfer.engine.sampling_params import GREEDY_TEMPERATURE, SamplingParams
from pagedinfer.engine.sequence import Sequence


@pytest.mark.parametrize("temperature", [0.0, 1e-300, 1e-45, 1e-6])
def test_a_temperature_below_the_greedy_threshold_is_greedy(temperature):
    assert SamplingParams(temperature=temperature).greedy


@pytest.mark.parametrize("temperature", [GREEDY_TEMPERATURE, 0.01, 1.0])
def test_a_temperature_at_or_above_the_threshold_samples(temperature):
    assert not SamplingParams(temperature=temperature).greedy


def test_a_tiny_temperature_takes_the_argmax_instead_of_overflowing():
    logits = torch.tensor([[0.0, 3.0, 2.9, -1.0, 1.0]])
    sampler = Sampler(seed=0, eos_token_ids={0}, device=torch.device("cpu"))
    for temperature in (1e-300, 1e-45):
        s = Sequence(
            request_id="r", prompt_token_ids=[1, 2], params=SamplingParams(temperature=temperature), arrival_time=0.0
        )
        assert {sampler.sample(logits, [s])[0].token_id for _ in range(20)} == {1}
