"""One end-to-end proof: the operator's router Deployment, run as a real `pagedinfer router` process with its
pod's own command line, finds real engine processes (the engine Deployment's command line, with
`--kv-events`) through the engines' headless Service's EndpointSlice and serves OpenAI completions; then the
engines are scaled in under load, and no request through the router is aborted (a rollout ends pods the
same way; bench/routing_lifecycle.py measures it, this test keeps to one engine stop for CI's time).

The kubelet and the Deployment controller are tests/support/kubelet_harness.py with `lifecycle` (a deleted pod
stays terminating while its preStop hook, the operator's `sleep`, runs; then SIGTERM and the engine's drain;
a changed template rolls one pod at a time); the EndpointSlice controller is testing/endpoint_slices.py
(terminating: ready=false, serving=true, terminating=true), so the router drops the victim at its next poll,
inside the victim's preStop wait, and the victim drains what it holds after SIGTERM. The router reaches the emulated API server
through `--kube-api` (in a pod: its service-account token). Cluster DNS does not exist here, so the client
talks to the router pod's address, which the Service NAME selects.
"""

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest

from pagedinfer.operator.routing import builders as routing
from pagedinfer.testing.endpoint_slices import EndpointSliceController
from pagedinfer.testing.kubelet_harness import PODS, KubeletHarness, loopback_ip
from pagedinfer.testing.operator_harness import (
    DEPLOYMENTS,
    ISVC,
    SERVICES,
    eventually,
    inference_service,
    kubeconfig_server,
    running_operator,
)
from pagedinfer.testing.pod_process import local_process

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
NS = "default"


@dataclass
class Load:
    """Closed-loop streamed completions through the router; each ends complete ([DONE], no error) or aborted."""

    url: str
    completed: int = 0
    aborted: list[str] = field(default_factory=list)
    engines: set[str] = field(default_factory=set)  # engines that answered, from the route header

    async def worker(self, client: httpx.AsyncClient, stop: asyncio.Event, index: int) -> None:
        turn = 0
        while not stop.is_set():
            turn += 1
            body = {
                "model": "tiny",
                "prompt": f"Tenant {index} asks question {turn}:",
                "max_tokens": 24,
                "ignore_eos": True,
                "stream": True,
                "temperature": 0.0,
            }
            try:
                async with client.stream("POST", self.url + "/v1/completions", json=body) as response:
                    text = (await response.aread()).decode()
                    route = response.headers.get("x-pagedinfer-route", "")
            except httpx.HTTPError as exc:
                self.aborted.append(f"{type(exc).__name__}: {exc}")
                continue
            events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
            if response.status_code != 200 or events[-1:] != ["[DONE]"] or any('"error"' in e for e in events):
                self.aborted.append(f"{response.status_code} {route}: {text[-300:]}")
                continue
            if json.loads(events[-2])["choices"][0]["finish_reason"] != "length":  # all 24 tokens came
                self.aborted.append(f"cut short {route}: {text[-300:]}")
                continue
            self.completed += 1
            self.engines.add(route.split(";")[0].removeprefix("engine="))


async def test_the_operators_router_serves_through_a_scale_in_without_aborting(emulator, tmp_path):
    spec = {
        "resources": {"gpus": 0},
        "engine": {"numGpuBlocksOverride": 32, "maxModelLen": 256},
        "replicas": 2,
        "maxReplicas": 2,
        "router": {"replicas": 1},
    }
    await emulator.create(ISVC, inference_service("tiny", spec))
    engines = KubeletHarness(emulator, NS, "tiny", tmp_path, max_engines=3, lifecycle=True)
    slices = EndpointSliceController(emulator, NS, "tiny-engines")
    router = None
    try:
        async with engines.running(), slices.running(), running_operator():  # kopf cancels tasks made after
            await eventually(lambda: len(engines.urls) == 2, timeout_seconds=240)
            front = emulator.read(SERVICES, NS, "tiny")
            assert front["spec"]["selector"] == routing.router_selector_labels("tiny")
            template = emulator.read(DEPLOYMENTS, NS, "tiny-router")["spec"]["template"]
            ip = loopback_ip(set(engines.ips))
            local = local_process(template["spec"], ip, tmp_path / "router-pod", Path(sys.executable).parent)
            argv = [*local.argv, "--kube-api", kubeconfig_server(), "--namespace", NS]
            with open(tmp_path / "router.log", "wb") as log:
                router = subprocess.Popen(
                    argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **local.env, "OMP_NUM_THREADS": "1"}
                )
            client = openai.AsyncOpenAI(base_url=f"http://{ip}:8000/v1", api_key="unused", timeout=60, max_retries=0)

            async def routed():
                assert router.poll() is None, (tmp_path / "router.log").read_text()[-2000:]
                try:
                    return await client.completions.with_raw_response.create(model="tiny", prompt="Hello", max_tokens=4)
                except (openai.APIConnectionError, openai.InternalServerError, openai.APIStatusError):
                    return None

            response = None
            for _ in range(240):
                response = await routed()
                if response is not None:
                    break
                await asyncio.sleep(0.5)
            assert response is not None, (tmp_path / "router.log").read_text()[-2000:]
            route = response.headers["x-pagedinfer-route"]
            assert any(f"engine={url}" in route for url in engines.urls), route
            assert response.parse().choices[0].text
            assert all("--kv-events" in open(f"/proc/{e.process.pid}/cmdline").read() for e in engines.engines)
            pre_stop = emulator.read(DEPLOYMENTS, NS, "tiny")["spec"]["template"]["spec"]["containers"][0]["lifecycle"][
                "preStop"
            ]["exec"]["command"]
            assert pre_stop == ["sleep", "3"]  # the router's 1 s poll + 2 s margin (contracts/routing/lifecycle.py)

            load, stop = Load(f"http://{ip}:8000"), asyncio.Event()
            async with httpx.AsyncClient(timeout=httpx.Timeout(60.0)) as http:
                workers = [asyncio.create_task(load.worker(http, stop, i)) for i in range(3)]
                try:
                    await eventually(lambda: load.completed >= 6 or load.aborted, timeout_seconds=60)
                    # Scale in: the victim terminates (preStop, SIGTERM, drain) while requests flow.
                    before = set(engines.urls)
                    await emulator.merge(ISVC, NS, "tiny", {"spec": {"replicas": 1}})
                    await eventually(
                        lambda: len(engines.urls) == 1 and len(emulator.read_all(PODS, NS)) == 1, timeout_seconds=120
                    )  # the victim's Pod goes once its process exited
                    (victim,) = before - set(engines.urls)
                    served = load.completed
                    await eventually(lambda: load.completed >= served + 6 or load.aborted, timeout_seconds=60)
                finally:
                    stop.set()
                    await asyncio.gather(*workers)
            assert load.aborted == [], load.aborted[:3]
            assert victim in load.engines and engines.urls[0] in load.engines  # both served under load
    finally:
        if router is not None:
            router.terminate()
            router.wait(30)
