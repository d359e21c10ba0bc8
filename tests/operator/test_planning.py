"""The operator's KV plan is pagedinfer.contracts.sizing's, with inputs chosen from the spec."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pagedinfer.contracts import sizing
from pagedinfer.operator.kv_plan import planning
from pagedinfer.operator.spec.parser import parse_spec

LLAMA3_8B = {
    "numLayers": 32,
    "numKVHeads": 8,
    "headDim": 128,
    "numParameters": 8_030_261_248,
    "hiddenSize": 4096,
    "maxPositionEmbeddings": 8192,
}
LLAMA3_8B_CONFIG = {
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
H100_BYTES = 81559 * 2**20
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def spec(**engine):
    return parse_spec("llama", {"model": {"architecture": LLAMA3_8B}, "engine": engine})


def test_llama3_8b_is_128_kib_per_token_and_2_mib_per_block():
    s = spec()
    plan = planning.plan_for(
        s, planning.shape_from_architecture(s.model.architecture, "auto"), H100_BYTES, planning.SOURCE_NODE_LABELS
    )
    assert plan.bytes_per_token == 128 * 1024
    assert plan.bytes_per_block == 2 * 2**20
    assert plan.max_tokens == plan.num_gpu_blocks * 16


def test_the_formula_holds_exactly():
    s = spec(gpuMemoryUtilization=0.85, maxNumBatchedTokens=4096)
    shape = planning.shape_from_architecture(s.model.architecture, "auto")
    plan = planning.plan_for(s, shape, H100_BYTES, planning.SOURCE_SPEC)
    usable = int(H100_BYTES * 0.85) - 8_030_261_248 * 2 - sizing.estimate_activation_reserve_bytes(shape, 4096)
    assert plan.num_gpu_blocks == usable // (2 * 2**20)
    assert plan.weight_bytes_per_gpu == 8_030_261_248 * 2


def test_tensor_parallelism_splits_weights_and_kv_heads():
    one = spec()
    four = parse_spec("llama", {"model": {"architecture": LLAMA3_8B}, "engine": {"tensorParallelSize": 4}})
    shape = planning.shape_from_architecture(one.model.architecture, "auto")
    p1 = planning.plan_for(one, shape, H100_BYTES, "spec")
    p4 = planning.plan_for(four, shape, H100_BYTES, "spec")
    assert p4.bytes_per_block * 4 == p1.bytes_per_block
    assert p4.weight_bytes_per_gpu * 4 == p1.weight_bytes_per_gpu
    assert p4.num_gpu_blocks > 4 * p1.num_gpu_blocks
    assert (p4.to_status()["tensorParallelSize"], p1.to_status()["tensorParallelSize"]) == (4, 1)


def test_a_model_that_does_not_fit_raises_with_the_numbers():
    s = spec()
    shape = planning.shape_from_architecture(s.model.architecture, "auto")
    with pytest.raises(sizing.InsufficientMemoryError, match=r"GiB"):
        planning.plan_for(s, shape, 16 * 2**30, "node-labels")


def test_one_max_model_len_sequence_must_fit():
    s = parse_spec("llama", {"model": {"architecture": {**LLAMA3_8B, "maxPositionEmbeddings": 10_000_000}}})
    shape = planning.shape_from_architecture(s.model.architecture, "auto")
    with pytest.raises(sizing.InsufficientMemoryError, match="max_model_len"):
        planning.plan_for(s, shape, H100_BYTES, "node-labels")


def test_override_skips_sizing():
    s = parse_spec("x", {"engine": {"numGpuBlocksOverride": 1234, "blockSize": 32}})
    plan = planning.plan_for(s, None, None, "ignored")
    assert (plan.source, plan.num_gpu_blocks, plan.max_tokens) == ("override", 1234, 1234 * 32)


TINY_CONFIG = {
    "num_hidden_layers": 4,
    "hidden_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 384,
    "vocab_size": 2048,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "dtype": "float32",
}


def cpu_spec(**resources):
    return parse_spec("tiny", {"resources": {"gpus": 0, **resources}, "engine": {"maxModelLen": 512}})


def test_a_cpu_engine_is_sized_from_its_pod_memory_less_the_runtime_overhead():
    s = cpu_spec(memory="2Gi")
    shape = planning.shape_from_config(TINY_CONFIG, "auto", cpu=True)
    plan = planning.plan_for(s, shape, None, "ignored")
    budget = 2 * 2**30 - planning.CPU_RUNTIME_OVERHEAD_BYTES
    reserve = 2048 * sizing.ACTIVATION_HIDDEN_MULTIPLE * 128 * 4  # the per-token term alone, as the engine on a CPU
    usable = int(budget * 0.9) - shape.num_parameters * 4 - reserve
    assert plan.num_gpu_blocks == usable // (2 * 4 * 2 * 32 * 4 * 16)
    assert plan.to_status() == {
        "source": "memory",
        "blockSize": 16,
        "numGpuBlocks": plan.num_gpu_blocks,
        "maxTokens": plan.max_tokens,
        "weightBytesPerGpu": shape.num_parameters * 4,
        "bytesPerToken": 2048,
        "bytesPerBlock": 32768,
        "cpuMemoryBudgetBytes": budget,
    }


def test_pagedinfer_plan_on_a_cpu_gives_the_operators_cpu_number(tmp_path, capsys):
    """Both build their SizingInputs with contracts/sizing_inputs.py: --device cpu takes the CPU reserve too."""
    from pagedinfer.engine.cli import main

    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIG))
    plan = planning.plan_for(
        cpu_spec(memory="2Gi"), planning.shape_from_config(TINY_CONFIG, "auto", cpu=True), None, ""
    )
    budget = str(2 * 2**30 - planning.CPU_RUNTIME_OVERHEAD_BYTES)
    argv = ["plan", "--model", str(tmp_path), "--gpu-memory", budget, "--max-model-len", "512", "--device", "cpu"]
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_gpu_blocks"] == plan.num_gpu_blocks


def test_unset_cpu_memory_is_the_documented_default_and_a_cpu_engine_without_the_shape_sizes_itself():
    s = cpu_spec()
    assert planning.cpu_memory(s) == ("3Gi", 3 * 2**30)
    plan = planning.plan_for(s, None, None, "ignored")
    assert plan.to_status() == {"source": "engine", "blockSize": 16, "cpuMemoryBudgetBytes": 2 * 2**30}
    override = planning.plan_for(
        parse_spec("x", {"resources": {"gpus": 0}, "engine": {"numGpuBlocksOverride": 64}}), None, None, "ignored"
    )
    assert (override.source, override.num_gpu_blocks, override.cpu_memory_budget_bytes) == ("override", 64, 2**31)


def test_a_cpu_engine_runs_float16_models_in_float32_as_the_engine_does():
    assert planning.shape_from_config({**TINY_CONFIG, "dtype": "float16"}, "auto", cpu=True).dtype == "float32"
    assert planning.shape_from_config({**TINY_CONFIG, "dtype": "float16"}, "auto").dtype == "float16"
    assert planning.shape_from_config({**TINY_CONFIG, "dtype": "bfloat16"}, "auto", cpu=True).dtype == "bfloat16"
    assert planning.shape_from_config({**TINY_CONFIG, "dtype": "float16"}, "float16", cpu=True).dtype == "float16"


def test_a_cpu_engine_too_small_for_one_sequence_names_the_memory_that_fits():
    shape = planning.shape_from_config({**TINY_CONFIG, "num_hidden_layers": 64}, "auto", cpu=True)
    s = parse_spec("tiny", {"resources": {"gpus": 0, "memory": "1100Mi"}, "engine": {"maxModelLen": 2048}})
    with pytest.raises(sizing.InsufficientMemoryError) as info:
        planning.plan_for(s, shape, None, "ignored")
    message = str(info.value)
    assert message.startswith("The CPU engine does not fit in spec.resources.memory 1100Mi")
    assert "one maxModelLen=2048 sequence needs 128" in message and "budget of 0.07 GiB" in message
    least = re.search(r"at least (\d+Mi)", message).group(1)
    fits = parse_spec("tiny", {"resources": {"gpus": 0, "memory": least}, "engine": {"maxModelLen": 2048}})
    assert planning.plan_for(fits, shape, None, "ignored").num_gpu_blocks >= 128
    with pytest.raises(sizing.InsufficientMemoryError, match="runtime alone takes 1.00 GiB"):
        planning.plan_for(cpu_spec(memory="1Gi"), shape, None, "ignored")


def test_status_fields_are_camel_case_and_complete():
    s = spec()
    plan = planning.plan_for(
        s, planning.shape_from_architecture(s.model.architecture, "auto"), H100_BYTES, "node-labels"
    )
    assert set(plan.to_status()) == {
        "source",
        "tensorParallelSize",
        "blockSize",
        "numGpuBlocks",
        "maxTokens",
        "gpuMemoryBytes",
        "weightBytesPerGpu",
        "bytesPerToken",
        "bytesPerBlock",
    }  # no CPU budget


def test_gpu_pods_tolerate_the_gpu_taint_and_select_the_product():
    s = parse_spec("x", {"resources": {"gpuProduct": "NVIDIA-L4"}, "nodeSelector": {"pool": "gpu"}})
    placement = planning.placement_for(s)
    assert placement.node_selector == {"pool": "gpu", "nvidia.com/gpu.product": "NVIDIA-L4"}
    assert planning.GPU_TOLERATION in placement.tolerations
    assert planning.placement_for(parse_spec("x", {"resources": {"gpus": 0}})).tolerations == ()


def test_pagedinfer_plan_gives_the_same_number(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B_CONFIG))
    s = parse_spec("llama", {"engine": {"maxModelLen": 8192}})
    plan = planning.plan_for(s, planning.shape_from_config(LLAMA3_8B_CONFIG, "auto"), H100_BYTES, "spec")
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
            "81559Mi",
            "--max-model-len",
            "8192",
            "--json",
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd="/",
    ).stdout
    assert json.loads(out)["num_gpu_blocks"] == plan.num_gpu_blocks


LLAMA3_70B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}


def test_the_tensor_parallel_example_and_pagedinfer_plan_give_the_same_numbers(tmp_path):
    example = yaml.safe_load((EXAMPLES / "llama3-70b-tensor-parallel.yaml").read_text())
    s = parse_spec(example["metadata"]["name"], example["spec"])
    assert (s.engine.tensor_parallel_size, s.resources.gpus) == (4, 4)
    shape = planning.shape_from_architecture(s.model.architecture, s.model.dtype)
    status = planning.plan_for(s, shape, H100_BYTES, "node-labels").to_status()
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_70B_CONFIG))
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
            "81559Mi",
            "--max-model-len",
            "8192",
            "--tensor-parallel-size",
            "4",
            "--json",
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd="/",
    ).stdout
    cli = json.loads(out)
    assert status["tensorParallelSize"] == 4
    assert (status["numGpuBlocks"], status["maxTokens"], status["bytesPerBlock"], status["weightBytesPerGpu"]) == (
        cli["num_gpu_blocks"],
        cli["max_tokens"],
        cli["bytes_per_block"],
        cli["weight_bytes_per_gpu"],
    )
