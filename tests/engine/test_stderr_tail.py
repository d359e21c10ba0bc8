"""A child's stderr passes through to ours, and its last lines are kept for the error naming it."""

from __future__ import annotations

import subprocess
import sys
import time

from pagedinfer.engine.distributed.stderr_tail import StderrTail


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-P", "-c", code], stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_the_last_lines_are_kept_and_every_line_is_passed_on(capfd):
    proc = _child("import sys\nfor i in range(30): print(f'line {i}', file=sys.stderr)\nsys.stderr.write('no newline')")
    tail = StderrTail(proc.stderr, "test", max_lines=3)
    proc.wait(60)
    assert tail.text(wait_seconds=10).splitlines() == ["line 28", "line 29", "no newline"]
    passed_on = capfd.readouterr().err
    assert "line 0\n" in passed_on and passed_on.endswith("line 29\nno newline")


def test_text_is_bounded_while_something_still_holds_the_pipe():
    """A grandchild that inherited the stderr outlives the child: the pipe has not ended, the wait is bounded."""
    proc = _child(
        "import subprocess, sys\nprint('dying', file=sys.stderr, flush=True)\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(10)'])"
    )
    tail = StderrTail(proc.stderr, "test")
    proc.wait(60)
    start = time.monotonic()
    deadline = start + 8
    while "dying" not in tail.text(wait_seconds=0.2) and time.monotonic() < deadline:
        pass
    assert tail.text(wait_seconds=0.5) == "dying"
    assert time.monotonic() - start < 8
