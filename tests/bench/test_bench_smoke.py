"""The benchmark scripts keep working: each runs a tiny workload and checks its own results.

Not timing tests: they assert the scripts finish, report every system, and
that every system produced the same tokens (the throughput script verifies it).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Past these runs' own 600 s subprocess limit: pytest-timeout's default 300 s ended the whole CI run (thread
# method) inside the throughput run's seven fresh processes on a loaded machine; a TimeoutExpired fails one test.
BENCH_RUN_TIMEOUT = pytest.mark.timeout(660)


@pytest.mark.slow
@BENCH_RUN_TIMEOUT
def test_throughput_benchmark_runs_and_all_systems_agree(tmp_path):
    out = tmp_path / "result.json"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "throughput.py"),
            "--num-requests",
            "6",
            "--skip-vllm",
            "--dtypes",
            "float32,bfloat16",
            "--hf-check-requests",
            "3",
            "--compile",
            "off",
            "--overlap",
            "off,process",
            "--json-out",
            str(out),
            "--model-dir",
            str(tmp_path / "model"),
            # short prompts and outputs: every system's row and the agreement checks need no long sequences
            "--prompt-median",
            "16",
            "--output-median",
            "8",
            "--max-prompt-tokens",
            "64",
            "--max-output-tokens",
            "16",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    for system in ("pagedinfer", "hf-static", "hf-continuous"):
        assert system in run.stdout
    assert "100.0%" in run.stdout and "KV waste" in run.stdout
    assert "greedy agreement, pagedinfer bf16 vs pagedinfer fp32: first token" in run.stdout
    results = json.loads(out.read_text())
    assert {(r["system"], r["dtype"]) for r in results} == {
        ("pagedinfer", "float32"),
        ("transformers", "float32"),
        ("hf-static", "float32"),
        ("hf-continuous", "float32"),
        ("pagedinfer", "bfloat16"),
        ("pagedinfer+overlap-process", "float32"),
        ("pagedinfer+overlap-process", "bfloat16"),
    }  # its tokens equal the run without (checked by the bench)
    for r in results:
        assert r["all_cpu_seconds"][0] > 0 and r["startup_seconds"] > 0 and r["peak_rss_bytes"] > 0
    # transformers' own tokens, one request at a time: pagedinfer's float32 ones equal them
    reference = next(r for r in results if r["system"] == "transformers")
    ours = next(r for r in results if r["system"] == "pagedinfer" and r["dtype"] == "float32")
    assert ours["outputs"][:3] == reference["outputs"]


def test_operator_scale_benchmark_reconciles_every_service_without_rewriting_children(tmp_path):
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "operator_scale.py"), "--services", "5", "--rounds", "1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    rows = {line[:48].strip(): line[48:].split() for line in run.stdout.splitlines() if len(line) > 48}
    assert float(rows["after restart: child writes (total)"][-1]) == 0.0
    assert float(rows["API calls per service (all)"][-1]) > 0


def test_sampler_benchmark_times_every_case_against_the_per_row_peer(tmp_path):
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "sampler_step.py"), "--rows", "6", "--vocab", "50", "--repeats", "1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    ratios = [line.split()[-1] for line in run.stdout.splitlines() if line.endswith("x")]
    assert len(ratios) == 4 and all(float(r[:-1]) > 0 for r in ratios), run.stdout


def test_beam_sharing_benchmark_reports_both_peaks_and_frees_every_block(tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "beam_sharing.py"),
            "--prompt-tokens",
            "40",
            "--max-tokens",
            "12",
            "--block-size",
            "8",
            "--model-dir",
            str(tmp_path),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "one sequence:" in run.stdout and "beam width 4:" in run.stdout
    assert "blocks held after the request: 0" in run.stdout


@pytest.mark.slow
def test_structured_outputs_benchmark_runs_and_checks_every_constrained_output(tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "structured_outputs.py"),
            "--rows",
            "4",
            "--tokens",
            "6",
            "--repeats",
            "1",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    for case in ("0%", "50%", "100%"):
        assert case in run.stdout


@pytest.mark.slow
@BENCH_RUN_TIMEOUT
def test_routing_benchmark_smoke_reports_every_policy_and_the_ceiling(tmp_path):
    out = tmp_path / "routing.json"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "routing.py"),
            "--smoke",
            "--json-out",
            str(out),
            "--logs",
            str(tmp_path / "logs"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    rows = {r["system"]: r for r in json.loads(out.read_text())["summary"]}
    assert set(rows) == {"round-robin", "prefix", "ceiling (1 engine, 2 pools)"}
    for r in rows.values():
        assert sum(r["requests_per_engine"]) == 8  # 4 tenants x 2 turns, every request answered
        assert 0.0 <= r["hit_rate"] <= 1.0
    # the engines' own counters: turn 2 reuses turn 1's prefix where it lands on turn 1's engine, always with
    # prefix routing and one engine; round robin's turn 2 lands there only if the turns finish in arrival order
    for system in ("prefix", "ceiling (1 engine, 2 pools)"):
        assert rows[system]["hit_rate"] > 0.0, rows


def test_tp_throughput_benchmark_runs_and_both_runs_agree(tmp_path):
    out = tmp_path / "tp.json"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "tp_throughput.py"),
            "--hidden-size",
            "64",
            "--num-layers",
            "2",
            "--num-heads",
            "4",
            "--num-kv-heads",
            "2",
            "--intermediate-size",
            "128",
            "--num-prompts",
            "3",
            "--prompt-len",
            "8",
            "--max-tokens",
            "4",
            "--json-out",
            str(out),
            "--model-dir",
            str(tmp_path / "m"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "same tokens: True" in run.stdout and "step broadcast" in run.stdout
    result = json.loads(out.read_text())
    assert result["tp"]["broadcasts"] > 0
    assert result["tp"]["sharded_weight_bytes_per_rank"] * 2 == result["tp1"]["sharded_weight_bytes_per_rank"]


def test_cpu_linear_benchmark_checks_every_kernel_against_f_linear(tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "cpu_linear.py"),
            "--m",
            "1",
            "5",
            "--shapes",
            "k/v 768->256",
            "--repeats",
            "1",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line for line in run.stdout.splitlines() if "M=" in line]
    assert len(rows) == 4  # 2 dtypes x 2 M values
    assert all("F.linear" in r and "onednn packed" in r for r in rows)
    assert sum("mkl packed" in r for r in rows) == 2  # fp32 only


def test_cpu_linear_fused_mode_checks_the_fused_gemm_against_the_separate_ones(tmp_path):
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "cpu_linear.py"), "--fused", "--m", "3", "--repeats", "1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line for line in run.stdout.splitlines() if "M=3" in line]
    assert len(rows) == 4 and all("separate" in r and "fused" in r for r in rows)  # 2 dtypes x q/k/v, gate/up


@pytest.mark.slow
@BENCH_RUN_TIMEOUT
def test_bf16_closeness_study_reports_every_row_and_a_swap(tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "bf16_closeness.py"),
            "--num-requests",
            "6",
            "--systems",
            "pagedinfer",
            "--dtypes",
            "bfloat16",
            "--swaps",
            "all",
            "--model-dir",
            str(tmp_path / "model"),
            "--prompt-median",
            "16",
            "--max-prompt-tokens",
            "64",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    rows = {line[:42].strip(): line[42:].split() for line in run.stdout.splitlines() if line.startswith("pagedinfer")}
    assert set(rows) == {"pagedinfer bfloat16", "pagedinfer bfloat16, all in fp32"}
    for cells in rows.values():  # agreement +- its error, no own fp32 run, then a finite logprob error
        assert cells[0].endswith("%") and cells[1].startswith("+-") and cells[2] == "-" and float(cells[3]) >= 0


def test_host_share_splits_the_engine_threads_cpu_time(tiny_llama):
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "host_share.py"),
            "--model",
            str(tiny_llama),
            "--dtype",
            "float32",
            "--num-requests",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "steps, engine thread" in run.stdout and "ms per step" in run.stdout
