"""The CPU engine image, run: the engine pod the operator builds for a `gpus: 0` service serves from it.

The container is the one `pagedinfer.operator.children.builders` makes for
examples/cpu-default-model.yaml (its command, flags and environment, its
emptyDirs), started from the built image as its pod would start it (uid 1000,
read-only root; tests/support/built_images.py), on a free port of 127.0.0.1.
It must answer /health, a completion through the `openai` client and
/metrics, and drain an in-flight request on SIGTERM, then exit 0. Its native
CPU kernels are the image's prebuilt library, root-owned and read-only: the
engine logs loading it (on the first request's attention), compiles nothing
and writes no extensions cache (the image has no compiler); the pod's
start-up time (to a healthy /health) and its time to a first completion are
printed.
"""

from __future__ import annotations

import json
import threading
import time
from importlib.resources import files

import httpx
import openai
import pytest
import yaml
from built_images import ImageContainer, ProcessView
from dockerfiles import REPO

from pagedinfer.operator.children import builders
from pagedinfer.operator.kv_plan import planning
from pagedinfer.operator.spec.parser import parse_spec
from pagedinfer.testing.server_process import free_port, wait_process_healthy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

EXAMPLE = REPO / "examples" / "cpu-default-model.yaml"
KERNELS_DIR = "/opt/pagedinfer/cpu-kernels"  # images/engine-cpu.Dockerfile's PAGEDINFER_CPU_KERNELS_DIR


def operator_engine_container(port: int) -> tuple[str, list[str], dict[str, str], list[str]]:
    """(served model name, command, env, emptyDir mount paths) of the example's engine pod, listening on port."""
    example = yaml.safe_load(EXAMPLE.read_text())
    spec = parse_spec(example["metadata"]["name"], example["spec"])
    config = json.loads((files("pagedinfer.contracts") / "default_model" / "config.json").read_text())
    shape = planning.shape_from_config(config, spec.model.dtype, cpu=True)  # as the operator sizes it
    container = builders.build_pod_spec(spec, planning.plan_for(spec, shape, None, planning.SOURCE_MEMORY))[
        "containers"
    ][0]
    args = list(container["args"])
    args[args.index("--host") + 1], args[args.index("--port") + 1] = "127.0.0.1", str(port)
    env = {item["name"]: item["value"] for item in container["env"] if "value" in item}
    # buildah's chroot gives the process the host's /dev, /dev/shm included.
    mounts = [m["mountPath"] for m in container["volumeMounts"] if m["mountPath"] != "/dev/shm"]
    return spec.served_model_name, [*container["command"], *args], env, mounts


def running_requests(url: str) -> float:
    lines = [
        line
        for line in httpx.get(url + "/metrics", timeout=10).text.splitlines()
        if line.startswith("pagedinfer_num_requests_running{")
    ]
    return float(lines[0].split()[-1]) if lines else 0.0


def test_the_cpu_engine_image_serves_the_operators_engine_pod_and_drains_on_sigterm(engine_cpu_container, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    model, command, env, mounts = operator_engine_container(port)
    volumes = {path: tmp_path / "volumes" / path.strip("/") for path in mounts}
    with ImageContainer(engine_cpu_container, command, tmp_path, env=env, volumes=volumes) as container:
        started = time.monotonic()
        wait_process_healthy(url, container.process, timeout_seconds=300)
        print(f"engine pod start-up (container start to a healthy /health): {time.monotonic() - started:.1f} s")
        view = ProcessView.of(container.main_pid())
        assert (view.uid, view.gid, view.capabilities) == (builders.RUN_AS_USER, builders.RUN_AS_USER, 0)
        assert view.root_read_only

        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=120, max_retries=0)
        completion = client.completions.create(
            model=model, prompt="Hello", max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
        )
        # the kernels load on the first CPU attention: a pod that compiled them would stall this request
        print(f"engine pod to its first completion (8 tokens): {time.monotonic() - started:.1f} s")
        assert completion.usage.completion_tokens == 8 and completion.choices[0].finish_reason == "length"
        assert completion.choices[0].text
        finished = [
            line
            for line in httpx.get(url + "/metrics", timeout=10).text.splitlines()
            if line.startswith("pagedinfer_request_success_total{") and 'finished_reason="length"' in line
        ]
        assert finished and float(finished[0].split()[-1]) == 1.0, finished

        outcome: list[str] = []

        def stream() -> None:
            chunks = client.completions.create(
                model=model,
                prompt="Keep talking",
                max_tokens=64,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            outcome.extend(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason)

        streamer = threading.Thread(target=stream)
        streamer.start()
        deadline = time.monotonic() + 120
        while running_requests(url) < 1 and streamer.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        code, log = container.terminate(timeout_seconds=120)
        streamer.join(60)
    print(*(line for line in log.splitlines() if "native CPU kernels" in line), sep="\n")
    assert code == 0, log[-3000:]
    assert outcome == ["length"], log[-3000:]  # the request in flight at SIGTERM ran to its end
    assert "Read-only file system" not in log and "Traceback" not in log, log[-3000:]
    assert f"native CPU kernels: prebuilt library {KERNELS_DIR}/pagedinfer_cpu_kernels_" in log, log[-3000:]
    assert "could not be built" not in log, log[-3000:]
    assert not list(tmp_path.rglob("torch_extensions")), "the engine wrote an extensions cache (it compiled)"


def test_the_cpu_engine_image_ships_its_kernels_root_owned_and_no_compiler(engine_cpu_image, engine_cpu_container):
    assert engine_cpu_image.config()["Env"].count(f"PAGEDINFER_CPU_KERNELS_DIR={KERNELS_DIR}") == 1
    folder = engine_cpu_container.root / KERNELS_DIR.lstrip("/")
    (library,) = folder.iterdir()
    assert library.name.startswith("pagedinfer_cpu_kernels_") and library.suffix == ".so"
    for path, mode in ((folder, 0o755), (library, 0o644)):
        status = path.stat()
        assert (status.st_uid, status.st_mode & 0o777) == (0, mode), path  # the engine's user reads, never writes
    compilers = [
        name for name in ("g++", "c++", "gcc", "cc") if (engine_cpu_container.root / "usr/bin" / name).exists()
    ]
    assert not compilers, f"the image carries {compilers}: the library is built in the Dockerfile's kernels stage"
