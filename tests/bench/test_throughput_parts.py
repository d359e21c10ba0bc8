"""The throughput benchmark's pure parts: its flags, the CPU pinning of every system, the CPU time of a process
tree, greedy agreement and the step breakdown's classification. Cheap: no vLLM, no timed assertion; the script itself is not run here."""

from __future__ import annotations

import ctypes
import mmap
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from affinity import format_cpu_list, parse_cpu_list
from agreement import agreement
from breakdown import Breakdown, Labels, classify, label
from proc_stats import (
    CLOCK_TICKS_PER_SECOND,
    peak_rss_bytes,
    resident_fraction,
    rss_bytes,
    tree,
    tree_cpu_seconds,
    tree_peak_rss_bytes,
)
from throughput import MODELS, _engine_run, parse_args, summary
from workload import RunResult


# ----- flags ---------------------------------------------------------------------------------------
def test_models_and_dtypes_are_comma_separated_lists_with_tiny_and_both_dtypes_by_default():
    args = parse_args(["--skip-vllm"])
    assert args.models == ["tiny"] and args.dtypes == ["float32", "bfloat16"]
    args = parse_args(["--models", "tiny,125m", "--dtypes", "bfloat16", "--skip-vllm"])
    assert args.models == ["tiny", "125m"] and args.dtypes == ["bfloat16"]
    assert parse_args(["--model", "125m", "--skip-vllm"]).models == ["125m"]
    assert parse_args(["--skip-vllm"]).compile == "both"  # pagedinfer eager and compiled, two rows
    shape = MODELS["125m"].shape
    assert (
        shape["hidden_size"],
        shape["num_hidden_layers"],
        shape["num_attention_heads"],
        shape["num_key_value_heads"],
        shape["vocab_size"],
    ) == (768, 12, 12, 4, 32000)


def test_async_scheduling_rows_are_checked_against_their_compile_runs_first_row():
    assert parse_args(["--skip-vllm"]).async_scheduling == ["off"]
    assert parse_args(["--skip-vllm", "--async-scheduling", "off,on"]).async_scheduling == ["off", "on"]
    with pytest.raises(SystemExit):
        parse_args(["--skip-vllm", "--async-scheduling", "yes"])
    assert {
        _engine_run(s)
        for s in ("pagedinfer", "pagedinfer+async", "pagedinfer+overlap-process", "pagedinfer+overlap-thread+async")
    } == {"pagedinfer"}
    assert _engine_run("pagedinfer+compile+async") == "pagedinfer+compile"


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--models", "tiny,7b", "--skip-vllm"], "--models"),
        (["--dtypes", "float16", "--skip-vllm"], "--dtypes"),
        (["--models", "tiny"], "--vllm-python"),
        (["--breakdown-every", "0", "--skip-vllm"], "--breakdown-every"),
        (["--rounds", "0", "--skip-vllm"], "--rounds"),
        (["--compile", "yes", "--skip-vllm"], "--compile"),
        (["--overlap", "yes", "--skip-vllm"], "--overlap"),
        (["--profile", "p.out", "--skip-vllm"], "--profile"),  # two dtypes by default: which one to profile?
        (["--cpus", "0-a", "--skip-vllm"], "--cpus"),
        (["--cpus", "3-1", "--skip-vllm"], "--cpus"),
        (["--cpus", "", "--skip-vllm"], "--cpus"),
        (["--cpus", "100000", "--skip-vllm"], "--cpus"),  # a CPU this process may not use
        (["--cpus", "0", "--threads", "2", "--skip-vllm"], "--threads"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(argv, named, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert named in capsys.readouterr().err


# ----- CPU pinning (--cpus) ------------------------------------------------------------------------
def test_cpu_lists_parse_as_taskset_takes_them_and_print_back_shortest():
    usable = sorted(os.sched_getaffinity(0))
    assert parse_cpu_list(str(usable[0])) == {usable[0]}
    assert parse_cpu_list(",".join(map(str, usable))) == set(usable)
    if usable == list(range(usable[0], usable[-1] + 1)):
        assert parse_cpu_list(f"{usable[0]}-{usable[-1]}") == set(usable)
    assert parse_args(["--cpus", str(usable[-1]), "--skip-vllm"]).cpus == {usable[-1]}
    assert parse_args(["--skip-vllm"]).cpus is None
    assert format_cpu_list({5, 0, 1, 2, 7, 8}) == "0-2,5,7-8"


PINNED_CHILDREN = """
import os, subprocess, sys
from affinity import pin
from throughput import _in_child
print(pin(frozenset({CPU})))
print(sorted(_in_child(os.sched_getaffinity, 0)))  # a system's process, as the bench starts it
grandchild = "import os; print(sorted(os.sched_getaffinity(0)))"
child = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {grandchild!r}])"
sys.stdout.flush()
subprocess.run([sys.executable, "-P", "-c", child])  # a runner and the process it starts (vLLM's engine core)
"""


def test_pinning_reaches_every_system_process_and_the_processes_they_start():
    cpu = max(os.sched_getaffinity(0))  # on a multi-CPU machine not the default set
    bench = os.path.dirname(sys.modules["affinity"].__file__)
    proc = subprocess.run(
        [sys.executable, "-P", "-c", PINNED_CHILDREN.replace("CPU", str(cpu))],
        cwd=bench,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=bench),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"every system pinned to cpus {cpu}", f"[{cpu}]", f"[{cpu}]"]


# ----- CPU time and RSS of a process tree -------------------------------------------------------------
def _fake_process(
    root, pid: int, parent: int, utime_ticks: int, stime_ticks: int, name: str = "python3", hwm_kib: int = 0
) -> None:
    (root / str(pid)).mkdir()
    fields = ["S", str(parent)] + ["0"] * 9 + [str(utime_ticks), str(stime_ticks)] + ["0"] * 10
    (root / str(pid) / "stat").write_text(f"{pid} ({name}) {' '.join(fields)}\n")
    (root / str(pid) / "status").write_text(f"Name:\t{name}\nVmHWM:\t{hwm_kib} kB\nVmRSS:\t1 kB\n")


def test_a_tree_sums_the_process_and_every_descendant_and_nothing_else(tmp_path):
    _fake_process(tmp_path, 100, 1, 300, 100, hwm_kib=1000)  # the runner
    _fake_process(tmp_path, 101, 100, 50, 50, "VLLM::EngineCore", hwm_kib=2000)  # its child
    _fake_process(tmp_path, 103, 101, 7, 3, "a) (b c", hwm_kib=30)  # grandchild; ')' and spaces in its name
    _fake_process(tmp_path, 102, 1, 999, 999, hwm_kib=5000)  # a sibling of the runner: not in its tree
    (tmp_path / "self").mkdir()  # non-process entries are skipped
    assert [s.pid for s in tree(100, tmp_path)] == [100, 101, 103]
    assert tree_cpu_seconds(100, tmp_path) == pytest.approx(510 / CLOCK_TICKS_PER_SECOND)
    assert tree_cpu_seconds(101, tmp_path) == pytest.approx(110 / CLOCK_TICKS_PER_SECOND)
    assert tree_peak_rss_bytes(100, tmp_path) == 3030 * 1024
    assert tree(999, tmp_path) == [] and tree_cpu_seconds(999, tmp_path) == 0


def test_resident_fraction_counts_only_the_written_pages_of_an_allocation():
    """What bench/rss_passes.py reads of the KV pool: an anonymous mapping is charged page by page on first write."""
    page = mmap.PAGESIZE
    region = mmap.mmap(-1, 64 * page)
    address = ctypes.addressof(ctypes.c_char.from_buffer(region))
    try:
        assert resident_fraction(address, 64 * page) == 0.0
        for i in range(0, 16 * page, page):  # the first quarter
            region[i] = 1
        assert resident_fraction(address, 64 * page) == 0.25
        assert resident_fraction(address + 16 * page, 48 * page) == 0.0
        assert resident_fraction(address + page // 2, page) == 1.0  # straddles pages 0 and 1, both written
    finally:
        region.close()
    assert rss_bytes(os.getpid()) > 0 and rss_bytes(os.getpid()) <= peak_rss_bytes(os.getpid())


def test_a_live_childs_cpu_time_counts_in_its_parents_tree():
    child = subprocess.Popen(
        [
            sys.executable,
            "-P",
            "-c",
            "import sys, time\nwhile time.process_time() < 0.3: pass\nprint('burnt', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "burnt"
        own = sum(os.times()[:2])
        # the child's own clock says it used >= 0.3 s; /proc rounds to ticks
        assert tree_cpu_seconds(os.getpid()) - own >= 0.3 - 2 / CLOCK_TICKS_PER_SECOND
        assert child.pid in [s.pid for s in tree(os.getpid())]
        assert peak_rss_bytes(child.pid) > 0
    finally:
        child.communicate("")
    assert child.pid not in [s.pid for s in tree(os.getpid())]


# ----- greedy agreement ---------------------------------------------------------------------------
def test_agreement_counts_first_tokens_whole_sequences_and_the_common_prefix():
    ref = [(1, 2, 3, 4), (5, 6), (7, 8, 9), (1,)]
    out = [(1, 2, 3, 4), (5, 0), (0, 8, 9), (1,)]
    found = agreement(out, ref)
    assert found.num_requests == 4
    assert found.first_token == 0.75 and found.whole_sequence == 0.5
    assert found.prefix_tokens == pytest.approx((4 + 1 + 0 + 1) / 10)


def test_agreement_says_the_standard_error_of_its_first_token_share():
    found = agreement([(1,)] * 7 + [(2,)] * 3, [(1,)] * 10)
    assert found.first_token_stderr == pytest.approx((0.7 * 0.3 / 10) ** 0.5)
    assert str(found).startswith("first token 70.0% +- 14.5%, whole sequence 70.0% of 10 requests")


def test_agreement_covers_the_requests_both_sides_have_and_refuses_none():
    assert agreement([(1,), (2,), (3,)], [(1,), (9,)]).whole_sequence == 0.5  # reference on a subset
    with pytest.raises(ValueError, match="no request"):
        agreement([], [(1,)])


# ----- step breakdown -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "chain, category",
    [
        (["aten::mm"], None),  # outside a step
        ([label("step"), label("schedule")], "bookkeeping"),
        ([label("step"), label("execute"), "aten::index_select"], "bookkeeping"),  # input preparation
        ([label("step"), label("execute"), label("model"), "aten::linear", "aten::mm"], "matmul"),
        ([label("step"), label("execute"), label("model"), "mkldnn::_linear_pointwise"], "matmul"),
        ([label("step"), label("execute"), label("model"), label("attention"), "aten::bmm"], "attention"),
        ([label("step"), label("execute"), label("model"), "pagedinfer::paged_attention"], "attention"),
        ([label("step"), label("execute"), label("model"), "aten::rms_norm"], "model other"),
        ([label("step"), label("sample"), "aten::argmax"], "sampling"),
        ([label("step")], "output"),
    ],
)
def test_classify_by_the_enclosing_labels_and_ops(chain, category):
    assert classify(chain) == category


def test_breakdown_adds_self_times_by_category():
    step = SimpleNamespace(name=label("step"), cpu_parent=None, self_cpu_time_total=10.0)
    model = SimpleNamespace(name=label("model"), cpu_parent=step, self_cpu_time_total=5.0)
    linear = SimpleNamespace(name="aten::linear", cpu_parent=model, self_cpu_time_total=1.0)
    mm = SimpleNamespace(name="aten::mm", cpu_parent=linear, self_cpu_time_total=60.0)
    stray = SimpleNamespace(name="aten::add", cpu_parent=None, self_cpu_time_total=99.0)
    found = Breakdown()
    found.add_events([step, model, linear, mm, stray])
    assert found.num_steps == 1
    assert found.microseconds["matmul"] == 61.0 and found.microseconds["model other"] == 5.0
    assert found.microseconds["output"] == 10.0
    assert found.shares()["matmul"] == pytest.approx(61 / 76)
    assert Breakdown.from_dict(found.to_dict()) == found


def test_labels_on_a_real_engine_see_every_phase_and_are_removed_after(tiny_llama):
    import torch
    from runners import _drain
    from workload import TokenIdsRequest

    from pagedinfer.contracts.config.engine_config import EngineConfig
    from pagedinfer.engine import LLMEngine

    engine = LLMEngine(
        EngineConfig(
            model=str(tiny_llama),
            num_gpu_blocks_override=32,
            block_size=16,
            max_model_len=128,
            dtype="float32",
            device="cpu",
        )
    )
    labels = Labels(engine)
    found = Breakdown()
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    # the fused CPU decoder calls the attention's packed form: the label wraps that too
    assert callable(ALL_ATTENTION_FUNCTIONS[engine.runner.model.config._attn_implementation].packed)
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            outputs, _ = _drain(engine, [TokenIdsRequest(tuple(range(10, 30)), 3)], "r", None, lambda: None)
    finally:
        labels.restore()
    found.add_events(prof.events())
    assert found.num_steps == 3 and len(outputs[0]) == 3
    assert all(
        found.microseconds[c] > 0 for c in ("matmul", "attention", "model other", "bookkeeping", "sampling", "output")
    ), found.microseconds
    assert "schedule" not in vars(engine.scheduler) and "_forward" not in vars(engine.runner)
    from pagedinfer.engine.attention import paged_attention_forward

    assert ALL_ATTENTION_FUNCTIONS[engine.runner.model.config._attn_implementation] is paged_attention_forward


def test_labels_leave_a_compiled_forwards_attention_alone_and_skip_missing_phases():
    """After the compile work the runner's `compiled` forward must not see a wrapped attention function:
    the registry is untouched there (attention is then known by its op's name); absent phases are skipped."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from pagedinfer.engine.attention import register

    name = register()
    before = ALL_ATTENTION_FUNCTIONS[name]

    def forward():
        return "logits"

    runner = SimpleNamespace(
        _forward=forward, compiled=object(), model=SimpleNamespace(config=SimpleNamespace(_attn_implementation=name))
    )
    engine = SimpleNamespace(runner=runner, scheduler=SimpleNamespace())  # no schedule, no sampler
    labels = Labels(engine)
    assert ALL_ATTENTION_FUNCTIONS[name] is before
    assert runner._forward is not forward and runner._forward() == "logits"
    labels.restore()
    assert runner._forward is forward and vars(engine.scheduler) == {}


# ----- rounds ----------------------------------------------------------------------------------------
def _run(
    system: str, seconds: tuple[float, ...], cpu: tuple[float, ...] = (), outputs=((5, 6),), startup=1.0, rss=100
) -> RunResult:
    return RunResult(
        system, 1, 2, seconds, 1, outputs, all_cpu_seconds=cpu, startup_seconds=startup, peak_rss_bytes=rss
    )


def test_rounds_pool_every_run_into_the_medians_and_keep_the_highest_rss():
    pooled = RunResult.pooled(
        [
            _run("vllm", (4.0, 5.0), (8.0, 10.0), startup=3.0, rss=200),
            _run("vllm", (1.0,), (1.5,), startup=5.0, rss=300),
            _run("vllm", (2.0, 3.0), (4.0, 6.0), startup=4.0, rss=100),
        ]
    )
    assert pooled.all_elapsed_seconds == (4.0, 5.0, 1.0, 2.0, 3.0) and pooled.elapsed_seconds == 3.0
    assert pooled.cpu_per_wall == 2.0 and pooled.startup_seconds == 4.0 and pooled.peak_rss_bytes == 300
    assert RunResult.pooled([_run("vllm", (1.0,), (1.0,)), _run("vllm", (2.0,))]).cpu_per_wall is None


@pytest.mark.parametrize(
    "other, named",
    [
        (_run("vllm", (1.0,), outputs=((5, 7),)), "tokens in round 2 differ"),
        (_run("pagedinfer", (1.0,)), "round 2 is pagedinfer"),
    ],
)
def test_rounds_that_generated_different_tokens_or_ran_another_system_are_not_pooled(other, named):
    with pytest.raises(ValueError, match=named):
        RunResult.pooled([_run("vllm", (1.0,)), other])
    with pytest.raises(ValueError, match="no rounds"):
        RunResult.pooled([])


def test_the_summary_gives_the_ratio_of_the_pooled_medians_and_the_range_of_the_rounds_own_ratios():
    ours, vllm = _run("pagedinfer", (1.0, 2.0, 4.0)), _run("vllm", (2.0, 2.0, 3.0))
    lines = summary([("tiny", "float32", ours, vllm, [0.9, 1.5, 1.1]), ("tiny", "float32", vllm, vllm, [])])
    assert lines[1].split()[2:6] == ["pagedinfer", "1.0", "1.00", "0.90-1.50"]
    assert lines[2].split()[2:6] == ["vllm", "1.0", "1.00", "-"]
