"""The sampler on hand-made logits: each option does what it says."""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pagedinfer.engine.sampler import Sampler
from pagedinfer.engine.sampling_params import SamplingParams
from pagedinfer.engine.sequence import Sequence

EOS = 0


def seq(prompt=(5, 6), output=(), **params):
    s = Sequence(request_id="r", prompt_token_ids=list(prompt), params=SamplingParams(**params), arrival_time=0.0)
    s.token_ids.extend(output)
    return s


def draws(logits, s, num=400, seed=0):
    sampler = Sampler(seed=seed, eos_token_ids={EOS}, device=torch.device("cpu"))
    return [sampler.sample(logits.unsqueeze(0), [s])[0].token_id for _ in range(num)]


LOGITS = torch.tensor([0.0, 3.0, 2.9, 2.8, 0.5, -1.0, 1.0, 0.2])


def test_greedy_takes_the_argmax():
    assert set(draws(LOGITS, seq(temperature=0.0), num=5)) == {1}


def test_top_k_one_is_the_argmax_and_top_k_three_stays_in_the_top_three():
    assert set(draws(LOGITS, seq(temperature=1.0, top_k=1))) == {1}
    assert set(draws(LOGITS, seq(temperature=1.0, top_k=3))) == {1, 2, 3}


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.softmax(LOGITS, -1)
    order = torch.argsort(probs, descending=True).tolist()
    p = float(probs[order[0]] + probs[order[1]]) - 1e-3  # the top two just reach it
    assert set(draws(LOGITS, seq(temperature=1.0, top_p=p))) == set(order[:2])


def test_min_p_drops_tokens_below_a_fraction_of_the_top_probability():
    probs = torch.softmax(LOGITS, -1)
    kept = {i for i, q in enumerate(probs.tolist()) if q >= 0.5 * float(probs.max())}
    assert set(draws(LOGITS, seq(temperature=1.0, min_p=0.5))) == kept


def test_temperature_flattens_the_distribution():
    cold = draws(LOGITS, seq(temperature=0.2))
    hot = draws(LOGITS, seq(temperature=5.0))
    assert len(set(hot)) > len(set(cold))


def test_repetition_penalty_discourages_prompt_and_output_tokens():
    logits = torch.tensor([0.0, 2.0, 1.9, 0.0])
    assert draws(logits, seq(prompt=(1,), temperature=0.0), num=1) == [1]
    assert draws(logits, seq(prompt=(1,), temperature=0.0, repetition_penalty=1.5), num=1) == [2]


def test_presence_and_frequency_penalties_act_on_generated_tokens_only():
    logits = torch.tensor([0.0, 2.0, 1.5, 0.0])
    assert draws(logits, seq(prompt=(1, 1), temperature=0.0, presence_penalty=1.0), num=1) == [1]
    assert draws(logits, seq(output=(1,), temperature=0.0, presence_penalty=1.0), num=1) == [2]
    assert draws(logits, seq(output=(1,), temperature=0.0, frequency_penalty=0.4), num=1) == [1]
    assert draws(logits, seq(output=(1, 1), temperature=0.0, frequency_penalty=0.4), num=1) == [2]


def test_min_tokens_masks_eos_and_stop_tokens_until_reached():
    logits = torch.tensor([5.0, 1.0, 4.0, 0.0])
    assert draws(logits, seq(temperature=0.0, min_tokens=2, max_tokens=4), num=1) == [2]
    assert draws(logits, seq(temperature=0.0, min_tokens=2, max_tokens=4, stop_token_ids=[2]), num=1) == [1]
    assert draws(logits, seq(output=(3, 3), temperature=0.0, min_tokens=2, max_tokens=4), num=1) == [EOS]


def test_a_seed_makes_draws_reproducible_and_independent_of_the_engine_seed():
    a = draws(LOGITS, seq(temperature=1.0, seed=42), num=30, seed=0)
    b = draws(LOGITS, seq(temperature=1.0, seed=42), num=30, seed=123)
    assert a == b


def test_logprobs_are_the_raw_distribution_with_ranks():
    sampler = Sampler(seed=0, eos_token_ids={EOS}, device=torch.device("cpu"))
    res = sampler.sample(LOGITS.unsqueeze(0), [seq(temperature=0.0, logprobs=3)])[0]
    raw = torch.log_softmax(LOGITS, -1)
    assert res.logprobs[1].rank == 1 and math.isclose(res.logprobs[1].logprob, float(raw[1]), rel_tol=1e-6)
    assert sorted(lp.rank for lp in res.logprobs.values()) == [1, 2, 3]


def test_a_batch_of_draws_follows_the_distribution():
    sampler = Sampler(seed=0, eos_token_ids={EOS}, device=torch.device("cpu"))
    num = 20000
    tokens = [r.token_id for r in sampler.sample(LOGITS.repeat(num, 1), [seq(temperature=1.0)] * num)]
    frequencies = torch.bincount(torch.tensor(tokens), minlength=len(LOGITS)).float() / num
    expected = torch.softmax(LOGITS, -1)
    assert (frequencies - expected).abs().max() < 4 * math.sqrt(0.25 / num)  # 4 sigma of the worst token


def test_rows_with_different_options_are_cut_each_by_its_own():
    sampler = Sampler(seed=0, eos_token_ids={EOS}, device=torch.device("cpu"))
    rows = [
        seq(temperature=1.0, top_k=1),
        seq(temperature=1.0, top_k=3),
        seq(temperature=0.0),
        seq(temperature=1.0, min_p=0.9),
        seq(temperature=1.0),
    ]
    seen = [set() for _ in rows]
    for _ in range(300):
        for i, r in enumerate(sampler.sample(LOGITS.repeat(len(rows), 1), rows)):
            seen[i].add(r.token_id)
    assert seen[0] == {1} and seen[1] == {1, 2, 3} and seen[2] == {1} and seen[3] == {1, 2}
    assert len(seen[4]) > 3


def test_a_seeded_row_draws_the_same_whatever_shares_the_batch():
    def seeded_draws(others):
        sampler = Sampler(seed=7, eos_token_ids={EOS}, device=torch.device("cpu"))
        target = seq(temperature=1.0, seed=42)
        batch = [*others, target]
        return [sampler.sample(LOGITS.repeat(len(batch), 1), batch)[-1].token_id for _ in range(40)]

    alone = seeded_draws([])
    assert seeded_draws([seq(temperature=1.0), seq(temperature=0.0)]) == alone
    assert seeded_draws([seq(temperature=1.0, seed=1), seq(temperature=2.0)]) == alone
    assert seeded_draws([seq(temperature=1.0, top_p=0.9)]) == alone  # companions that rank their rows
    assert seeded_draws([seq(temperature=1.0, top_k=3), seq(temperature=1.0, min_p=0.2)]) == alone
    assert len(set(alone)) > 1


@pytest.mark.parametrize("companions", [[], [dict(top_k=4)], [dict(top_p=0.5)]], ids=["alone", "top_k", "top_p"])
def test_cuts_keep_ties_whatever_shares_the_batch(companions):
    sampler = Sampler(seed=0, eos_token_ids={EOS}, device=torch.device("cpu"))
    tied = torch.tensor([3.0, 1.0, 1.0, 1.0, 1.0, -5.0, -5.0, -5.0])
    rows = [seq(temperature=1.0, top_k=2), seq(temperature=1.0, top_p=0.9)]
    batch = rows + [seq(temperature=1.0, **c) for c in companions]
    seen = [set(), set()]
    for _ in range(400):
        for i, r in enumerate(sampler.sample(tied.repeat(len(batch), 1), batch)[:2]):
            seen[i].add(r.token_id)
    assert seen[0] == {0, 1, 2, 3, 4}  # the k-th value (1.0) is shared by four tokens: all kept
    assert seen[1] == {0, 1, 2, 3, 4}  # 0.9 is reached only within the tied 1.0s: all of them kept


def test_a_row_with_every_token_masked_takes_the_argmax_of_its_logits():
    sampler = Sampler(seed=0, eos_token_ids={EOS}, device=torch.device("cpu"))
    logits = torch.tensor([[float("-inf")] * 4, [0.0, 1.0, 5.0, 0.0]])
    got = [r.token_id for r in sampler.sample(logits, [seq(temperature=1.0), seq(temperature=1.0, top_k=1)])]
    assert got == [0, 2]


class _ScalarReads(TorchDispatchMode):
    """Counts tensor -> Python scalar reads (`item`, `float(t)`, `int(t)`): each is a device sync on a GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_logprobs_of_every_row_come_back_without_a_per_row_scalar_read():
    """One sync per step: the logprobs of all rows ride on the tokens' single transfer, none is read per row."""
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    seqs = [seq(temperature=0.0, logprobs=k) for k in (0, 1, 3, 5)] + [
        seq(temperature=0.0),
        seq(temperature=0.0, logprobs=2),
    ]
    sampler = Sampler(seed=0, eos_token_ids={EOS}, device=torch.device("cpu"))
    with _ScalarReads() as reads:
        results = sampler.sample(logits, seqs)
    assert reads.count == 0
    raw = torch.log_softmax(logits, -1)
    for row, (s, res) in enumerate(zip(seqs, results)):
        assert res.token_id == int(logits[row].argmax())
        if s.params.logprobs is None:
            assert res.logprobs is None
            continue
        top = torch.topk(raw[row], s.params.logprobs)
        expected = {res.token_id: (float(raw[row, res.token_id]), 1)}
        for r, (v, i) in enumerate(zip(top.values.tolist(), top.indices.tolist()), start=1):
            expected.setdefault(i, (v, r))
        assert {t: (lp.logprob, lp.rank) for t, lp in res.logprobs.items()} == expected


def test_sample_never_writes_the_callers_logits():
    """The engine hands the runner's logits to the sampler without a gather when every row samples: penalties,
    logit bias and min_tokens must land in the sampler's own copy, never in the caller's tensor."""
    logits = torch.stack([LOGITS, LOGITS.flip(0), LOGITS * 2])
    before = logits.clone()
    seqs = [
        seq(output=(1, 2), temperature=0.0, repetition_penalty=2.0, presence_penalty=1.0),
        seq(temperature=1.0, logit_bias={3: 50.0}, seed=7),
        seq(temperature=0.0, min_tokens=4, frequency_penalty=0.5),
    ]
    Sampler(seed=0, eos_token_ids={EOS}, device=torch.device("cpu")).sample(logits, seqs)
    assert torch.equal(logits, before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_batch_of_plain_greedy_rows_takes_the_general_paths_tokens(dtype):
    """A step whose rows are all plain greedy ones takes one argmax of the logits as they are (no copy, no
    per-row work): the same tokens as the general path's float32 copy, ties (first maximum) and a row that
    only one option (min_tokens, a penalty, a bias, logprobs) would change included; any such row sends the
    whole batch down the general path."""
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(64, 50, generator=gen) * 3).round().to(dtype)  # rounded: many tied maxima
    logits[5, :] = 7.0  # a row of ties
    plain = [seq(output=(1,) * (i % 3), temperature=0.0) for i in range(64)]
    assert all(s.params.argmax_only for s in plain)
    general = [seq(output=(1,) * (i % 3), temperature=0.0, logprobs=0) for i in range(64)]  # logprobs: general path
    assert not any(s.params.argmax_only for s in general)
    fast_tokens = [r.token_id for r in Sampler(0, {EOS}, torch.device("cpu")).sample(logits, plain)]
    general_tokens = [r.token_id for r in Sampler(0, {EOS}, torch.device("cpu")).sample(logits, general)]
    assert fast_tokens == general_tokens and fast_tokens[5] == 0
    for option in (
        dict(min_tokens=1),
        dict(repetition_penalty=2.0),
        dict(logit_bias={3: -100.0}),
        dict(presence_penalty=2.0),
        dict(frequency_penalty=2.0),
        dict(logprobs=1),
        dict(temperature=1.0),
    ):
        assert not seq(**{"temperature": 0.0, **option}).params.argmax_only, option
    eos_first = torch.full((2, 50), -5.0, dtype=dtype)
    eos_first[:, EOS] = 9.0
    mixed = [seq(temperature=0.0), seq(temperature=0.0, min_tokens=1)]
    assert [r.token_id for r in Sampler(0, {EOS}, torch.device("cpu")).sample(eos_first, mixed)][0] == EOS
    assert Sampler(0, {EOS}, torch.device("cpu")).sample(eos_first, mixed)[1].token_id != EOS
