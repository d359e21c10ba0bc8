"""The operator image, run: `pagedinfer operator` from it reconciles an InferenceService.

The process starts from the built image as the chart's pod starts it (its
own non-root user, read-only root, /tmp an emptyDir; tests/support/built_images.py)
against the project's emulated API server on 127.0.0.1, and must reconcile
examples/cpu-default-model.yaml as the in-process operator tests see it.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
import yaml
from built_images import ImageContainer, ProcessView
from dockerfiles import REPO

from pagedinfer.operator.spec.crd_model import DEFAULT_CPU_IMAGE
from pagedinfer.testing.operator_harness import (
    DEPLOYMENTS,
    ISVC,
    SERVICES,
    condition,
    eventually,
    roll_out,
    serving_emulator,
    write_kubeconfig,
)
from pagedinfer.testing.server_process import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

EXAMPLE = REPO / "examples" / "cpu-default-model.yaml"
CHART_USER = 10001  # charts/pagedinfer values.yaml operator.podSecurityContext.runAsUser


async def get_text(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as r:
        return r.status, await r.text()


async def test_the_operator_image_reconciles_an_inference_service_as_its_user_on_a_read_only_root(
    operator_image, operator_container, tmp_path
):
    example = yaml.safe_load(EXAMPLE.read_text())
    name = example["metadata"]["name"]
    metrics_port, liveness_port = free_port(), free_port()
    async with serving_emulator() as (emulator, url):
        (tmp_path / "kube").mkdir()
        write_kubeconfig(tmp_path / "kube" / "config", url)  # read-only, like a mounted Secret
        command = [
            "pagedinfer",
            "operator",
            "--namespace",
            "default",
            "--standalone",
            "--liveness",
            f"127.0.0.1:{liveness_port}",
            "--metrics-port",
            str(metrics_port),
            "--no-fetch-hf-config",
        ]
        with ImageContainer(
            operator_container,
            command,
            tmp_path,
            env={"KUBECONFIG": "/etc/kube/config"},
            volumes={"/etc/kube": tmp_path / "kube"},
        ) as container:
            await emulator.create(ISVC, {**example, "metadata": {"name": name, "namespace": "default"}})

            def applied():
                isvc = emulator.read(ISVC, "default", name)
                return condition(isvc, "Applied")["status"] == "True" and isvc

            isvc = await eventually(applied, timeout_seconds=120, interval_seconds=0.2)
            assert condition(isvc, "Valid")["status"] == "True"
            assert condition(isvc, "Sized")["reason"] == "SizedFromMemory"
            deployment = emulator.read(DEPLOYMENTS, "default", name)
            assert emulator.read(SERVICES, "default", name) is not None
            assert deployment["metadata"]["ownerReferences"][0]["uid"] == isvc["metadata"]["uid"]
            engine = deployment["spec"]["template"]["spec"]["containers"][0]
            assert engine["image"] == DEFAULT_CPU_IMAGE  # gpus: 0, no spec.engine.image: the operator's CPU image
            assert "--cpu-memory-budget" in engine["args"]

            await roll_out(emulator, name, ready=1)
            ready = await eventually(
                lambda: (
                    condition(emulator.read(ISVC, "default", name), "Ready")["status"] == "True"
                    and emulator.read(ISVC, "default", name)
                ),
                timeout_seconds=60,
            )
            assert ready["status"]["phase"] == "Ready" and ready["status"]["readyReplicas"] == 1

            metrics = (await get_text(f"http://127.0.0.1:{metrics_port}/metrics"))[1]
            assert 'pagedinfer_operator_reconciles_total{result="applied"}' in metrics
            assert (await get_text(f"http://127.0.0.1:{liveness_port}/healthz"))[0] == 200

            pid = container.main_pid()
            assert pid is not None
            view = ProcessView.of(pid)
            assert operator_image.config()["User"] == f"{CHART_USER}:{CHART_USER}"
            assert (view.uid, view.gid, view.capabilities) == (CHART_USER, CHART_USER, 0)
            assert view.root_read_only
            code, output = await asyncio.to_thread(container.terminate)
    assert code == 0, output[-3000:]
    assert "test-token" not in output
    assert "Read-only file system" not in output
