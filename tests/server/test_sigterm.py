"""`pagedinfer serve` as a real process: SIGTERM during load ends it cleanly within the grace period."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from engine_process import tiny_serve_args
from proc_tree import children, wait_gone

from pagedinfer.testing.server_process import free_port, wait_process_healthy

GRACE_SECONDS = 2.0
KEY = "sk-sigterm-4d2f8a"


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2], ids=["tp1", "tp2"])
def test_sigterm_during_load_exits_zero_within_the_grace_period(tiny_llama, tmp_path, tp):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cli = Path(sys.executable).with_name("pagedinfer")
    env = {**os.environ, "PAGEDINFER_API_KEY": KEY, "OMP_NUM_THREADS": "1"}
    log = (tmp_path / "server.log").open("w+")
    proc = subprocess.Popen(
        [
            str(cli),
            *tiny_serve_args(tiny_llama, port, max_model_len=1024, num_gpu_blocks=256),
            "--shutdown-grace-seconds",
            str(GRACE_SECONDS),
            "--tensor-parallel-size",
            str(tp),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        wait_process_healthy(url, proc)
        ranks = children(proc.pid)
        assert len(ranks) == tp - 1  # rank 0 is the server itself
        outcomes: list[str] = []
        body = {"model": "tiny", "prompt": "Keep talking", "max_tokens": 1000, "ignore_eos": True, "stream": True}

        def client() -> None:
            try:
                with httpx.stream(
                    "POST", url + "/v1/completions", json=body, timeout=60, headers={"Authorization": f"Bearer {KEY}"}
                ) as r:
                    if r.status_code != 200:
                        outcomes.append(f"refused {r.status_code}")
                        return
                    lines = [line for line in r.iter_lines() if line]
                if lines[-1] != "data: [DONE]":
                    outcomes.append("cut")
                elif '"finish_reason":"length"' in lines[-2]:
                    outcomes.append("finished")
                elif '"error"' in lines[-2] and "shutting down" in lines[-2]:
                    outcomes.append("aborted")
                else:
                    outcomes.append("unexpected: " + lines[-2][:200])
            except httpx.TransportError:
                outcomes.append("refused")

        clients = [threading.Thread(target=client) for _ in range(16)]
        for c in clients:
            c.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = httpx.get(url + "/metrics").text
            running = [ln for ln in text.splitlines() if ln.startswith("pagedinfer_num_requests_running{")]
            if running and float(running[0].split()[-1]) >= 1:
                break
            time.sleep(0.05)
        signaled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=GRACE_SECONDS + 30)
        exited_after = time.monotonic() - signaled
        for c in clients:
            c.join(30)
        assert code == 0
        assert not wait_gone(ranks, 30), "a tensor-parallel rank outlived the server"
        assert len(outcomes) == 16  # every client got an answer: none hangs
        assert set(outcomes) <= {"finished", "aborted", "refused", "refused 503"}, outcomes
        assert "aborted" in outcomes  # 1000 tokens each cannot all finish within the grace period
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/health", timeout=2)
        log.seek(0)
        output = log.read()
        assert KEY not in output
        assert "Traceback" not in output, output
        print(f"exited {exited_after:.2f}s after SIGTERM (grace {GRACE_SECONDS}s); clients: {sorted(outcomes)}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


SLOW_LOAD = Path(__file__).resolve().parents[1] / "support" / "slow_load.py"
LOAD_DELAY_SECONDS = 60.0
PROMPT_EXIT_SECONDS = 15.0  # the fixed server exits in about a second; the old one waited 30 s (or the whole load)


@pytest.mark.slow
@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 0), (signal.SIGINT, 130)], ids=["sigterm", "sigint"])
def test_a_signal_while_the_model_loads_stops_the_process_at_once(tiny_llama, tmp_path, sig, status):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "server.log"
    log = log_path.open("w+")
    proc = subprocess.Popen(
        [
            sys.executable,
            str(SLOW_LOAD),
            str(LOAD_DELAY_SECONDS),
            "serve",
            "--model",
            str(tiny_llama),
            "--served-model-name",
            "tiny",
            "--port",
            str(port),
            "--device",
            "cpu",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 60
        while True:  # up and answering, the model still loading
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            try:
                health = httpx.get(url + "/health", timeout=2)
                if health.status_code == 503 and "loading" in health.text:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        signaled = time.monotonic()
        proc.send_signal(sig)
        try:
            code = proc.wait(timeout=PROMPT_EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {PROMPT_EXIT_SECONDS} s after {sig.name} during the load")
        output = log_path.read_text()
        print(f"exited {time.monotonic() - signaled:.2f}s after {sig.name}, status {code}")
        assert code == status, output
        assert "engine ready" not in output and "Traceback" not in output, output
        assert "stopped while the model was loading" in output, output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
