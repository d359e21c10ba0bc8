"""The engine's build steps (engine/engine_setup.py), called directly: no model, no torch."""

import logging

import pytest

from pagedinfer.contracts.config.engine_config import EngineConfig
from pagedinfer.contracts.sizing import InsufficientMemoryError
from pagedinfer.engine import engine_setup as setup


def config(**kwargs) -> EngineConfig:
    return EngineConfig(model="m", **kwargs)


@pytest.mark.parametrize(
    "max_model_len, positions, expected",
    [
        (None, 512, 512),  # the model's positions
        (256, 512, 256),  # asked for, within them
        (None, None, setup.FALLBACK_MAX_MODEL_LEN),  # the model states none
        (4096, None, 4096),
    ],
)
def test_max_model_len_is_asked_or_the_models_positions(max_model_len, positions, expected):
    assert setup.resolve_max_model_len(config(max_model_len=max_model_len), positions) == expected


def test_max_model_len_beyond_the_models_positions_or_one_steps_budget_is_refused():
    with pytest.raises(ValueError, match=r"max_model_len: 1024 exceeds the model's max_position_embeddings \(512\)"):
        setup.resolve_max_model_len(config(max_model_len=1024), 512)
    with pytest.raises(ValueError, match=r"max_num_batched_tokens: without chunked prefill .* \(512\), got 256"):
        setup.resolve_max_model_len(config(enable_chunked_prefill=False, max_num_batched_tokens=256), 512)
    assert setup.resolve_max_model_len(config(enable_chunked_prefill=False, max_num_batched_tokens=512), 512) == 512


def test_an_override_that_fits_is_used_and_one_that_does_not_is_lowered_with_a_warning(caplog):
    assert setup.choose_num_gpu_blocks(config(), 100, 512, "cpu") == 100
    assert setup.choose_num_gpu_blocks(config(num_gpu_blocks_override=40), 100, 512, "cpu") == 40
    with caplog.at_level(logging.WARNING):
        assert setup.choose_num_gpu_blocks(config(num_gpu_blocks_override=400), 100, 512, "cuda") == 100
    assert "num_gpu_blocks_override=400 does not fit (after profiling); using 100 blocks" in caplog.text


def test_a_pool_without_room_for_one_max_model_len_sequence_is_refused():
    # 512 tokens in 16-token blocks need 32 blocks
    assert setup.choose_num_gpu_blocks(config(num_gpu_blocks_override=32), 100, 512, "cpu") == 32
    with pytest.raises(InsufficientMemoryError, match="needs 32 blocks of 16 tokens but the pool has 31"):
        setup.choose_num_gpu_blocks(config(num_gpu_blocks_override=31), 100, 512, "cpu")
    with pytest.raises(InsufficientMemoryError, match="Lower max_model_len to at most 496"):
        setup.choose_num_gpu_blocks(config(), 31, 512, "cpu")


def test_only_swap_preemption_gets_a_host_pool():
    assert setup.num_swap_blocks(config(swap_space=1), 2**20) == 0
    assert setup.num_swap_blocks(config(swap_space=0.001, preemption_mode="swap"), 2**10) == int(0.001 * 2**20)


@pytest.mark.parametrize(
    "generation_eos, tokenizer_eos, expected",
    [
        (2, 0, {2}),
        ([2, 7], 0, {2, 7}),
        ((3,), None, {3}),
        (None, 5, {5}),
        (None, None, set()),
    ],
)
def test_eos_ids_come_from_the_generation_config_else_the_tokenizer(generation_eos, tokenizer_eos, expected):
    assert setup.eos_token_ids(generation_eos, tokenizer_eos) == expected


def test_an_unloadable_tokenizer_is_a_value_error_naming_it(tmp_path):
    with pytest.raises(ValueError, match=f"tokenizer: cannot load from '{tmp_path}'"):
        setup.load_tokenizer(str(tmp_path))
