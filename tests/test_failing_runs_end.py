"""A failing test fails, and the run ends: nothing left in its event loop can hold the teardown for good.

Each case runs pytest on a generated test file in a fresh process (this suite's plugins and settings),
bounded by a subprocess timeout of minutes that only a hang reaches.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PYTEST = Path(sys.executable).with_name("pytest")
SUPPORT = Path(__file__).resolve().parent / "support"  # teardown_watchdog, timeout_report
HANG_BOUND_SECONDS = 240  # "did not hang", never a timing claim
INI = """\
[pytest]
addopts = -p no:cacheprovider -p teardown_watchdog -p timeout_report
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
timeout = 300
timeout_method = thread
"""


def run_pytest(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "pytest.ini").write_text(INI)
    (tmp_path / "test_generated.py").write_text(textwrap.dedent(source))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [str(PYTEST), "-v", *args, "test_generated.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=HANG_BOUND_SECONDS,
        env=env,
    )


@pytest.mark.slow
def test_an_assertion_while_the_operator_runs_fails_the_test_and_the_run_ends(tmp_path):
    run = run_pytest(
        tmp_path,
        """
        from pagedinfer.testing.operator_harness import (ISVC, LLAMA3_8B_SPEC, add_gpu_node, inference_service,
                                                         running_operator, serving_emulator, write_kubeconfig)

        async def test_fails_inside_the_operator(tmp_path, monkeypatch):
            async with serving_emulator() as (emulator, url):
                monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", url)))
                monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
                await add_gpu_node(emulator, "h100", 81559)
                async with running_operator():
                    await emulator.create(ISVC, inference_service("llama", LLAMA3_8B_SPEC))
                    assert False, "deliberate: the operator is reconciling"
    """,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 1, output[-4000:]
    assert "test_fails_inside_the_operator FAILED" in output and "deliberate: the operator is reconciling" in output
    assert "1 failed" in output


def test_a_task_that_ignores_cancellation_fails_the_run_naming_it_instead_of_hanging_the_teardown(tmp_path):
    # The teardown closes the test's event loop, which waits for every task left in it; pytest-timeout
    # has stopped its timer once the failure was reported. The watchdog ends the run at the test's timeout.
    run = run_pytest(
        tmp_path,
        """
        import asyncio
        import pytest

        async def stubborn():
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    pass

        @pytest.mark.timeout(2)
        async def test_fails_leaving_a_stubborn_task():
            asyncio.get_running_loop().create_task(stubborn())
            await asyncio.sleep(0)
            assert False, "deliberate: a task is left that ignores cancellation"
    """,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 1, output[-4000:]
    assert "teardown of test_generated.py::test_fails_leaving_a_stubborn_task still running after 2 s" in output
    assert "deliberate: a task is left that ignores cancellation" in output  # the failure, before the summary
    assert "pending task <Task" in output and "coro=<stubborn()" in output  # the task that never finishes


def test_a_wait_on_a_pod_whose_process_exits_at_once_fails_naming_it_and_the_run_ends(tmp_path):
    # The wait's timeout (600 s) is far past this run's bound (HANG_BOUND_SECONDS): the run can only end in
    # time, with this failure, if the wait ended on the pod's death. The operator runs meanwhile, so its
    # stop and the kubelet harness's are part of the teardown that must end too.
    run = run_pytest(
        tmp_path,
        """
        import time
        import pytest
        from pagedinfer.testing.kubelet_harness import DEPLOYMENTS, KubeletHarness
        from pagedinfer.testing.operator_harness import (ISVC, LLAMA3_8B_SPEC, add_gpu_node, eventually,
                                                         inference_service, running_operator, serving_emulator,
                                                         write_kubeconfig)

        CRASHES = "import sys; print('loading the model'); print('no such model: crashy'); sys.exit(1)"
        CONTAINER = {"name": "engine", "command": ["python", "-c", CRASHES],
                     "ports": [{"name": "http", "containerPort": 8000}],
                     "readinessProbe": {"httpGet": {"path": "/health"}}}

        @pytest.mark.timeout(300)
        async def test_waits_on_a_crashing_pod(tmp_path, monkeypatch):
            async with serving_emulator() as (emulator, url):
                monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", url)))
                monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
                await add_gpu_node(emulator, "h100", 81559)
                await emulator.create(DEPLOYMENTS, {
                    "apiVersion": "apps/v1", "kind": "Deployment",
                    "metadata": {"name": "crashy", "namespace": "default"},
                    "spec": {"replicas": 1, "template": {"metadata": {"labels": {"app": "crashy"}},
                                                         "spec": {"containers": [CONTAINER]}}}})
                harness = KubeletHarness(emulator, "default", "crashy", tmp_path, max_engines=1)
                async with harness.running(), running_operator():
                    await emulator.create(ISVC, inference_service("llama", LLAMA3_8B_SPEC))
                    started = time.monotonic()
                    try:
                        await eventually(lambda: harness.urls, timeout_seconds=600)
                    finally:
                        print(f"the wait ended after {time.monotonic() - started:.1f} s")
    """,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 1, output[-4000:]
    assert "test_waits_on_a_crashing_pod FAILED" in output and "1 failed" in output
    assert (
        "pagedinfer.testing.watched.Died: the kubelet harness of default/crashy stopped: "
        "pod default/crashy-engine-1's process" in output
    ), output[-4000:]
    assert "exited with code 1 before it was ready; the last 30 lines of its log" in output
    assert "Task exception was never retrieved" not in output  # reported once, by the wait
    assert "no such model: crashy" in output
    waited = [float(line.split()[-2]) for line in output.splitlines() if line.startswith("the wait ended after")]
    assert waited and waited[0] < 120, output[-4000:]  # a bound on a 600 s wait, not a timing claim: ~0.3 s here


@pytest.mark.parametrize(
    "args", [(), ("-n", "1", "--dist", "loadfile", "--max-worker-restart=0")], ids=["one-process", "xdist"]
)
def test_a_test_that_hangs_is_named_with_its_stack_and_the_run_ends(tmp_path, args):
    # pytest-timeout's own report never names the test, and in a pytest-xdist worker (scripts/test.sh's whole
    # suite) it goes to the worker's terminal writer, a file nobody reads; timeout_report.py writes it to the
    # run's stderr, and --max-worker-restart=0 ends the run instead of running the test again on a new worker.
    run = run_pytest(
        tmp_path,
        """
        import time
        import pytest

        def test_passes():
            pass

        @pytest.mark.timeout(2)
        def test_hangs():
            time.sleep(3600)  # the stack names this line
    """,
        *args,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 1, output[-4000:]
    assert "+++ test test_generated.py::test_hangs still running after 2 s (its timeout)" in output, output[-4000:]
    assert "time.sleep(3600)  # the stack names this line" in output
    assert output.count("still running after") == 1  # run once: no new worker took it again
    if args:
        assert "FAILED test_generated.py::test_hangs" in output  # xdist's summary (one process ends without one)
