"""The kubelet's part in the autoscaling end-to-end tests (there is no cluster here).

The API server is the emulator of tests/support/kube_emulator.py and the
operator runs through tests/support/operator_harness.py; this module adds
what a kubelet would do:

- `add_ready_pod(...)` / `pod_manifest(...)`: a Running, Ready pod of an
  InferenceService (its selector labels) at a given podIP.
- `KubeletHarness`: watches (polls) an InferenceService's desired replica
  count - its Deployment's `spec.replicas` when the reconciler made one,
  else the InferenceService's own `spec.replicas` - and for N replicas keeps
  N real `pagedinfer serve` processes running, each on its own loopback
  address (127.0.0.2, 127.0.0.3, ...) port 8000, with a ready Pod object
  (selector labels, podIP, Ready condition) in the emulated API server;
  on scale-down it deletes the Pod object first (as endpoints drop a
  terminating pod) and then stops the process. At most `max_engines` run.
- `loopback_ip()`: a free 127.0.0.x address for port 8000.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import kmock

from kube_emulator import KubeEmulator

ENGINE_PORT = 8000
PODS = kmock.resource("", "v1", "pods")
DEPLOYMENTS = kmock.resource("apps", "v1", "deployments")
ISVC = kmock.resource("serving.pagedinfer.dev", "v1alpha1", "inferenceservices")


async def add_ready_pod(emulator: KubeEmulator, namespace: str, manifest: dict[str, Any]) -> None:
    """Create the pod, then write its status (as the scheduler and kubelet do)."""
    manifest = {**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}}
    status = manifest.pop("status")
    await emulator.create(PODS, manifest)
    await emulator.set_status(PODS, namespace, manifest["metadata"]["name"], status)


def loopback_ip(taken: set[str] = frozenset(), port: int = ENGINE_PORT) -> str:
    """The first 127.0.0.x (x >= 2) where `port` is free and not in `taken`."""
    for last in range(2, 255):
        ip = f"127.0.0.{last}"
        if ip in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind((ip, port))
            except OSError:
                continue
            return ip
    raise RuntimeError(f"no free loopback address for port {port}")


def pod_manifest(name: str, instance: str, ip: str, ready: bool = True) -> dict[str, Any]:
    """A Running pod of `instance` (selector labels of pagedinfer.operator.builders) at `ip`."""
    from pagedinfer.operator.builders import selector_labels

    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": selector_labels(instance)},
        "spec": {"containers": [{"name": "engine", "image": "pagedinfer-engine",
                                 "ports": [{"name": "http", "containerPort": ENGINE_PORT}]}]},
        "status": {"phase": "Running", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


@dataclass
class Engine:
    pod_name: str
    ip: str
    process: subprocess.Popen
    log_path: Path


@dataclass
class KubeletHarness:
    """Plays the kubelet for one InferenceService with real engine processes."""

    emulator: KubeEmulator
    namespace: str
    instance: str
    model_dir: Path
    log_dir: Path
    engine_args: tuple[str, ...] = ()
    max_engines: int = 3
    poll_seconds: float = 0.3
    engines: list[Engine] = field(default_factory=list)
    history: list[tuple[float, int]] = field(default_factory=list)  # (monotonic time, desired replicas)
    _counter: int = 0

    def desired_replicas(self) -> int:
        deployment = self.emulator.read(DEPLOYMENTS, self.namespace, self.instance)
        if deployment is not None:
            return int((deployment.get("spec") or {}).get("replicas", 1))
        body = self.emulator.read(ISVC, self.namespace, self.instance) or {}
        return int((body.get("spec") or {}).get("replicas", 0))

    async def run(self, stop: asyncio.Event) -> None:
        """Converge engines to the desired count until `stop` is set; then stop every engine."""
        try:
            while not stop.is_set():
                desired = min(self.desired_replicas(), self.max_engines)
                if not self.history or self.history[-1][1] != desired:
                    self.history.append((time.monotonic(), desired))
                while len(self.engines) > desired:
                    await self._stop(self.engines.pop())
                while len(self.engines) < desired:
                    await self._start()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.poll_seconds)
        finally:
            while self.engines:
                await self._stop(self.engines.pop())

    @property
    def ips(self) -> list[str]:
        return [e.ip for e in self.engines]

    async def _start(self) -> None:
        ip = loopback_ip(set(self.ips))
        self._counter += 1
        pod_name = f"{self.instance}-engine-{self._counter}"
        log_path = self.log_dir / f"{pod_name}.log"
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        env.pop("PAGEDINFER_API_KEY", None)
        command = [str(Path(sys.executable).parent / "pagedinfer"), "serve", "--model", str(self.model_dir),
                   "--served-model-name", self.instance, "--host", ip, "--port", str(ENGINE_PORT),
                   "--log-level", "warning", "--shutdown-grace-seconds", "0", *self.engine_args]
        with open(log_path, "wb") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        engine = Engine(pod_name, ip, process, log_path)
        await self._wait_healthy(engine)
        self.engines.append(engine)
        await add_ready_pod(self.emulator, self.namespace, pod_manifest(pod_name, self.instance, ip))

    async def _wait_healthy(self, engine: Engine, timeout_seconds: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_seconds
        url = f"http://{engine.ip}:{ENGINE_PORT}/health"
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if engine.process.poll() is not None:
                    raise RuntimeError(f"engine {engine.pod_name} exited: {engine.log_path.read_text()[-2000:]}")
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                    async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as response:
                        if response.status == 200:
                            return
                await asyncio.sleep(0.3)
        engine.process.kill()
        raise RuntimeError(f"engine {engine.pod_name} not healthy after {timeout_seconds} s")

    async def _stop(self, engine: Engine) -> None:
        with contextlib.suppress(Exception):
            await self.emulator.remove(PODS, self.namespace, engine.pod_name)
        engine.process.terminate()
        try:
            await asyncio.to_thread(engine.process.wait, 20)
        except subprocess.TimeoutExpired:
            engine.process.kill()
            await asyncio.to_thread(engine.process.wait)



@dataclass
class LoadGenerator:
    """Closed-loop clients of the InferenceService's pods (the Service's part):
    `concurrency` workers, each sending one completion at a time while `active`
    is set, round-robin over the engines that are up. Request i's prompt is
    `prompt_of(i)`; `max_tokens` with ignore_eos makes outputs long."""

    harness: KubeletHarness
    prompt_of: Any  # Callable[[int], str]
    concurrency: int = 4
    max_tokens: int = 160
    active: asyncio.Event = field(default_factory=asyncio.Event)
    num_completed: int = 0
    num_failed: int = 0
    _next: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            await asyncio.gather(*(self._worker(session, stop) for _ in range(self.concurrency)))

    async def _worker(self, session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        while not stop.is_set():
            ips = self.harness.ips
            if not self.active.is_set() or not ips:
                await asyncio.sleep(0.1)
                continue
            index, self._next = self._next, self._next + 1
            body = {"model": self.harness.instance, "prompt": self.prompt_of(index), "max_tokens": self.max_tokens,
                    "ignore_eos": True, "temperature": 0.0}
            try:
                async with session.post(f"http://{ips[index % len(ips)]}:{ENGINE_PORT}/v1/completions",
                                        json=body) as response:
                    await response.read()
                    ok = response.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError):
                ok = False
            if ok:
                self.num_completed += 1
            else:
                self.num_failed += 1
                await asyncio.sleep(0.1)
