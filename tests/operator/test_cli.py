"""`pagedinfer operator` as users run it: a process with a kubeconfig, a liveness probe and metrics."""

import asyncio
import os
import signal
import subprocess
import sys

import aiohttp
import pytest

from pagedinfer.testing.operator_harness import DEPLOYMENTS, ISVC, eventually, inference_service
from pagedinfer.testing.server_process import free_port

pytestmark = pytest.mark.timeout(90)


def test_a_namespace_or_all_namespaces_is_required():
    out = subprocess.run(
        [sys.executable, "-P", "-m", "pagedinfer.engine.cli", "operator"], capture_output=True, text=True, cwd="/"
    )
    assert out.returncode == 2 and "--namespace" in out.stderr


async def test_the_operator_process_reconciles_and_serves_liveness_and_metrics(emulator):
    metrics_port, liveness_port = free_port(), free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-P",
            "-m",
            "pagedinfer.engine.cli",
            "operator",
            "--namespace",
            "default",
            "--metrics-port",
            str(metrics_port),
            "--liveness",
            f"127.0.0.1:{liveness_port}",
            "--no-fetch-hf-config",
            "--engine-cpu-image",
            "registry.local/engine:cpu-flag",
        ],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd="/",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        await emulator.create(ISVC, inference_service("tiny", {"resources": {"gpus": 0}}))
        deployment = await eventually(lambda: emulator.read(DEPLOYMENTS, "default", "tiny"), timeout_seconds=45)
        # gpus: 0 and no spec.engine.image: the CPU engine image the operator was given
        assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.local/engine:cpu-flag"
        async with aiohttp.ClientSession() as session:

            async def text(url):
                async with session.get(url) as r:
                    return r.status, await r.text()

            for _ in range(100):
                try:
                    status, body = await text(f"http://127.0.0.1:{metrics_port}/metrics")
                    if 'pagedinfer_operator_reconciles_total{result="applied"} 1.0' in body:
                        break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
            assert 'pagedinfer_operator_reconciles_total{result="applied"} 1.0' in body
            assert "pagedinfer_operator_reconcile_duration_seconds_count 1.0" in body
            assert (await text(f"http://127.0.0.1:{liveness_port}/healthz"))[0] == 200
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr.decode()[-2000:]
    assert b"test-token" not in stderr


def test_no_credentials_is_a_clear_error_not_a_retry_loop(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    env.update(KUBECONFIG=str(tmp_path / "missing"), HOME=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-P", "-m", "pagedinfer.engine.cli", "operator", "-A"],
        capture_output=True,
        text=True,
        cwd="/",
        env=env,
        timeout=60,
    )
    assert out.returncode == 2 and "no Kubernetes credentials" in out.stderr and "Traceback" not in out.stderr
