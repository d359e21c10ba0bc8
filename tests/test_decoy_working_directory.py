"""Every product command works in a working directory full of folders named like our packages.

A directory holding `kernels/`, `operator/`, `engine/`, `router/`, `testing/` and `pagedinfer/` (a
checkout's root is one; a user's project may be too), each a package whose import raises, is the
working directory of: `pagedinfer serve` at tensor-parallel size 2 with the output process (both
kinds of Python child the engine starts), `pagedinfer router` in front of it, `pagedinfer operator`,
and the CPU kernels' build. A child that imported from its working directory would import a decoy:
before child_python.py, rank 1 died importing `pagedinfer` and the server never became healthy.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from engine_process import tiny_serve_args
from proc_tree import children, wait_gone
from router_harness import start_router_process, wait_for

from pagedinfer.kernels.cpu import build
from pagedinfer.testing.operator_harness import serving_emulator, write_kubeconfig
from pagedinfer.testing.server_process import free_port, wait_process_healthy

pytestmark = pytest.mark.slow
DECOYS = ("kernels", "operator", "engine", "router", "testing", "pagedinfer")
CLI = Path(sys.executable).with_name("pagedinfer")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def decoy_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("decoys")
    for name in DECOYS:
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(
            f"raise ImportError('decoy {name}: imported from the working directory')\n"
        )
    return root


@pytest.fixture(scope="module")
def server(tiny_llama, decoy_dir, tmp_path_factory):
    """`pagedinfer serve` at tensor-parallel size 2 with --overlap process, started in decoy_dir; its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                str(CLI),
                *tiny_serve_args(tiny_llama, port, max_model_len=256, num_gpu_blocks=64),
                "--tensor-parallel-size",
                "2",
                "--overlap",
                "process",
            ],
            cwd=decoy_dir,
            env=ENV,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        try:
            wait_process_healthy(url, proc, timeout_seconds=180)
        except (AssertionError, TimeoutError) as exc:
            raise AssertionError(f"{exc}; its log ends:\n{log_path.read_text()[-3000:]}") from None
        yield url, proc
    finally:
        ranks = children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        wait_gone(ranks, 30)


def test_serve_at_tp2_with_the_output_process_answers_a_completion(server):
    url, proc = server
    assert len(children(proc.pid)) == 2  # rank 1 and the output process
    r = httpx.post(
        url + "/v1/completions",
        timeout=120,
        json={"model": "tiny", "prompt": "Hello", "max_tokens": 4, "ignore_eos": True},
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 4


def test_the_router_answers_health_with_the_engine_healthy(server, decoy_dir, tmp_path):
    engine_url, _ = server
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_router_process(
        url,
        ["--engine", engine_url, "--port", str(port), "--policy", "round-robin"],
        tmp_path / "router.log",
        cwd=decoy_dir,
    )
    try:
        wait_for(
            lambda: httpx.get(url + "/health", timeout=5).json().get("status") == "ok",  # not "holding"
            "the router never saw its engine healthy",
        )
    finally:
        proc.kill()
        proc.wait(30)


async def test_the_operator_starts_and_answers_liveness(decoy_dir, tmp_path):
    liveness_port = free_port()
    async with serving_emulator() as (_, api_url):
        env = {k: v for k, v in ENV.items() if k != "KUBERNETES_SERVICE_HOST"}
        env["KUBECONFIG"] = str(write_kubeconfig(tmp_path / "kubeconfig", api_url))
        proc = subprocess.Popen(
            [
                str(CLI),
                "operator",
                "--namespace",
                "default",
                "--metrics-port",
                str(free_port()),
                "--liveness",
                f"127.0.0.1:{liveness_port}",
                "--no-fetch-hf-config",
            ],
            cwd=decoy_dir,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            async with httpx.AsyncClient() as client:
                for _ in range(600):
                    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                    try:
                        r = await client.get(f"http://127.0.0.1:{liveness_port}/healthz", timeout=2)
                        if r.status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    await asyncio.sleep(0.1)
                else:
                    pytest.fail("the operator never answered its liveness probe")
        finally:
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr.decode()[-2000:]


def test_the_cpu_kernels_build_installs_the_library(server, decoy_dir, tmp_path):
    """After the server: its ranks have loaded (built) the library, which the build reuses from the cache."""
    out = tmp_path / "cpu-kernels"
    done = subprocess.run(
        [sys.executable, "-P", "-m", "pagedinfer.kernels.cpu.build", "--out", str(out)],
        cwd=decoy_dir,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=build.BUILD_WAIT_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == str(out / f"{build.extension_name()}.so")
