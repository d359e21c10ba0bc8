"""A wait fails at once, saying why, when a process or task it depends on has died; an end asked for is no failure.

The waits below are given a timeout of 600 s: a `Died` raised is proof that the wait ended on the death,
not on its timeout (the test's own timeout, far shorter, ends a wait that would poll on).
"""

import asyncio
import subprocess
import sys

import pytest

from pagedinfer.testing.operator_harness import eventually
from pagedinfer.testing.server_process import free_port, wait_process_healthy
from pagedinfer.testing.watched import Died, ProcessWatch, TaskWatch, exit_report, log_tail, watching

pytestmark = pytest.mark.timeout(60)
NEVER = 600.0


def started(tmp_path, script: str) -> tuple[subprocess.Popen, object]:
    log_path = tmp_path / "process.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-c", script], stdout=log, stderr=subprocess.STDOUT)
    return process, log_path


async def test_a_wait_on_a_process_that_exited_fails_at_once_with_its_name_exit_code_and_log(tmp_path):
    process, log_path = started(
        tmp_path, "import sys; print('loading the model'); print('no such model: x'); sys.exit(3)"
    )
    with watching(ProcessWatch("pod default/tiny-engine-1's process", process, log_path)):
        with pytest.raises(Died) as died:
            await eventually(lambda: False, timeout_seconds=NEVER)
    message = str(died.value)
    assert message.startswith("pod default/tiny-engine-1's process exited with code 3; the last 30 lines")
    assert message.endswith("loading the model\nno such model: x")


async def test_a_killed_process_is_named_with_its_signal(tmp_path):
    process, log_path = started(tmp_path, "import time; time.sleep(600)")
    process.kill()
    with watching(ProcessWatch("the router", process)):
        with pytest.raises(Died, match="^the router was killed by SIGKILL$"):
            await eventually(lambda: False, timeout_seconds=NEVER)


async def test_a_process_stopped_on_purpose_does_not_fail_the_wait(tmp_path):
    process, log_path = started(tmp_path, "import time; time.sleep(600)")
    watch = ProcessWatch("the engine", process, log_path)
    polls = []
    with watching(watch):
        watch.stopping = True
        process.terminate()
        process.wait(30)
        assert await eventually(lambda: polls.append(1) or len(polls) >= 5, timeout_seconds=NEVER)


async def test_a_task_that_raised_fails_the_wait_with_its_exception_and_traceback():
    async def login():
        raise RuntimeError("login refused: 401")

    task = asyncio.create_task(login())
    with watching(TaskWatch("the operator", task)):
        with pytest.raises(Died) as died:
            await eventually(lambda: False, timeout_seconds=NEVER)
    message = str(died.value)
    assert message.startswith("the operator raised RuntimeError('login refused: 401'); the end of its traceback:")
    assert "in login" in message and message.endswith("RuntimeError: login refused: 401")


async def test_a_task_asked_to_stop_does_not_fail_the_wait_one_that_returned_unasked_does():
    stop = asyncio.Event()
    task = asyncio.create_task(stop.wait())
    stop.set()
    await task
    with watching(TaskWatch("the operator", task, stop.is_set)):
        assert await eventually(lambda: True, timeout_seconds=NEVER)
    with watching(TaskWatch("the operator", task)):
        with pytest.raises(Died, match="^the operator returned before it was asked to stop$"):
            await eventually(lambda: False, timeout_seconds=NEVER)


async def test_a_watch_holds_for_its_block_and_the_tasks_made_in_it_only(tmp_path):
    process, log_path = started(tmp_path, "import sys; sys.exit(1)")
    process.wait(30)
    with watching(ProcessWatch("the engine", process)):
        inside = asyncio.create_task(eventually(lambda: False, timeout_seconds=NEVER))
    outside = asyncio.create_task(eventually(lambda: True, timeout_seconds=NEVER))
    with pytest.raises(Died, match="the engine exited with code 1"):
        await inside
    assert await outside
    assert await eventually(lambda: True, timeout_seconds=NEVER)  # the block has ended


def test_the_log_tail_is_the_last_lines_of_a_long_log_and_says_when_there_is_none(tmp_path):
    log_path = tmp_path / "engine.log"
    log_path.write_text("".join(f"line {i}\n" for i in range(100_000)))
    assert log_tail(log_path).splitlines() == [f"line {i}" for i in range(99_970, 100_000)]
    assert log_tail(tmp_path / "missing.log").startswith("(log unreadable: ")
    (tmp_path / "empty.log").write_text("")
    assert exit_report("x", 0, tmp_path / "empty.log").endswith(":\n(log empty)")


def test_a_server_that_exits_before_it_is_healthy_is_named_with_its_exit_code_and_log(tmp_path):
    process, log_path = started(tmp_path, "import sys; print('address already in use', file=sys.stderr); sys.exit(2)")
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(AssertionError) as failed:
        wait_process_healthy(url, process, timeout_seconds=NEVER, log_path=log_path)
    assert str(failed.value) == (
        f"server {url} (pid {process.pid}) exited with code 2 before it was healthy; "
        f"the last 30 lines of its log {log_path}:\naddress already in use"
    )
