"""KV-cache sizing: the pure rule, its known answers, and its errors."""

import json
import subprocess
import sys

import pytest

from pagedinfer.contracts import sizing
from pagedinfer.contracts.model_shape import InvalidModelConfigError, ModelShape, resolve_dtype

LLAMA3_8B = ModelShape(
    num_layers=32,
    num_kv_heads=8,
    head_dim=128,
    num_parameters=8_030_261_248,
    dtype="bfloat16",
    hidden_size=4096,
    max_position_embeddings=8192,
)


def test_llama3_8b_needs_128_kib_per_token_and_2_mib_per_block():
    assert sizing.kv_bytes_per_token(LLAMA3_8B) == 128 * 1024
    assert sizing.kv_bytes_per_block(LLAMA3_8B, 16) == 2 * 1024 * 1024


def test_a_kv_dtype_of_its_own_sizes_each_element_by_that_dtype():
    # (a NameError until ruff's F821 found it: no caller passed kv_dtype)
    assert sizing.kv_bytes_per_token(LLAMA3_8B, kv_dtype="float32") == 256 * 1024
    assert sizing.kv_bytes_per_block(LLAMA3_8B, 16, kv_dtype="float32") == 4 * 1024 * 1024


def test_tensor_parallelism_splits_kv_heads_and_weights():
    assert sizing.kv_bytes_per_token(LLAMA3_8B, tensor_parallel_size=2) == 64 * 1024
    assert sizing.weight_bytes_per_gpu(LLAMA3_8B, 2) == LLAMA3_8B.num_parameters
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        sizing.kv_bytes_per_token(LLAMA3_8B, tensor_parallel_size=3)


def test_plan_on_an_80_gib_gpu_follows_the_documented_rule():
    inputs = sizing.SizingInputs(shape=LLAMA3_8B, gpu_memory_bytes=80 * 2**30, gpu_memory_utilization=0.9)
    r = sizing.plan_kv_cache(inputs)
    reserve = sizing.estimate_activation_reserve_bytes(LLAMA3_8B, 2048)
    usable = int(80 * 2**30 * 0.9) - LLAMA3_8B.num_parameters * 2 - reserve
    assert r.usable_bytes == usable
    assert r.num_gpu_blocks == usable // (2 * 2**20)
    assert r.max_tokens == r.num_gpu_blocks * 16
    assert r.max_concurrent_full_sequences == r.num_gpu_blocks // 512


def test_more_batched_tokens_reserve_more_activation_memory():
    small = sizing.estimate_activation_reserve_bytes(LLAMA3_8B, 512)
    large = sizing.estimate_activation_reserve_bytes(LLAMA3_8B, 8192)
    assert large > small > sizing.FIXED_OVERHEAD_BYTES


def test_model_that_does_not_fit_raises_with_the_numbers():
    with pytest.raises(sizing.InsufficientMemoryError, match=r"No room for the KV cache: .*GiB"):
        sizing.plan_kv_cache(sizing.SizingInputs(shape=LLAMA3_8B, gpu_memory_bytes=16 * 2**30))


def test_one_max_model_len_sequence_must_fit():
    with pytest.raises(sizing.InsufficientMemoryError, match="max_model_len=1000000"):
        sizing.plan_kv_cache(sizing.SizingInputs(shape=LLAMA3_8B, gpu_memory_bytes=24 * 2**30, max_model_len=1_000_000))


@pytest.mark.parametrize(
    "field, value",
    [
        ("gpu_memory_utilization", 0.0),
        ("gpu_memory_utilization", 1.01),
        ("block_size", 12),
        ("gpu_memory_bytes", 0),
        ("max_num_batched_tokens", 0),
        ("tensor_parallel_size", 0),
    ],
)
def test_bad_inputs_name_the_field(field, value):
    kwargs = dict(shape=LLAMA3_8B, gpu_memory_bytes=80 * 2**30)
    kwargs[field] = value
    with pytest.raises(ValueError, match=field):
        sizing.SizingInputs(**kwargs)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("80GiB", 80 * 2**30),
        ("81559Mi", 81559 * 2**20),
        ("40G", 40 * 10**9),
        ("1024", 1024),
        (2048, 2048),
    ],
)
def test_parse_bytes(text, expected):
    assert sizing.parse_bytes(text) == expected


def test_parse_bytes_rejects_garbage():
    with pytest.raises(ValueError, match="--gpu-memory"):
        sizing.parse_bytes("eighty gigs", name="--gpu-memory")


def test_shape_from_hf_config_counts_llama_parameters():
    cfg = {
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 8192,
    }
    shape = ModelShape.from_hf_config(cfg)
    assert shape.head_dim == 128 and shape.num_kv_heads == 8
    assert shape.num_parameters == 8_030_261_248  # Llama-3-8B's published count
    with pytest.raises(ValueError, match="num_hidden_layers"):
        ModelShape.from_hf_config({"hidden_size": 1})


def test_plan_cli_prints_the_same_numbers_as_the_function(tmp_path):
    cfg = {
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 8192,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    out = subprocess.run(
        [
            sys.executable,
            "-P",
            "-m",
            "pagedinfer.engine.cli",
            "plan",
            "--model",
            str(tmp_path),
            "--gpu-memory",
            "80GiB",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    expected = sizing.plan_kv_cache(
        sizing.SizingInputs(shape=ModelShape.from_hf_config(cfg), gpu_memory_bytes=80 * 2**30)
    )
    assert json.loads(out)["num_gpu_blocks"] == expected.num_gpu_blocks
    assert json.loads(out)["bytes_per_token"] == 131072
    bad = subprocess.run(
        [sys.executable, "-P", "-m", "pagedinfer.engine.cli", "plan", "--model", str(tmp_path), "--gpu-memory", "8GiB"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "No room for the KV cache" in bad.stderr


LLAMA3_8B_CONFIG = {
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 8192,
}
BAD_CONFIGS = [
    ({**LLAMA3_8B_CONFIG, "num_attention_heads": 0}, "num_attention_heads", 0),
    ({**LLAMA3_8B_CONFIG, "num_attention_heads": 8192}, "num_attention_heads", 8192),  # head_dim would be 0
    ({**LLAMA3_8B_CONFIG, "head_dim": [1]}, "head_dim", [1]),
    ({**LLAMA3_8B_CONFIG, "max_position_embeddings": float("inf")}, "max_position_embeddings", float("inf")),
    ({**LLAMA3_8B_CONFIG, "num_hidden_layers": 32.5}, "num_hidden_layers", 32.5),
    ({**LLAMA3_8B_CONFIG, "num_hidden_layers": True}, "num_hidden_layers", True),
    ({**LLAMA3_8B_CONFIG, "num_hidden_layers": 10**9}, "num_hidden_layers", 10**9),
    ({**LLAMA3_8B_CONFIG, "num_key_value_heads": -8}, "num_key_value_heads", -8),
    ({**LLAMA3_8B_CONFIG, "vocab_size": "128k"}, "vocab_size", "128k"),
    ({**LLAMA3_8B_CONFIG, "torch_dtype": "int8"}, "torch_dtype", "int8"),
    ({**LLAMA3_8B_CONFIG, "text_config": [1]}, "text_config", [1]),
    ([LLAMA3_8B_CONFIG], "config.json", "list"),
    ({"hidden_size": 4096, "num_attention_heads": 32}, "num_hidden_layers", None),
]


@pytest.mark.parametrize("config, field, value", BAD_CONFIGS)
def test_a_bad_config_names_the_field_and_its_value(config, field, value):
    with pytest.raises(InvalidModelConfigError) as info:
        ModelShape.from_hf_config(config)
    assert (info.value.field, info.value.value) == (field, value)
    assert field in str(info.value)


@pytest.mark.parametrize("config, field, value", BAD_CONFIGS[:4] + BAD_CONFIGS[-2:-1])
def test_plan_answers_a_bad_config_with_one_line_and_exit_2(tmp_path, config, field, value):
    text = json.dumps(config).replace("Infinity", "1e400")  # what a config.json holding 1e400 parses to
    (tmp_path / "config.json").write_text(text)
    run = subprocess.run(
        [
            sys.executable,
            "-P",
            "-m",
            "pagedinfer.engine.cli",
            "plan",
            "--model",
            str(tmp_path),
            "--gpu-memory",
            "80GiB",
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and field in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("memory", ["1e30GiB", "1e400", "2PiB", "-1"])
def test_plan_refuses_a_gpu_memory_no_gpu_has(tmp_path, memory):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B_CONFIG))
    run = subprocess.run(
        [
            sys.executable,
            "-P",
            "-m",
            "pagedinfer.engine.cli",
            "plan",
            "--model",
            str(tmp_path),
            f"--gpu-memory={memory}",
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "--gpu-memory" in run.stderr, run.stderr


@pytest.mark.parametrize(
    "requested, declared, device, expected",
    [
        ("auto", None, "cuda", "bfloat16"),
        ("auto", None, "cpu", "float32"),
        ("auto", "float16", "cuda", "float16"),
        ("auto", "float16", "cpu", "float32"),
        ("auto", "bfloat16", "cpu", "bfloat16"),
        ("auto", "torch.float32", "cuda", "float32"),
        ("float16", "bfloat16", "cpu", "float16"),
    ],
)
def test_dtype_auto_is_decided_in_one_place(requested, declared, device, expected):
    config = {} if declared is None else {"torch_dtype": declared}
    assert resolve_dtype(requested, config, device) == expected
    assert resolve_dtype(requested, {"text_config": config} if config else {}, device) == expected
