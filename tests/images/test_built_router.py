"""The router image, run: `pagedinfer router --engine URL` in front of a real engine on this host.

The engine is `pagedinfer serve` from this venv (the embedded model, whose
tokenizer the router image also carries as its default) with --kv-events, on
free ports of 127.0.0.1; the router runs from the built image as a pod would
run it (the image's user, read-only root, host network; tests/support/
built_images.py). It must answer /health, proxy a completion through the
`openai` client with the x-pagedinfer-route header naming the engine, follow
the engine's KV events (ZeroMQ) so the same prompt again is a prefix hit,
count both decisions in /metrics, and exit 0 on SIGTERM.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
from built_images import ImageContainer, ProcessView
from prometheus_client.parser import text_string_to_metric_families
from router_harness import route_of, wait_for

from pagedinfer.testing.server_process import free_port, wait_process_healthy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

IMAGE_USER = 10001  # images/router.Dockerfile's USER
PROMPT = "The router sends a prompt to the engine that already holds its prefix. " * 4  # several KV blocks
MODEL = "pagedinfer-default"  # what `serve` names the embedded model


def router_samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics samples keyed by (name, sorted labels)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.fixture
def engine(tmp_path):
    """`pagedinfer serve` of the embedded model with KV events, on 127.0.0.1: its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "engine.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("pagedinfer")),
                "serve",
                "--device",
                "cpu",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--kv-events",
                "--kv-events-port",
                "0",
                "--max-model-len",
                "256",
                "--num-gpu-blocks-override",
                "64",
                "--log-level",
                "warning",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    try:
        try:
            wait_process_healthy(url, proc, timeout_seconds=300)
        except (AssertionError, TimeoutError):
            print(log_path.read_text()[-3000:])
            raise
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_the_router_image_routes_to_a_real_engine_follows_its_kv_events_and_exits_on_sigterm(
    router_image, router_container, engine, tmp_path
):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        "pagedinfer",
        "router",
        "--engine",
        engine,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    with ImageContainer(router_container, command, tmp_path) as container:
        wait_process_healthy(url, container.process, timeout_seconds=180)
        view = ProcessView.of(container.main_pid())
        assert router_image.config()["User"] == f"{IMAGE_USER}:{IMAGE_USER}"
        assert (view.uid, view.gid, view.capabilities) == (IMAGE_USER, IMAGE_USER, 0)
        assert view.root_read_only

        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=120, max_retries=0)
        first = client.completions.with_raw_response.create(
            model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
        )
        completion = first.parse()
        assert completion.usage.completion_tokens == 4 and completion.choices[0].text
        assert route_of(first)["engine"] == engine

        # The engine's BlockStored events reach the router over ZeroMQ: the same prompt is now a prefix hit.
        cached = ("pagedinfer_router_engine_cached_blocks", (("engine", engine),))
        wait_for(
            lambda: router_samples(url).get(cached, 0) > 0,
            "the router never saw the engine's KV events",
            timeout_seconds=120,
        )
        second = client.completions.with_raw_response.create(
            model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
        )
        route = route_of(second)
        assert (route["engine"], route["reason"]) == (engine, "prefix-hit")
        assert int(route["matched_tokens"]) > 0

        samples = router_samples(url)
        assert samples[("pagedinfer_router_engine_healthy", (("engine", engine),))] == 1.0
        decisions = {
            dict(labels)["reason"]: value
            for (name, labels), value in samples.items()
            if name == "pagedinfer_router_decisions_total" and dict(labels)["engine"] == engine
        }
        assert sum(decisions.values()) == 2 and decisions.get("prefix-hit") == 1.0, decisions

        code, log = container.terminate(timeout_seconds=60)
    assert code == 0, log[-3000:]
    assert "Read-only file system" not in log and "Traceback" not in log, log[-3000:]
