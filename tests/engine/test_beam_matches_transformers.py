"""LLM.beam_search returns what transformers' generate(num_beams=K, early_stopping=True) returns.

The models are the tiny test models with the EOS row of the output layer
scaled up, so that EOS is often among a beam's best tokens: some beams end
early, and with ignore_eos the EOS token is one more token to continue with
(transformers then gets an EOS id that no token has, which is the same search).
Numerical ties (two sequences' scores within 1e-5) may be ordered either
way; the test reports them and compares everything else token for token.
"""

from __future__ import annotations

import random
import warnings

import pytest
import torch
import transformers

from pagedinfer.engine import LLM
from pagedinfer.engine.beam.params import BeamSearchParams

EOS_SCALE = 3.0
TIE_MARGIN = 1e-5
MAX_TOKENS = 10
NO_TOKEN = -1  # an EOS id no token has: transformers then ends beams at max_new_tokens only


@pytest.fixture(scope="module")
def eos_model(make_model, tmp_path_factory):
    """(model dir, transformers model): a tiny model whose EOS logit is scaled up."""
    cache = {}

    def get(arch):
        if arch not in cache:
            src = make_model(arch)
            model = transformers.AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
            with torch.no_grad():
                model.lm_head.weight[model.config.eos_token_id] *= EOS_SCALE
            out = tmp_path_factory.mktemp(f"{arch}-eos")
            model.save_pretrained(str(out))
            transformers.AutoTokenizer.from_pretrained(str(src)).save_pretrained(str(out))
            cache[arch] = (out, model)
        return cache[arch]

    return get


def prompts_for(vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(8, vocab) for _ in range(n)] for n in (3, 5, 9, 17, 23, 40)]


def hf_beams(model, prompt, k, length_penalty, ignore_eos):
    config = transformers.GenerationConfig(
        num_beams=k,
        num_return_sequences=k,
        do_sample=False,
        early_stopping=True,
        length_penalty=length_penalty,
        max_new_tokens=MAX_TOKENS,
        pad_token_id=model.config.pad_token_id,
        bos_token_id=model.config.bos_token_id,
        eos_token_id=NO_TOKEN if ignore_eos else model.config.eos_token_id,
        return_dict_in_generate=True,
        output_scores=True,
    )
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), generation_config=config)
    lengths = (out.beam_indices >= 0).sum(dim=1).tolist()
    return [
        (out.sequences[i, len(prompt) : len(prompt) + n].tolist(), float(out.sequences_scores[i]))
        for i, n in enumerate(lengths)
    ]


def compare(got, want):
    """Mismatched ranks must be numerical ties; returns them (reported, not failed)."""
    ties = []
    for rank, ((tokens, score), (hf_tokens, hf_score)) in enumerate(zip(got, want)):
        if tokens != hf_tokens:
            assert abs(score - hf_score) < TIE_MARGIN or any(
                abs(score - s) < TIE_MARGIN for t, s in want if t == tokens
            ), f"rank {rank}: {tokens} (score {score}) != transformers' {hf_tokens} (score {hf_score})"
            ties.append(rank)
        else:
            assert score == pytest.approx(hf_score, abs=1e-4)
    assert len(got) == len(want)
    return ties


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("beam_width", [2, 4])
@pytest.mark.parametrize("ignore_eos", [True, False], ids=["no-early-end", "eos-reachable"])
def test_beam_search_equals_transformers(eos_model, arch, beam_width, ignore_eos):
    check_against_transformers(eos_model, arch, beam_width, ignore_eos, length_penalty=0.7)


@pytest.mark.parametrize("length_penalty", [-1.0, 0.0, 2.0])
def test_the_length_penalty_ranks_finished_beams_as_in_transformers(eos_model, length_penalty):
    check_against_transformers(eos_model, "llama", 4, False, length_penalty)


def check_against_transformers(eos_model, arch, beam_width, ignore_eos, length_penalty):
    model_dir, model = eos_model(arch)
    prompts = prompts_for(model.config.vocab_size)
    llm = LLM(model=str(model_dir), dtype="float32", block_size=8)
    outs = llm.beam_search(
        prompts,
        BeamSearchParams(
            beam_width=beam_width, max_tokens=MAX_TOKENS, ignore_eos=ignore_eos, length_penalty=length_penalty
        ),
    )
    reasons = set()
    all_ties = []
    for prompt, out in zip(prompts, outs):
        got = [(s.tokens[len(prompt) :], s.score) for s in out.sequences]
        assert all(s.tokens[: len(prompt)] == prompt for s in out.sequences)
        all_ties += compare(got, hf_beams(model, prompt, beam_width, length_penalty, ignore_eos))
        reasons |= {s.finish_reason for s in out.sequences}
        assert [s.score for s in out.sequences] == sorted((s.score for s in out.sequences), reverse=True)
    if all_ties:
        warnings.warn(
            f"{arch} beam_width={beam_width}: {len(all_ties)} ranks ordered differently within a"
            f" score tie of {TIE_MARGIN}",
            stacklevel=2,
        )
    # the two cases really are different: some beams end early only when EOS can end them
    assert reasons == ({"length"} if ignore_eos else {"stop", "length"})
    assert llm.get_stats().num_used_blocks == 0
