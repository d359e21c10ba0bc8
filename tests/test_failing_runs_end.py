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
SUPPORT = Path(__file__).resolve().parent / "support"  # teardown_watchdog
HANG_BOUND_SECONDS = 240  # "did not hang", never a timing claim
INI = """\
[pytest]
addopts = -p no:cacheprovider -p teardown_watchdog
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
timeout = 300
timeout_method = thread
"""


def run_pytest(tmp_path: Path, source: str) -> subprocess.CompletedProcess:
    (tmp_path / "pytest.ini").write_text(INI)
    (tmp_path / "test_generated.py").write_text(textwrap.dedent(source))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([str(PYTEST), "-v", "test_generated.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=HANG_BOUND_SECONDS, env=env)


@pytest.mark.slow
def test_an_assertion_while_the_operator_runs_fails_the_test_and_the_run_ends(tmp_path):
    run = run_pytest(tmp_path, """
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
    """)
    output = run.stdout + run.stderr
    assert run.returncode == 1, output[-4000:]
    assert "test_fails_inside_the_operator FAILED" in output and "deliberate: the operator is reconciling" in output
    assert "1 failed" in output


def test_a_task_that_ignores_cancellation_fails_the_run_naming_it_instead_of_hanging_the_teardown(tmp_path):
    # The teardown closes the test's event loop, which waits for every task left in it; pytest-timeout
    # has stopped its timer once the failure was reported. The watchdog ends the run at the test's timeout.
    run = run_pytest(tmp_path, """
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
    """)
    output = run.stdout + run.stderr
    assert run.returncode == 1, output[-4000:]
    assert "teardown of test_generated.py::test_fails_leaving_a_stubborn_task still running after 2 s" in output
    assert "deliberate: a task is left that ignores cancellation" in output  # the failure, before the summary
    assert "pending task <Task" in output and "coro=<stubborn()" in output  # the task that never finishes
