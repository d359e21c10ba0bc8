"""`pagedinfer generate --beam-width K`: the K best beams per prompt, best first; bad flags exit 2."""

from __future__ import annotations

import json

import pytest

from pagedinfer.engine.cli import main


def test_generate_with_beam_width_prints_the_beams_best_first(tiny_llama, capsys):
    rc = main(
        [
            "generate",
            "--model",
            str(tiny_llama),
            "--prompt",
            "The quick brown fox",
            "--beam-width",
            "3",
            "--max-tokens",
            "6",
            "--ignore-eos",
            "--json",
            "--max-model-len",
            "128",
            "--device",
            "cpu",
        ]
    )
    assert rc == 0
    beams = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [b["rank"] for b in beams] == [0, 1, 2]
    assert all(len(b["token_ids"]) == 6 and b["finish_reason"] == "length" for b in beams)
    assert [b["score"] for b in beams] == sorted((b["score"] for b in beams), reverse=True)
    assert len({tuple(b["token_ids"]) for b in beams}) == 3


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--beam-width", "0"], "beam_width"),
        (["--beam-width", "2", "--temperature", "0.7"], "--temperature"),
        (["--beam-width", "2", "--n", "3"], "--n"),
        (["--length-penalty", "2"], "--length-penalty"),  # sampling has no length penalty: not silently ignored
    ],
)
def test_bad_beam_flags_exit_2_naming_the_flag(tiny_llama, capsys, flags, named):
    rc = main(
        ["generate", "--model", str(tiny_llama), "--prompt", "hi", "--max-model-len", "128", "--device", "cpu", *flags]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and named in err[-1]
