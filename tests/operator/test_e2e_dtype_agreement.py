"""dtype auto means one thing: the engine, `pagedinfer plan` and the operator size the same pool.

A config.json without torch_dtype (or dtype) is the case where they used to disagree: the engine
ran float32 while `plan` and the operator sized bfloat16, half the bytes per block. Here the same
config.json goes through the three real paths: a CPU engine (LLM) built from a tiny model whose
config names no dtype, `pagedinfer plan` as a process, and the operator (real kopf against the
emulator) reading it from a ConfigMap, once for a CPU engine and once for a GPU one. There is no
GPU here: the engine's GPU answer is its own resolve_dtype for a cuda device.
"""

import dataclasses
import json
import shutil
import subprocess
import sys

import pytest
import torch

from pagedinfer.contracts import sizing
from pagedinfer.engine.llm import LLM
from pagedinfer.engine.runner.loading import resolve_dtype
from pagedinfer.testing.operator_harness import (
    CONFIGMAPS,
    ISVC,
    eventually,
    inference_service,
    isvc_of,
    running_operator,
)

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def undeclared_dtype_model(make_model, tmp_path):
    """The tiny llama, its config.json stripped of torch_dtype and dtype."""
    model = shutil.copytree(make_model("llama"), tmp_path / "no-dtype")
    config = json.loads((model / "config.json").read_text())
    for key in ("torch_dtype", "dtype"):
        config.pop(key, None)
    (model / "config.json").write_text(json.dumps(config))
    return model, config


def plan_bytes_per_block(model, device: str) -> int:
    out = subprocess.run(
        [
            sys.executable,
            "-P",
            "-m",
            "pagedinfer.engine.cli",
            "plan",
            "--model",
            str(model),
            "--gpu-memory",
            "2GiB",
            "--device",
            device,
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)["bytes_per_block"]


async def operator_bytes_per_block(emulator, config) -> dict[str, int]:
    """status.kvCache.bytesPerBlock of a CPU engine and a GPU engine sized from a ConfigMap holding `config`."""
    await emulator.create(
        CONFIGMAPS,
        {"metadata": {"name": "tiny-config", "namespace": "default"}, "data": {"config.json": json.dumps(config)}},
    )
    model = {"uri": "pvc://models/tiny", "configMapRef": {"name": "tiny-config"}}
    async with running_operator():
        await emulator.create(ISVC, inference_service("cpu", {"model": model, "resources": {"gpus": 0}}))
        await emulator.create(ISVC, inference_service("gpu", {"model": model, "resources": {"gpuMemory": "80Gi"}}))
        return {
            name: (await eventually(lambda: isvc_of(emulator, name)["status"]["kvCache"]))["bytesPerBlock"]
            for name in ("cpu", "gpu")
        }


async def test_engine_plan_and_operator_agree_on_the_bytes_per_block(emulator, undeclared_dtype_model):
    model, config = undeclared_dtype_model
    llm = LLM(model=str(model), device="cpu", max_model_len=256, cpu_memory_budget_bytes=64 << 20)
    engine = llm.llm_engine
    cache = engine.runner.kv_cache
    assert cache.dtype == torch.float32
    # what the engine really allocated per block, over all layers, K and V
    engine_cpu = cache.nbytes // engine.num_gpu_blocks
    assert engine_cpu == engine.bytes_per_block

    operator = await operator_bytes_per_block(emulator, config)
    assert plan_bytes_per_block(model, "cpu") == operator["cpu"] == engine_cpu

    gpu_dtype = str(resolve_dtype("auto", config, torch.device("cuda"))).removeprefix("torch.")
    assert gpu_dtype == "bfloat16"
    # the engine's own shape of the loaded model, in the dtype it would pick on a GPU
    engine_gpu = sizing.kv_bytes_per_block(dataclasses.replace(engine.runner.model_shape(), dtype=gpu_dtype), 16)
    assert plan_bytes_per_block(model, "cuda") == operator["gpu"] == engine_gpu == engine_cpu // 2
