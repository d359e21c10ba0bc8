"""A tensor-parallel replica fails as one: a rank that dies or raises stops the engine with an
error naming it, and no child outlives rank 0."""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from proc_tree import alive, children, wait_gone

from pagedinfer.engine import LLM, SamplingParams
from pagedinfer.engine.batch.deltas import BlockTableUpdate, TableDeltas
from pagedinfer.engine.distributed import workers as workers_module
from pagedinfer.engine.distributed.step_message import STEP, Message, StepInputs
from pagedinfer.engine.distributed.workers import TensorParallelError

pytestmark = pytest.mark.slow
SETTINGS = dict(device="cpu", dtype="float32", tensor_parallel_size=2, num_gpu_blocks_override=64, max_model_len=256)
WORKER = b"pagedinfer.engine.distributed.worker"
LONG = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)


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
    # a step only rank 1 runs, copying a block its pool does not have: rank 1 raises before any collective
    workers.send(
        Message(
            STEP,
            StepInputs(
                [5],
                [10**6],
                [1],
                [1],
                [0],
                TableDeltas((BlockTableUpdate(10**6, 0, (0,)),)),
                blocks_to_copy=((10**6, 1),),
            ),
        )
    )
    with pytest.raises(TensorParallelError, match=r"rank 1 .*failed.*ValueError: block_mapping"):
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
    rank0 = subprocess.Popen([sys.executable, "-P", "-c", _RANK0, str(tiny_llama), str(pids_file)])
    try:
        deadline = time.monotonic() + 300
        while not pids_file.exists() or not pids_file.read_text():
            assert rank0.poll() is None and time.monotonic() < deadline, "rank 0 did not start its replica"
            time.sleep(0.1)
        (child,) = json.loads(pids_file.read_text())
        assert alive(child)
        os.kill(rank0.pid, sig)
        rank0.wait(60)
        assert not wait_gone([child]), f"rank 1 (pid {child}) outlived rank 0 killed by {sig.name}"
    finally:
        if rank0.poll() is None:
            rank0.kill()
            rank0.wait()


def test_a_layer_that_does_not_split_is_a_value_error_and_leaves_no_child(make_model):
    model = make_model("llama", intermediate_size=129)  # the heads split in two, the MLP does not
    before = children(os.getpid(), WORKER)
    with pytest.raises(
        ValueError,
        match=r"tensor_parallel_size: 2 does not divide model\.layers\.0\.mlp\.gate_proj's"
        r" 129 output features",
    ):
        LLM(str(model), **SETTINGS)
    assert children(os.getpid(), WORKER) <= before


# Put on rank 1's PYTHONPATH (ahead of site-packages): rank 1 dies importing `pagedinfer`, before it can reach
# rank 0's store. -P does not drop PYTHONPATH, so this is the decoy-directory failure on any command line.
_DEATHS_WHILE_IMPORTING = {
    "raising": (
        'raise ImportError("decoy pagedinfer: rank 1 cannot import")',
        r"exited with code 1.*ImportError: decoy pagedinfer: rank 1 cannot import",
    ),
    "killed": ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", r"killed by SIGKILL"),
}


@pytest.mark.parametrize("death", sorted(_DEATHS_WHILE_IMPORTING))
def test_a_rank_dying_before_its_handshake_fails_the_start_within_seconds_naming_it(
    tiny_llama, tmp_path, monkeypatch, death
):
    source, error = _DEATHS_WHILE_IMPORTING[death]
    (tmp_path / "pagedinfer").mkdir()
    (tmp_path / "pagedinfer" / "__init__.py").write_text(source + "\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    before = children(os.getpid(), WORKER)
    start = time.monotonic()
    with pytest.raises(
        TensorParallelError,
        match=r"(?s)tensor-parallel rank 1 \(pid \d+\) failed while "
        r"starting: " + error,
    ):
        LLM(str(tiny_llama), **SETTINGS)
    elapsed_seconds = time.monotonic() - start
    assert elapsed_seconds < 30, f"the start failed only after {elapsed_seconds:.1f} s"
    assert children(os.getpid(), WORKER) <= before


def test_a_rank_that_never_reaches_the_store_fails_the_start_after_the_store_timeout(tiny_llama, tmp_path, monkeypatch):
    (tmp_path / "pagedinfer").mkdir()
    (tmp_path / "pagedinfer" / "__init__.py").write_text("import time\ntime.sleep(120)\n")  # a hung import
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(workers_module, "STORE_TIMEOUT", datetime.timedelta(seconds=2))
    before = children(os.getpid(), WORKER)
    with pytest.raises(
        TensorParallelError,
        match=r"rank 1 \(pid \d+\) is still alive but did not finish starting"
        r" in 2 s",
    ):
        LLM(str(tiny_llama), **SETTINGS)
    assert children(os.getpid(), WORKER) <= before
