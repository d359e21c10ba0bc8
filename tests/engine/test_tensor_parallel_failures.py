"""A tensor-parallel replica fails as one: a rank that dies or raises stops the engine with an
error naming it, and no child outlives rank 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pagedinfer.engine import LLM, SamplingParams
from pagedinfer.engine.distributed.step_message import STEP, Message, StepInputs
from pagedinfer.engine.distributed.workers import TensorParallelError

pytestmark = pytest.mark.slow
SETTINGS = dict(device="cpu", dtype="float32", tensor_parallel_size=2, num_gpu_blocks_override=64,
                max_model_len=256)
LONG = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)


def _gone(pid: int) -> bool:
    """True once pid has exited (a zombie awaiting its reaper counts as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def _wait_gone(pid: int, seconds: float = 60.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return False


def test_rank1_killed_mid_generation_stops_the_engine_naming_it(tiny_llama):
    llm = LLM(str(tiny_llama), **SETTINGS)
    workers = llm.llm_engine.runner.workers
    rank1 = workers.procs[0]

    def kill_after_a_few_steps():
        while workers.channel.num_broadcasts < 5:
            time.sleep(0.001)
        rank1.kill()

    killer = threading.Thread(target=kill_after_a_few_steps)
    killer.start()
    try:
        with pytest.raises(TensorParallelError, match=r"tensor-parallel rank 1 \(pid \d+\) failed"):
            llm.generate(["The quick brown fox"] * 4, LONG)
    finally:
        killer.join()
    assert rank1.poll() is not None
    # the engine stays stopped, and says why, rather than hanging on a half replica
    with pytest.raises(TensorParallelError, match="rank 1"):
        llm.generate(["Hello"], SamplingParams(max_tokens=2))
    assert llm.get_stats().num_used_blocks == 0
    llm.shutdown()


def test_rank1_raising_stops_the_engine_with_its_error(tiny_llama):
    llm = LLM(str(tiny_llama), **SETTINGS)
    workers = llm.llm_engine.runner.workers
    # a step only rank 1 runs, writing to a block its pool does not have: rank 1 raises
    workers.send(Message(STEP, StepInputs([5], [1], [1], [[10**6]], [0])))
    with pytest.raises(TensorParallelError, match=r"rank 1 .*failed.*(Index|Runtime)Error"):
        for _ in range(200):  # the next steps notice (gloo reports the closed connection at once)
            llm.generate(["Hello"], SamplingParams(max_tokens=2))
    assert workers.procs[0].poll() == 1
    llm.shutdown()


_RANK0 = """
import json, sys, time
from pagedinfer.engine import LLM
llm = LLM(sys.argv[1], device="cpu", tensor_parallel_size=2, num_gpu_blocks_override=16, max_model_len=64)
open(sys.argv[2], "w").write(json.dumps([p.pid for p in llm.llm_engine.runner.workers.procs]))
time.sleep(600)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_child_outlives_rank0(tiny_llama, tmp_path, sig):
    pids_file = tmp_path / "pids.json"
    rank0 = subprocess.Popen([sys.executable, "-c", _RANK0, str(tiny_llama), str(pids_file)])
    try:
        deadline = time.monotonic() + 300
        while not pids_file.exists() or not pids_file.read_text():
            assert rank0.poll() is None and time.monotonic() < deadline, "rank 0 did not start its replica"
            time.sleep(0.1)
        (child,) = json.loads(pids_file.read_text())
        assert not _gone(child)
        os.kill(rank0.pid, sig)
        rank0.wait(60)
        assert _wait_gone(child), f"rank 1 (pid {child}) outlived rank 0 killed by {sig.name}"
    finally:
        if rank0.poll() is None:
            rank0.kill()
            rank0.wait()
