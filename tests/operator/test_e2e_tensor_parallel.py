"""A tensorParallelSize: 2 InferenceService end to end: the real kopf runtime against the emulator sizes it
per GPU on nodes with two GPUs, and the kubelet harness runs its pod's real command line (two ranks)."""

import contextlib
from pathlib import Path

import openai
import pytest

from pagedinfer.testing.kubelet_harness import KubeletHarness
from pagedinfer.testing.operator_harness import (
    DEPLOYMENTS,
    ISVC,
    LLAMA3_8B,
    add_gpu_node,
    condition,
    eventually,
    inference_service,
    isvc_of,
    running_operator,
)

pytestmark = pytest.mark.timeout(300)


def children_of(pid: int) -> list[int]:
    """The live processes whose parent is `pid` (from /proc/<pid>/stat's ppid field)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if int(entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


async def test_two_ranks_need_two_gpus_on_one_node_and_are_sized_per_gpu(emulator):
    await add_gpu_node(emulator, "one-gpu", 81559, gpus=1)
    async with running_operator():
        await emulator.create(
            ISVC,
            inference_service("llama", {"model": {"architecture": LLAMA3_8B}, "engine": {"tensorParallelSize": 2}}),
        )
        sized = await eventually(lambda: condition(isvc_of(emulator), "Sized"))
        assert (sized["status"], sized["reason"]) == ("False", "NoMatchingNodes")
        assert "with fewer than 2 allocatable nvidia.com/gpu" in sized["message"]
        assert "needs 2 allocatable nvidia.com/gpu on one node" in sized["message"]
        assert emulator.read(DEPLOYMENTS, "default", "llama") is None
        await add_gpu_node(emulator, "two-gpus", 81559, gpus=2)
        await eventually(lambda: condition(isvc_of(emulator), "Sized")["status"] == "True")
        kv = isvc_of(emulator)["status"]["kvCache"]
        pod = (await eventually(lambda: emulator.read(DEPLOYMENTS, "default", "llama")))["spec"]["template"]["spec"]
    one_gpu = LLAMA3_8B["numLayers"] * 2 * LLAMA3_8B["numKVHeads"] * LLAMA3_8B["headDim"] * 2 * 16  # bf16, 16 tokens
    assert (kv["tensorParallelSize"], kv["bytesPerBlock"]) == (2, one_gpu // 2)
    assert kv["maxTokens"] == kv["numGpuBlocks"] * 16
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert container["args"][container["args"].index("--tensor-parallel-size") + 1] == "2"
    assert {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "3Gi"}} in pod["volumes"]


@pytest.mark.slow
async def test_a_two_rank_pod_runs_its_real_command_line_and_serves(emulator, tmp_path):
    # the engine's embedded tiny model (4 attention heads, 2 KV heads); two CPU ranks play the pod's two GPUs
    await emulator.create(
        ISVC,
        inference_service(
            "tiny", {"engine": {"tensorParallelSize": 2, "numGpuBlocksOverride": 32, "maxModelLen": 256}}
        ),
    )
    harness = KubeletHarness(emulator, "default", "tiny", tmp_path, max_engines=1)
    async with harness.running(), running_operator():  # an engine that exits fails the wait at once, naming it
        await eventually(lambda: harness.urls, timeout_seconds=240)
        client = openai.AsyncOpenAI(base_url=f"{harness.urls[0]}/v1", api_key="unused", timeout=60, max_retries=0)
        engine = harness.engines[0]
        argv = open(f"/proc/{engine.process.pid}/cmdline", "rb").read().split(b"\0")
        ranks = children_of(engine.process.pid)
        model = (await client.models.list()).data[0].id
        completion = await client.completions.create(model=model, prompt="Hello", max_tokens=4)
        await client.close()
    assert argv[argv.index(b"--tensor-parallel-size") + 1] == b"2"
    assert len(ranks) == 1  # rank 1, started by rank 0 (engine/distributed/workers.py)
    assert completion.usage.completion_tokens == 4
