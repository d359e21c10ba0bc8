"""The kubelet's part in the autoscaling end-to-end tests (there is no cluster here).

The API server is the emulator of kube_emulator.py and the
operator runs through operator_harness.py; this module adds
what a kubelet would do:

- `add_ready_pod(...)` / `pod_manifest(...)`: a Running, Ready pod of an
  InferenceService (its selector labels) at a given podIP.
- `KubeletHarness`: watches (polls) the Deployment the reconciler made for
  an InferenceService and for its N `spec.replicas` keeps N real engine
  processes running the Deployment's container command and args (only
  `--host` and volume paths changed, pod_process.py), each
  on its own loopback address (127.0.0.2, 127.0.0.3, ...) at the
  container's port, with a Pod object made from the pod template (labels,
  spec) plus a Running, Ready status and that podIP in the emulated API
  server; on scale-down it deletes the Pod object first (as endpoints drop
  a terminating pod) and then stops the process. At most `max_engines` run.
  With `lifecycle=True` it plays the kubelet and the Deployment controller
  more fully (pod_lifecycle.py): a pod to stop is the one the ReplicaSet
  would delete (`scale_down_order`: pod-deletion-cost honoured; a rolling
  update's old pods first), it is deleted gracefully (terminating, with a
  deletionTimestamp, while its preStop hook runs, then SIGTERM, and its Pod
  object removed once the process exited), and a changed pod template rolls
  the pods one at a time (maxSurge 1, maxUnavailable 0). A pod whose
  template has `readinessGates` counts as ready (joins `engines`, lets a
  rollout go on) only once the emulator says Ready, i.e. once something set
  every gate's condition (the router, for `pagedinfer.io/warmed`).
  `async with harness.running():` runs it for a block, watched by every
  `eventually` there (watched.py): an engine that exits unexpectedly fails
  the wait at once, naming its pod, its exit code and its log's tail.
- `loopback_ip()`: a free 127.0.0.x address for port 8000, in this process's share of them
  (worker_share.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import kmock

from pagedinfer.testing.kube_emulator import KubeEmulator
from pagedinfer.testing.kube_emulator_rules import scale_down_order
from pagedinfer.testing.pod_lifecycle import pre_stop, template_key
from pagedinfer.testing.pod_process import http_port, local_process
from pagedinfer.testing.watched import Died, exit_report, log_tail, stop_task, watching
from pagedinfer.testing.worker_share import LOOPBACK_OCTETS, loopback_octets

ENGINE_PORT = 8000
KILL_WAIT_SECONDS = 10.0  # for a SIGKILLed process to be reaped: only one stuck in the kernel takes longer
PODS = kmock.resource("", "v1", "pods")
DEPLOYMENTS = kmock.resource("apps", "v1", "deployments")
ISVC = kmock.resource("serving.pagedinfer.dev", "v1alpha1", "inferenceservices")


async def add_ready_pod(emulator: KubeEmulator, namespace: str, manifest: dict[str, Any]) -> None:
    """Create the pod, then write its status (as the scheduler and kubelet do)."""
    manifest = {**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}}
    status = manifest.pop("status")
    await emulator.create(PODS, manifest)
    await emulator.set_status(PODS, namespace, manifest["metadata"]["name"], status)


def loopback_ip(taken: set[str] = frozenset(), port: int = ENGINE_PORT, first: int | None = None) -> str:
    """The first 127.0.0.x where `port` is free and not in `taken`: x >= first, else x in this process's
    share (worker_share.py: pytest-xdist's workers take disjoint ones)."""
    for last in loopback_octets() if first is None else range(first, LOOPBACK_OCTETS.stop):
        ip = f"127.0.0.{last}"
        if ip in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind((ip, port))
            except OSError:
                continue
            return ip
    raise RuntimeError(f"no free loopback address for port {port} (first: {first}, share: {loopback_octets()})")


def pod_manifest(name: str, instance: str, ip: str, ready: bool = True) -> dict[str, Any]:
    """A Running pod of `instance` (selector labels of pagedinfer.operator.children.labels) at `ip`."""
    from pagedinfer.operator.children.labels import selector_labels

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": selector_labels(instance)},
        "spec": {
            "containers": [
                {
                    "name": "engine",
                    "image": "pagedinfer-engine",
                    "ports": [{"name": "http", "containerPort": ENGINE_PORT}],
                }
            ]
        },
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod_from_template(name: str, template: dict[str, Any], ip: str) -> dict[str, Any]:
    """A Running, Ready pod as a ReplicaSet would create it from `template`, at `ip`; its conditions stamped
    with the time now, as the kubelet stamps a transition (lastTransitionTime)."""
    metadata = template.get("metadata") or {}
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": dict(metadata.get("labels") or {}),
            "annotations": dict(metadata.get("annotations") or {}),
        },
        "spec": copy.deepcopy(template["spec"]),
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                {"type": "Ready", "status": "True", "lastTransitionTime": now},
            ],
        },
    }  # with spec.readinessGates the emulator holds Ready False until every gate is True (gated_pod_readiness)


def pod_is_ready(pod: dict[str, Any] | None) -> bool:
    conditions = ((pod or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


async def pause(stop: asyncio.Event, seconds: float) -> None:
    """Sleep `seconds`, or until `stop` is set (seen within 50 ms), creating no task.

    No task, unlike `asyncio.wait_for(stop.wait(), ...)`: kopf, exiting, waits up to 5 s for every
    task created after it started and then cancels it, and a harness may outlive the operator."""
    deadline = time.monotonic() + seconds
    while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
        await asyncio.sleep(min(left, 0.05))


@dataclass
class Engine:
    pod_name: str
    ip: str
    port: int
    process: subprocess.Popen
    log_path: Path
    template: dict[str, Any] = field(default_factory=dict)  # the pod template it was started from


def native_kernels_cache() -> str:
    """The torch extensions folder of this process, which the engine processes share.

    The engines here run the source tree, which has no prebuilt library (the
    CPU engine image ships one, so its pods load it and compile nothing;
    kernels/cpu/build.py), and a pod's HOME is its own emptyDir (/tmp): each
    engine process would compile the native CPU kernels at start, in about a
    minute on two cores, which is g++'s time, not the engines'. They load this
    process's build instead (the same sources, flags and torch, so the same
    hash-named folder; the first to need it builds it under the build lock).
    """
    explicit = os.environ.get("TORCH_EXTENSIONS_DIR")
    if explicit:
        return explicit
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "torch_extensions", f"py{sys.version_info.major}{sys.version_info.minor}_cpu")


@dataclass
class KubeletHarness:
    """Plays the kubelet for one InferenceService's Deployment with real engine processes.

    Each process runs the Deployment's container command line (see
    pod_process.py for the only changes a local process
    needs); its Pod object is the Deployment's pod template plus a Running,
    Ready status. The template is read when a pod starts: a later change does
    not roll running pods.

    Invariants: `engines` holds the pods that are Ready: a process joins it
    once its readiness probe answered and its Pod object exists, and leaves
    it before the harness deletes its Pod object and stops it. Nothing is
    restarted: an engine that exits before it is ready ends `run()` with
    RuntimeError (kept in `failure`); one that exits later stays in
    `engines`, dead, and `death()` reports it. Every wait for a process is
    bounded: readiness by `ready_timeout_seconds` (or the stop), a stop by
    the pod's terminationGracePeriodSeconds, then SIGKILL."""

    emulator: KubeEmulator
    namespace: str
    instance: str
    log_dir: Path
    max_engines: int = 3
    poll_seconds: float = 0.3
    ready_timeout_seconds: float = 120.0
    lifecycle: bool = False  # graceful termination, ReplicaSet victims and rolling updates (the module's doc)
    # pods get 127.0.0.x from x = first_ip (harnesses run side by side take apart ranges); None: from this
    # process's share of the addresses (worker_share.py), so pytest-xdist's workers never race for one
    first_ip: int | None = None
    bin_dir: Path = Path(sys.executable).parent
    engines: list[Engine] = field(default_factory=list)
    history: list[tuple[float, int]] = field(default_factory=list)  # (monotonic time, desired replicas)
    failure: Exception | None = None  # why run() ended, if it ended by raising
    _counter: int = 0

    def deployment(self) -> dict[str, Any] | None:
        return self.emulator.read(DEPLOYMENTS, self.namespace, self.instance)

    def desired_replicas(self) -> int:
        """The Deployment's spec.replicas; 0 until the reconciler made the Deployment."""
        deployment = self.deployment()
        return 0 if deployment is None else int((deployment.get("spec") or {}).get("replicas", 1))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[KubeletHarness]:
        """run() in a task of its own for the block, watched by every `eventually` in it; then stopped.

        Enter it before `running_operator()`: kopf, exiting, cancels the tasks created after it. The
        stop is bounded (each engine's stop is; stop_task bounds the rest). run()'s exception is raised
        at the end of a block that did not fail itself (one that failed has already reported it)."""
        stop = asyncio.Event()
        task = asyncio.create_task(self.run(stop), name=f"kubelet harness {self.namespace}/{self.instance}")
        try:
            with watching(self):
                yield self
        except BaseException as exc:
            stop.set()
            await stop_task(task, self._stop_bound_seconds())
            if isinstance(exc, Died) and not task.cancelled():
                task.exception()  # retrieved: the block's failure reports it (asyncio would log it again)
            raise
        stop.set()
        await stop_task(task, self._stop_bound_seconds())
        if self.failure is not None:
            raise self.failure

    def death(self) -> str | None:
        """Why the harness or one of its Ready pods' processes ended unexpectedly; None if neither did.

        A pod's process counts only while the pod is in `engines` (the harness removes it before it
        stops it) and its Pod object exists (a test that deleted it has stopped the pod on purpose)."""
        if self.failure is not None:
            return f"the kubelet harness of {self.namespace}/{self.instance} stopped: {self.failure}"
        for engine in self.engines:
            code = engine.process.poll()
            if code is not None and self.emulator.read(PODS, self.namespace, engine.pod_name) is not None:
                return exit_report(
                    f"pod {self.namespace}/{engine.pod_name}'s process (pid {engine.process.pid})",
                    code,
                    engine.log_path,
                )
        return None

    async def run(self, stop: asyncio.Event) -> None:
        """Converge engines to the desired count until `stop` is set; then stop every engine."""
        try:
            while not stop.is_set():
                desired = min(self.desired_replicas(), self.max_engines)
                if not self.history or self.history[-1][1] != desired:
                    self.history.append((time.monotonic(), desired))
                while len(self.engines) > desired:
                    await self._stop(self._victim() if self.lifecycle else self.engines.pop())
                if self.lifecycle and len(self.engines) == desired and self._outdated():
                    await self._start(stop)  # the surge pod; the next pass removes an old one
                while len(self.engines) < desired and not stop.is_set():
                    await self._start(stop)
                await pause(stop, self.poll_seconds)
        except Exception as exc:
            self.failure = exc
            raise
        finally:  # the harness ends: no preStop waits, whatever `lifecycle` says
            while self.engines:
                engine = self.engines.pop()
                with contextlib.suppress(Exception):
                    await self.emulator.remove(PODS, self.namespace, engine.pod_name)
                await self._stop_process(engine)

    async def stop_all(self) -> None:
        """Stop every engine now (SIGTERM, no preStop) and remove its Pod object, while the operator still
        runs: a block that ends the operator first leaves the harness nothing to do at its end."""
        while self.engines:
            engine = self.engines.pop()
            with contextlib.suppress(Exception):
                await self.emulator.remove(PODS, self.namespace, engine.pod_name)
            await self._stop_process(engine)

    def _outdated(self) -> list[Engine]:
        deployment = self.deployment()
        current = template_key(deployment["spec"]["template"]) if deployment is not None else None
        return [e for e in self.engines if template_key(e.template) != current]

    def _victim(self) -> Engine:
        """The engine the ReplicaSet deletes next (removed from `engines`): an old revision's first."""
        candidates = self._outdated() or self.engines
        pods = [self.emulator.read(PODS, self.namespace, e.pod_name) for e in candidates]
        order = scale_down_order([p for p in pods if p is not None])
        name = order[0]["metadata"]["name"] if order else candidates[-1].pod_name
        victim = next(e for e in candidates if e.pod_name == name)
        self.engines.remove(victim)
        return victim

    @property
    def ips(self) -> list[str]:
        return [e.ip for e in self.engines]

    @property
    def urls(self) -> list[str]:
        return [f"http://{e.ip}:{e.port}" for e in self.engines]

    async def _start(self, stop: asyncio.Event) -> None:
        """Start a pod's process; once it is ready, create its Pod object and add it to `engines`.

        A process that exits or is never ready raises RuntimeError; one still starting when `stop` is
        set, or when this task is cancelled, is stopped before this returns."""
        template = copy.deepcopy(self.deployment()["spec"]["template"])
        container = template["spec"]["containers"][0]
        port = http_port(container)
        ip = loopback_ip(set(self.ips), port, self.first_ip)
        self._counter += 1
        pod_name = f"{self.instance}-engine-{self._counter}"
        pod_dir = self.log_dir / pod_name
        local = local_process(template["spec"], ip, pod_dir, self.bin_dir)
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TORCH_EXTENSIONS_DIR=native_kernels_cache())
        env.pop("PAGEDINFER_API_KEY", None)
        env.update(local.env)
        for value in local.env.values():
            if value.startswith(str(pod_dir)):
                Path(value).mkdir(parents=True, exist_ok=True)
        Path(local.cwd).mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{pod_name}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(local.argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=local.cwd)
        engine = Engine(pod_name, ip, port, process, log_path, template)
        try:
            ready = await self._wait_ready(engine, container["readinessProbe"]["httpGet"]["path"], stop)
            if ready:
                await add_ready_pod(self.emulator, self.namespace, pod_from_template(pod_name, template, ip))
                if template["spec"].get("readinessGates"):
                    ready = await self._wait_gates(engine, stop)
        except BaseException:
            await self._stop_process(engine)
            raise
        if ready:
            self.engines.append(engine)
        else:
            await self._stop_process(engine)

    async def _wait_ready(self, engine: Engine, probe_path: str, stop: asyncio.Event) -> bool:
        """Poll the readiness probe's path, as the kubelet does before marking the pod Ready.

        True once it answers 200; False if `stop` is set first; RuntimeError if the process exits or
        is not ready within `ready_timeout_seconds`."""
        deadline = time.monotonic() + self.ready_timeout_seconds
        url = f"http://{engine.ip}:{engine.port}{probe_path}"
        name = f"pod {self.namespace}/{engine.pod_name}'s process (pid {engine.process.pid})"
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline and not stop.is_set():
                code = engine.process.poll()
                if code is not None:
                    raise RuntimeError(exit_report(name, code, engine.log_path, " before it was ready"))
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                    async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as response:
                        if response.status == 200:
                            return True
                await pause(stop, 0.3)
        if stop.is_set():
            return False
        raise RuntimeError(
            f"{name} not ready after {self.ready_timeout_seconds:g} s; the last lines of its log "
            f"{engine.log_path}:\n{log_tail(engine.log_path)}"
        )

    async def _wait_gates(self, engine: Engine, stop: asyncio.Event) -> bool:
        """Wait for the Pod object to turn Ready: its readiness gates' conditions True (set by someone else).

        True once Ready; False if `stop` is set first (the Pod object is then removed); RuntimeError if the
        process exits or the pod is not Ready within `ready_timeout_seconds`."""
        deadline = time.monotonic() + self.ready_timeout_seconds
        name = f"pod {self.namespace}/{engine.pod_name}"
        while time.monotonic() < deadline and not stop.is_set():
            if pod_is_ready(self.emulator.read(PODS, self.namespace, engine.pod_name)):
                return True
            code = engine.process.poll()
            if code is not None:
                raise RuntimeError(exit_report(f"{name}'s process", code, engine.log_path, " before its gates opened"))
            await pause(stop, 0.1)
        pod = self.emulator.read(PODS, self.namespace, engine.pod_name) or {}
        with contextlib.suppress(Exception):
            await self.emulator.remove(PODS, self.namespace, engine.pod_name)
        if stop.is_set():
            return False
        raise RuntimeError(
            f"{name} not Ready {self.ready_timeout_seconds:g} s after its containers were: its readiness gates"
            f" {[g.get('conditionType') for g in pod.get('spec', {}).get('readinessGates', [])]} never all True"
        )

    def _grace_seconds(self) -> float:
        return float(
            (((self.deployment() or {}).get("spec") or {}).get("template", {}).get("spec") or {}).get(
                "terminationGracePeriodSeconds", 30
            )
        )

    def _stop_bound_seconds(self) -> float:
        """Long enough for run() to stop every engine it holds (each SIGTERM, grace, SIGKILL) and one starting."""
        return (len(self.engines) + 1) * (self._grace_seconds() + KILL_WAIT_SECONDS) + 5.0

    async def _stop(self, engine: Engine) -> None:
        """Delete the Pod object (endpoints drop a terminating pod), then stop its process; with `lifecycle`,
        gracefully: the Pod terminating while the preStop hook runs, then SIGTERM, then the Pod removed."""
        if not self.lifecycle:
            with contextlib.suppress(Exception):
                await self.emulator.remove(PODS, self.namespace, engine.pod_name)
            await self._stop_process(engine)
            return
        with contextlib.suppress(Exception):
            await self.emulator.begin_pod_deletion(self.namespace, engine.pod_name)
        started = time.monotonic()
        await pre_stop(engine.template["spec"]["containers"][0], self._grace_seconds())
        await self._stop_process(engine, max(1.0, self._grace_seconds() - (time.monotonic() - started)))
        with contextlib.suppress(Exception):
            await self.emulator.remove(PODS, self.namespace, engine.pod_name)

    async def _stop_process(self, engine: Engine, grace_seconds: float | None = None) -> None:
        """SIGTERM, SIGKILL after the grace period; bounded (a process that outlives SIGKILL is left)."""
        if engine.process.poll() is not None:
            return
        engine.process.terminate()
        try:
            await asyncio.to_thread(engine.process.wait, grace_seconds or self._grace_seconds())
        except subprocess.TimeoutExpired:
            engine.process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(engine.process.wait, KILL_WAIT_SECONDS)


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
            urls = self.harness.urls
            if not self.active.is_set() or not urls:
                await asyncio.sleep(0.1)
                continue
            index, self._next = self._next, self._next + 1
            body = {
                "model": self.harness.instance,
                "prompt": self.prompt_of(index),
                "max_tokens": self.max_tokens,
                "ignore_eos": True,
                "temperature": 0.0,
            }
            try:
                async with session.post(f"{urls[index % len(urls)]}/v1/completions", json=body) as response:
                    await response.read()
                    ok = response.status == 200
            except (TimeoutError, aiohttp.ClientError):
                ok = False
            if ok:
                self.num_completed += 1
            else:
                self.num_failed += 1
                await asyncio.sleep(0.1)
