"""The `pagedinfer router` process exits 0 on SIGTERM, as the kubelet stops a pod (not 143, killed by the signal)."""

from __future__ import annotations

from router_harness import start_router_process
from pagedinfer.testing.server_process import free_port


def test_the_router_process_exits_0_on_sigterm(tiny_llama, tmp_path):
    port = free_port()
    proc = start_router_process(f"http://127.0.0.1:{port}", [
        "--engine", f"http://127.0.0.1:{free_port()}", "--tokenizer", str(tiny_llama), "--port", str(port),
        "--log-level", "warning"], tmp_path / "router.log")
    try:
        proc.terminate()
        code = proc.wait(30)
    finally:
        proc.kill()
    log = (tmp_path / "router.log").read_text()
    assert code == 0, log[-2000:]
    assert "Traceback" not in log, log[-2000:]
