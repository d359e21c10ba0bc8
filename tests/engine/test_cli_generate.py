"""`pagedinfer generate` defaults to the embedded model, as `serve` does."""

from __future__ import annotations

import json

from pagedinfer.contracts.embedded_model import default_model_dir
from pagedinfer.engine import LLM, SamplingParams
from pagedinfer.engine.cli import main

PROMPT = "The quick brown fox"
ENGINE_FLAGS = {"max_model_len": 256, "num_gpu_blocks_override": 64}


def test_generate_without_model_answers_with_the_embedded_model(capsys):
    argv = ["generate", "--prompt", PROMPT, "--max-tokens", "12", "--json"]
    for name, value in ENGINE_FLAGS.items():
        argv += ["--" + name.replace("_", "-"), str(value)]
    assert main(argv) == 0
    (line,) = capsys.readouterr().out.strip().splitlines()
    record = json.loads(line)

    embedded = LLM(model=str(default_model_dir()), **ENGINE_FLAGS)
    expected = embedded.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=12))[0].outputs[0]
    assert record["token_ids"] == expected.token_ids and record["text"] == expected.text
    words = [w for w in record["text"].split() if w.strip(".,;:!?'\"()").isalpha()]
    assert len(words) >= 3, record["text"]  # a trained model's words, not a random model's bytes


def test_generate_with_two_tensor_parallel_ranks_matches_one(capsys):
    """--tensor-parallel-size 2 on the embedded model (its LM head tied to the embedding): same text."""
    argv = ["generate", "--prompt", PROMPT, "--max-tokens", "12", "--json", "--device", "cpu"]
    for name, value in ENGINE_FLAGS.items():
        argv += ["--" + name.replace("_", "-"), str(value)]
    argv += ["--tensor-parallel-size", "2"]
    assert main(argv) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    embedded = LLM(model=str(default_model_dir()), device="cpu", **ENGINE_FLAGS)
    expected = embedded.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=12))[0].outputs[0]
    assert record["token_ids"] == expected.token_ids and record["text"] == expected.text
    assert main(argv[:-1] + ["3"]) == 2
    assert "tensor_parallel_size: 3 must divide both num_attention_heads (4)" in capsys.readouterr().err
