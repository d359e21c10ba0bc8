"""One end-to-end proof: the operator's router Deployment, run as a real `pagedinfer router` process with its
pod's own command line, finds two real engine processes (the engine Deployment's command line, with
`--kv-events`) through the engines' headless Service's EndpointSlice and serves an OpenAI completion.

The kubelet is tests/support/kubelet_harness.py; the EndpointSlice controller is played by the test (it
writes the slice of the two ready engine pods, as that controller would); the router reaches the emulated
API server through `--kube-api` (in a pod: its service-account token). Cluster DNS does not exist here,
so the client talks to the router pod's address, which the Service NAME selects.
"""

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import openai
import pytest
import yaml

from pagedinfer.testing.kubelet_harness import KubeletHarness, loopback_ip
from pagedinfer.testing.operator_harness import (DEPLOYMENTS, ISVC, SERVICES, eventually, inference_service,
                                                 running_operator)
from pagedinfer.testing.pod_process import local_process
from pagedinfer.operator.routing import builders as routing

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
NS = "default"


def endpoint_slice(service: str, ips: list[str]) -> dict:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": f"{service}-abcde", "namespace": NS,
                         "labels": {"kubernetes.io/service-name": service}},
            "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": True}} for ip in ips]}


async def test_a_completion_goes_through_the_operators_router_to_an_engine_it_discovered(emulator, tmp_path):
    slices = emulator.register("discovery.k8s.io/v1", "EndpointSlice", "endpointslices")
    await emulator.create(ISVC, inference_service("tiny", {
        "resources": {"gpus": 0}, "engine": {"numGpuBlocksOverride": 32, "maxModelLen": 256},
        "replicas": 2, "maxReplicas": 2, "router": {"replicas": 1}}))
    engines = KubeletHarness(emulator, NS, "tiny", tmp_path, max_engines=2)
    router = None
    try:
        async with engines.running(), running_operator():  # the harness first: kopf cancels tasks made after it
            await eventually(lambda: len(engines.urls) == 2, timeout_seconds=240)
            front = emulator.read(SERVICES, NS, "tiny")
            assert front["spec"]["selector"] == routing.router_selector_labels("tiny")
            await emulator.create(slices, endpoint_slice("tiny-engines", engines.ips))
            template = emulator.read(DEPLOYMENTS, NS, "tiny-router")["spec"]["template"]
            ip = loopback_ip(set(engines.ips))
            local = local_process(template["spec"], ip, tmp_path / "router-pod", Path(sys.executable).parent)
            argv = [*local.argv, "--kube-api", emulator_url(), "--namespace", NS]
            with open(tmp_path / "router.log", "wb") as log:
                router = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                          env={**os.environ, **local.env, "OMP_NUM_THREADS": "1"})
            client = openai.AsyncOpenAI(base_url=f"http://{ip}:8000/v1", api_key="unused", timeout=60, max_retries=0)

            async def routed():
                assert router.poll() is None, (tmp_path / "router.log").read_text()[-2000:]
                try:
                    return await client.completions.with_raw_response.create(model="tiny", prompt="Hello",
                                                                              max_tokens=4)
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
    finally:
        if router is not None:
            router.terminate()
            router.wait(30)


def emulator_url() -> str:
    """The emulated API server, as the `emulator` fixture's kubeconfig names it."""
    config = yaml.safe_load(Path(os.environ["KUBECONFIG"]).read_text())
    return config["clusters"][0]["cluster"]["server"]
