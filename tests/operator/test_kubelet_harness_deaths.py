"""The kubelet harness's pods are watched: a pod's process that dies fails the waits of the block at once,
naming the pod; one the harness stopped (scale-down) or a test stopped on purpose (its Pod object deleted)
does not. The pods here run a plain HTTP server (or a command that exits), not an engine: seconds, not minutes.
"""

import kmock
import pytest

from pagedinfer.testing.kubelet_harness import DEPLOYMENTS, KubeletHarness
from pagedinfer.testing.operator_harness import eventually
from pagedinfer.testing.server_process import free_port
from pagedinfer.testing.watched import Died

pytestmark = pytest.mark.timeout(60)
NS = "default"
PODS = kmock.resource("", "v1", "pods")
NEVER = 600.0  # a wait's timeout: `Died` raised proves the wait ended on the death, not on this
SERVES = (
    "import http.server, sys; http.server.ThreadingHTTPServer((sys.argv[sys.argv.index('--host') + 1], "
    "int(sys.argv[sys.argv.index('--port') + 1])), http.server.SimpleHTTPRequestHandler).serve_forever()"
)
EXITS = "import sys; print('loading the model'); print('no such model: tiny', file=sys.stderr); sys.exit(1)"


def deployment(script: str, replicas: int, port: int) -> dict:
    container = {
        "name": "engine",
        "command": ["python", "-c", script],
        "args": ["--port", str(port)],
        "ports": [{"name": "http", "containerPort": port}],
        "readinessProbe": {"httpGet": {"path": "/"}},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "tiny", "namespace": NS},
        "spec": {
            "replicas": replicas,
            "template": {
                "metadata": {"labels": {"app": "tiny"}},
                "spec": {"containers": [container], "terminationGracePeriodSeconds": 5},
            },
        },
    }


async def test_a_pod_whose_process_exits_at_start_fails_the_wait_naming_the_pod_its_exit_code_and_log(
    emulator, tmp_path
):
    await emulator.create(DEPLOYMENTS, deployment(EXITS, 1, free_port()))
    harness = KubeletHarness(emulator, NS, "tiny", tmp_path, max_engines=1)
    with pytest.raises(Died) as died:
        async with harness.running():
            await eventually(lambda: harness.urls, timeout_seconds=NEVER)
    message = str(died.value)
    assert message.startswith("the kubelet harness of default/tiny stopped: pod default/tiny-engine-1's process")
    assert "exited with code 1 before it was ready; the last 30 lines of its log" in message
    assert message.endswith("loading the model\nno such model: tiny")


async def test_a_ready_pod_whose_process_dies_fails_the_wait_naming_its_signal(emulator, tmp_path):
    await emulator.create(DEPLOYMENTS, deployment(SERVES, 1, free_port()))
    harness = KubeletHarness(emulator, NS, "tiny", tmp_path, max_engines=1)
    with pytest.raises(Died) as died:
        async with harness.running():
            await eventually(lambda: harness.urls, timeout_seconds=30)
            process = harness.engines[0].process
            process.kill()
            await eventually(lambda: False, timeout_seconds=NEVER)
    assert str(died.value).startswith(
        f"pod default/tiny-engine-1's process (pid {process.pid}) was killed by SIGKILL; the last 30 lines of its log"
    )


async def test_pods_stopped_by_the_harness_or_deleted_on_purpose_do_not_fail_the_wait(emulator, tmp_path):
    await emulator.create(DEPLOYMENTS, deployment(SERVES, 2, free_port()))
    harness = KubeletHarness(emulator, NS, "tiny", tmp_path, max_engines=2)
    async with harness.running():
        await eventually(lambda: len(harness.urls) == 2, timeout_seconds=30)
        second = harness.engines[1]
        await emulator.merge(DEPLOYMENTS, NS, "tiny", {"spec": {"replicas": 1}})
        await eventually(lambda: second.process.poll() is not None, timeout_seconds=30)  # scaled down: stopped
        first = harness.engines[0]
        await emulator.remove(PODS, NS, first.pod_name)  # a chaos test deletes the pod, then kills it
        first.process.kill()
        first.process.wait(30)
        polls = []
        assert await eventually(lambda: polls.append(1) or len(polls) >= 10, timeout_seconds=NEVER)
    assert harness.engines == [] and harness.failure is None
