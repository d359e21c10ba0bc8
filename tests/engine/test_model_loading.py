"""Models that cannot run are refused at load time with a clear ValueError."""

import json
import shutil

import pytest

from pagedinfer.engine import LLM
from pagedinfer.engine.runner.loading import check_rope


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
        {"rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}},
        {
            "rope_parameters": {
                "full_attention": {"rope_type": "dynamic", "factor": 2.0},
                "sliding_attention": {"rope_type": "default"},
            }
        },
    ],
)
def test_batch_dependent_rope_is_rejected_naming_the_model(rope):
    with pytest.raises(ValueError, match="model: rope type"):
        check_rope({"num_hidden_layers": 1, **rope})


@pytest.mark.parametrize(
    "rope", [None, {"rope_type": "default"}, {"rope_type": "llama3", "factor": 8.0}, {"type": "linear", "factor": 2.0}]
)
def test_position_independent_rope_is_accepted(rope):
    check_rope({"rope_scaling": rope})


def test_a_corrupt_weights_file_is_a_clear_error(tiny_llama, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_llama, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match="model: cannot load"):
        LLM(model=str(broken))


def test_an_inconsistent_config_is_a_clear_error(tiny_llama, tmp_path):
    broken = tmp_path / "odd-heads"
    shutil.copytree(tiny_llama, broken)
    config = json.loads((broken / "config.json").read_text())
    config["num_attention_heads"] = 7
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="model"):
        LLM(model=str(broken))


def test_an_override_larger_than_the_budget_is_lowered_with_a_warning(tiny_llama, caplog):
    llm = LLM(
        model=str(tiny_llama),
        num_gpu_blocks_override=10**10,
        max_model_len=128,
        cpu_memory_budget_bytes=64 * 2**20,
        dtype="float32",
    )
    blocks = llm.get_stats().num_total_blocks
    assert 8 <= blocks < 10**10
    assert any("does not fit" in r.getMessage() for r in caplog.records)
