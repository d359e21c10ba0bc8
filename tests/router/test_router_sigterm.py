"""The `pagedinfer router` process exits 0 on SIGTERM, as the kubelet stops a pod (not 143, killed by the signal),
and answers the requests it holds for an engine at once (503 shutting_down), not at their deadlines."""

from __future__ import annotations

import threading

import httpx
from router_harness import start_router_process, wait_for

from pagedinfer.testing.server_process import free_port


def test_the_router_process_exits_0_on_sigterm(tiny_llama, tmp_path):
    port = free_port()
    proc = start_router_process(
        f"http://127.0.0.1:{port}",
        [
            "--engine",
            f"http://127.0.0.1:{free_port()}",
            "--tokenizer",
            str(tiny_llama),
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--queue-timeout-seconds",
            "600",
        ],
        tmp_path / "router.log",
    )
    answers = []
    held = threading.Thread(
        target=lambda: answers.append(
            httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"model": "tiny", "prompt": "hi"}, timeout=120)
        )
    )
    try:
        held.start()  # no engine answers: the request is held
        wait_for(
            lambda: "pagedinfer_router_queue_length 1.0" in httpx.get(f"http://127.0.0.1:{port}/metrics").text,
            "the request was never held",
        )
        proc.terminate()
        code = proc.wait(30)
        held.join(30)
    finally:
        proc.kill()
    log = (tmp_path / "router.log").read_text()
    assert code == 0, log[-2000:]
    assert "Traceback" not in log, log[-2000:]
    assert answers[0].status_code == 503 and answers[0].json()["error"]["code"] == "shutting_down"
