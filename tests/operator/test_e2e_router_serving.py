"""One end-to-end proof: the operator's router Deployment, run as a real `pagedinfer router` process with its
pod's own command line, finds real engine processes (the engine Deployment's command line, with
`--kv-events`) through the engines' headless Service's EndpointSlice and serves OpenAI completions; then the
engines are scaled in under load, and no request through the router is aborted; then a rolling update
replaces the last engine under load: its new pod counts as Ready (and the old one goes) only once the router
has replayed its hot prefixes to it and set the pod's `pagedinfer.io/warmed` readiness gate, and again no
request is aborted (bench/routing_lifecycle.py measures these events at scale).

With warm-up on (the default) the engine pods carry the readiness gate: the emulator keeps such a pod's Ready
False until the gate's condition is True (the kubelet's rule), and the kubelet harness counts a pod, and
rolls on, only once it is Ready; the router, which the operator runs with `--warmup-readiness-gate`, warms
each not-ready endpoint it finds and then PATCHes the condition. So the router starts first here: without it
no engine pod would turn Ready.

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

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
SYSTEM = " ".join(f"rule{i}" for i in range(40))  # each tenant's shared prefix: several whole KV blocks
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
                "prompt": f"Tenant {index} follows these rules: {SYSTEM}. Question {turn}:",
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


def warmed_condition(pod: dict) -> dict | None:
    return next((c for c in pod["status"]["conditions"] if c["type"] == "pagedinfer.io/warmed"), None)


def warmup_requests(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("pagedinfer_warmup_requests"))


async def test_the_operators_router_serves_through_a_scale_in_and_a_rollout_whose_new_pod_is_ready_only_warm(
    emulator, tmp_path
):
    spec = {
        "resources": {"gpus": 0},
        "engine": {"numGpuBlocksOverride": 64, "maxModelLen": 256},
        "replicas": 2,
        "maxReplicas": 2,
        "router": {"replicas": 1},
    }
    await emulator.create(ISVC, inference_service("tiny", spec))
    engines = KubeletHarness(emulator, NS, "tiny", tmp_path, max_engines=3, lifecycle=True, first_ip=20)
    slices = EndpointSliceController(emulator, NS, "tiny-engines")
    router = None
    try:
        async with engines.running(), slices.running(), running_operator():  # kopf cancels tasks made after
            await eventually(lambda: emulator.read(DEPLOYMENTS, NS, "tiny-router"), timeout_seconds=60)
            front = emulator.read(SERVICES, NS, "tiny")
            assert front["spec"]["selector"] == routing.router_selector_labels("tiny")
            template = emulator.read(DEPLOYMENTS, NS, "tiny-router")["spec"]["template"]
            assert "--warmup-readiness-gate" in template["spec"]["containers"][0]["args"]
            ip = loopback_ip(first=10)  # below the engines' addresses
            local = local_process(template["spec"], ip, tmp_path / "router-pod", Path(sys.executable).parent)
            argv = [*local.argv, "--kube-api", kubeconfig_server(), "--namespace", NS]
            with open(tmp_path / "router.log", "wb") as log:
                router = subprocess.Popen(
                    argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **local.env, "OMP_NUM_THREADS": "1"}
                )
            # Each engine pod turns Ready once the router found it, warmed it (nothing hot yet) and opened its gate.
            await eventually(lambda: len(engines.urls) == 2, timeout_seconds=400)
            pods = emulator.read_all(PODS, NS)
            assert all(warmed_condition(p)["status"] == "True" for p in pods), pods
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
                workers = [asyncio.create_task(load.worker(http, stop, i)) for i in range(6)]
                try:
                    # Six tenants: at most 2 more in flight on one engine than the other before the policy spreads.
                    await eventually(
                        lambda: (load.completed >= 6 and len(load.engines) == 2) or load.aborted, timeout_seconds=60
                    )
                    # Scale in: the victim terminates (preStop, SIGTERM, drain) while requests flow.
                    before = set(engines.urls)
                    await emulator.merge(ISVC, NS, "tiny", {"spec": {"replicas": 1}})
                    await eventually(
                        lambda: len(engines.urls) == 1 and len(emulator.read_all(PODS, NS)) == 1, timeout_seconds=120
                    )  # the victim's Pod goes once its process exited
                    (victim,) = before - set(engines.urls)
                    served = load.completed
                    await eventually(lambda: load.completed >= served + 6 or load.aborted, timeout_seconds=60)
                    scaled_in_served = set(load.engines)

                    # Roll: a spec change makes a new pod template; the new pod surges, the old one stays.
                    (old_pod,) = emulator.read_all(PODS, NS)
                    await emulator.merge(ISVC, NS, "tiny", {"spec": {"engine": {"maxNumSeqs": 8}}})
                    await eventually(lambda: len(emulator.read_all(PODS, NS)) == 2, timeout_seconds=60)
                    (new_pod,) = [
                        p for p in emulator.read_all(PODS, NS) if p["metadata"]["name"] != old_pod["metadata"]["name"]
                    ]
                    assert {"conditionType": "pagedinfer.io/warmed"} in new_pod["spec"]["readinessGates"]
                    new_url = f"http://{new_pod['status']['podIP']}:8000"
                    # The old pod leaves only after the new one is Ready, which it is only once warm.
                    await eventually(
                        lambda: engines.urls == [new_url] and len(emulator.read_all(PODS, NS)) == 1, timeout_seconds=400
                    )
                    pod = emulator.read(PODS, NS, new_pod["metadata"]["name"])
                    warmed = warmed_condition(pod)
                    assert (warmed["status"], warmed["reason"]) == ("True", "Warmed"), warmed
                    replayed = int(warmed["message"].split("replayed ")[1].split()[0])
                    assert replayed >= len(SYSTEM.split()), warmed  # the tenants' shared prefixes, replayed first
                    assert warmup_requests(new_url) >= 1  # the engine counted the replays apart from user requests
                    history = emulator.objects[PODS, NS, new_pod["metadata"]["name"]].history
                    first_ready = next(
                        v
                        for v in history
                        if {"type": "Ready", "status": "True"} in (v.get("status") or {}).get("conditions", [])
                    )
                    assert warmed_condition(first_ready)["reason"] == "Warmed"  # Ready came with the gate, not before
                    served = load.completed
                    await eventually(
                        lambda: (load.completed >= served + 6 and new_url in load.engines) or load.aborted,
                        timeout_seconds=120,
                    )
                finally:
                    stop.set()
                    await asyncio.gather(*workers)
            assert load.aborted == [], load.aborted[:3]
            assert victim in scaled_in_served and new_url in load.engines  # every engine served under load
    finally:
        if router is not None:
            router.terminate()
            router.wait(30)
