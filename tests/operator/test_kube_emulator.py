"""The emulator behaves like kube-apiserver where kopf and the operator depend on it (over real HTTP)."""

import asyncio
import json

import aiohttp
import pytest

from pagedinfer.testing.kube_emulator import Access, Fault, wait_changed
from pagedinfer.testing.kube_emulator_rules import canonical_quantity, label_selector
from pagedinfer.testing.operator_harness import eventually, serving_emulator

pytestmark = pytest.mark.timeout(30)
DEPLOY = "/apis/apps/v1/namespaces/default/deployments"
ISVC = "/apis/serving.pagedinfer.dev/v1alpha1/namespaces/default/inferenceservices"
JSON_PATCH = {"Content-Type": "application/json-patch+json"}
MERGE = {"Content-Type": "application/merge-patch+json"}


@pytest.fixture
async def api():
    async with serving_emulator() as (emulator, url), aiohttp.ClientSession(base_url=url + "/") as session:
        yield emulator, session


async def send(session, method, path, body=None, headers=None):
    data = None if body is None else json.dumps(body)
    async with session.request(
        method, path.lstrip("/"), data=data, headers=headers or {"Content-Type": "application/json"}
    ) as r:
        return r.status, await r.json()


def deployment(name, labels=None):
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"replicas": 1, "selector": {}},
        "status": {"readyReplicas": 7},
    }


async def test_create_sets_server_fields_and_conflicts_on_duplicates(api):
    _, s = api
    code, obj = await send(s, "POST", DEPLOY, deployment("a"))
    assert code == 201 and obj["metadata"]["generation"] == 1 and obj["metadata"]["uid"]
    assert obj["metadata"]["resourceVersion"] and obj["metadata"]["creationTimestamp"]
    assert "status" not in obj  # status is a subresource: ignored on create
    assert (await send(s, "POST", DEPLOY, deployment("a")))[0] == 409
    code, named = await send(s, "POST", DEPLOY, {"metadata": {"generateName": "gen-"}, "spec": {}})
    assert code == 201 and named["metadata"]["name"].startswith("gen-")


async def test_generation_moves_with_spec_only_and_status_only_through_the_subresource(api):
    _, s = api
    await send(s, "POST", DEPLOY, deployment("a"))
    _, obj = await send(
        s, "PATCH", DEPLOY + "/a", {"metadata": {"labels": {"x": "y"}}, "status": {"replicas": 3}}, MERGE
    )
    assert obj["metadata"]["generation"] == 1 and "status" not in obj
    _, obj = await send(s, "PATCH", DEPLOY + "/a", {"spec": {"replicas": 2}}, MERGE)
    assert obj["metadata"]["generation"] == 2
    _, obj = await send(s, "PATCH", DEPLOY + "/a/status", {"spec": {"replicas": 9}, "status": {"replicas": 2}}, MERGE)
    assert obj["status"] == {"replicas": 2} and obj["spec"]["replicas"] == 2 and obj["metadata"]["generation"] == 2
    rv = obj["metadata"]["resourceVersion"]
    _, same = await send(s, "PATCH", DEPLOY + "/a", {"spec": {"replicas": 2}}, MERGE)
    assert same["metadata"]["resourceVersion"] == rv  # a no-op write changes nothing


async def test_json_patch_test_ops_and_stale_resource_versions_are_rejected(api):
    _, s = api
    _, obj = await send(s, "POST", DEPLOY, deployment("a"))
    rv = obj["metadata"]["resourceVersion"]
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/metadata/finalizers", "value": ["x"]},
    ]
    code, obj = await send(s, "PATCH", DEPLOY + "/a", ops, JSON_PATCH)
    assert code == 200 and obj["metadata"]["finalizers"] == ["x"]
    code, status = await send(s, "PATCH", DEPLOY + "/a", ops, JSON_PATCH)
    assert code == 422 and status["kind"] == "Status"
    code, _ = await send(
        s, "PATCH", DEPLOY + "/a", {"metadata": {"resourceVersion": rv}, "spec": {"replicas": 5}}, MERGE
    )
    assert code == 409
    code, _ = await send(s, "PATCH", DEPLOY + "/a", {"spec": {}}, {"Content-Type": "application/apply-patch+yaml"})
    assert code == 415


async def test_put_replaces_and_checks_the_resource_version(api):
    _, s = api
    _, obj = await send(s, "POST", DEPLOY, deployment("a"))
    obj["spec"]["replicas"] = 4
    code, put = await send(s, "PUT", DEPLOY + "/a", obj)
    assert code == 200 and put["spec"]["replicas"] == 4 and put["metadata"]["generation"] == 2
    assert (await send(s, "PUT", DEPLOY + "/a", obj))[0] == 409


async def test_finalizers_hold_deletion_until_removed(api):
    emulator, s = api
    await send(s, "POST", DEPLOY, {**deployment("a"), "metadata": {"name": "a", "finalizers": ["f"]}})
    code, obj = await send(s, "DELETE", DEPLOY + "/a")
    assert code == 200 and obj["metadata"]["deletionTimestamp"]
    await send(s, "PATCH", DEPLOY + "/a", {"metadata": {"finalizers": None}}, MERGE)
    assert (await send(s, "GET", DEPLOY + "/a"))[0] == 404


async def test_list_and_watch_filter_by_labels_and_fields_and_watch_times_out(api):
    emulator, s = api
    await send(s, "POST", DEPLOY, deployment("a", {"tier": "gpu"}))
    await send(s, "POST", DEPLOY, deployment("b", {"tier": "cpu"}))
    _, listed = await send(s, "GET", DEPLOY + "?labelSelector=tier%20in%20(gpu,tpu)")
    assert [o["metadata"]["name"] for o in listed["items"]] == ["a"]
    _, listed = await send(s, "GET", DEPLOY + "?fieldSelector=metadata.name!%3Da")
    assert [o["metadata"]["name"] for o in listed["items"]] == ["b"]
    assert (await send(s, "GET", DEPLOY + "?fieldSelector=spec.replicas%3D1"))[0] == 400
    since = listed["metadata"]["resourceVersion"]

    async def watch():
        async with s.get(
            f"{DEPLOY.lstrip('/')}?watch=true&resourceVersion={since}&labelSelector=tier%3Dgpu&timeoutSeconds=1"
        ) as r:
            return [json.loads(line) for line in (await r.text()).splitlines()]

    watcher = asyncio.create_task(watch())
    await eventually(lambda: emulator.received("watch", "deployments"))  # open: the patches reach it as they happen
    await send(s, "PATCH", DEPLOY + "/b", {"spec": {"replicas": 3}}, MERGE)
    await send(s, "PATCH", DEPLOY + "/a", {"spec": {"replicas": 3}}, MERGE)
    events = await asyncio.wait_for(watcher, 5)  # ends by itself after timeoutSeconds
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("MODIFIED", "a")]


async def test_scale_subresource_reads_and_writes_replicas(api):
    _, s = api
    await send(s, "POST", ISVC, {"metadata": {"name": "m"}, "spec": {"replicas": 1}})
    await send(s, "PATCH", ISVC + "/m/status", {"status": {"replicas": 1, "selector": "app=m"}}, MERGE)
    _, scale = await send(s, "GET", ISVC + "/m/scale")
    assert scale["kind"] == "Scale" and scale["spec"] == {"replicas": 1}
    assert scale["status"] == {"replicas": 1, "selector": "app=m"}
    _, scale = await send(s, "PATCH", ISVC + "/m/scale", {"spec": {"replicas": 3}}, MERGE)
    assert scale["spec"]["replicas"] == 3
    _, obj = await send(s, "GET", ISVC + "/m")
    assert obj["spec"]["replicas"] == 3 and obj["metadata"]["generation"] == 2


async def test_the_authorizer_answers_403_per_verb_resource_namespace_and_subresource(api):
    emulator, s = api
    seen = []

    def authorizer(access: Access) -> bool:
        seen.append(access)
        return not (access.resource == "inferenceservices" and access.subresource == "status")

    emulator.authorizer = authorizer
    assert (await send(s, "POST", ISVC, {"metadata": {"name": "m"}, "spec": {}}))[0] == 201
    code, status = await send(s, "PATCH", ISVC + "/m/status", {"status": {"phase": "Ready"}}, MERGE)
    assert code == 403 and status["reason"] == "Forbidden" and "inferenceservices" in status["message"]
    assert seen[-1] == Access("patch", "serving.pagedinfer.dev", "inferenceservices", "default", "m", "status")


async def test_faults_answer_a_status_a_limited_number_of_times(api):
    emulator, s = api
    emulator.faults.append(Fault(verb="list", resource="deployments", status=503, times=2))
    assert [(await send(s, "GET", DEPLOY))[0] for _ in range(3)] == [503, 503, 200]
    assert emulator.count("list", "deployments") == 3


def test_label_selector_grammar():
    assert label_selector("a=b,!c,d notin (x, y),e")({"a": "b", "d": "z", "e": ""})
    assert not label_selector("a!=b")({"a": "b"})
    assert label_selector("")({})


@pytest.mark.parametrize(
    "written, stored",
    [
        ("0.5", "500m"),
        ("2000m", "2"),
        ("1500m", "1500m"),
        ("1024Mi", "1Gi"),
        ("1.5Gi", "1536Mi"),
        ("0.5Gi", "512Mi"),
        ("1000Mi", "1000Mi"),
        ("1000k", "1M"),
        ("512", "512"),
        ("0.0001", "1m"),
        ("2 GiB", "2 GiB"),
    ],
)
def test_quantities_are_stored_in_the_api_servers_canonical_form(written, stored):
    assert canonical_quantity(written) == stored


async def test_a_deployments_pod_template_is_stored_as_the_api_server_stores_it(api):
    _, s = api
    body = deployment("a")
    body["spec"]["template"] = {
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "x",
                    "env": [{"name": "EMPTY", "value": ""}, {"name": "SET", "value": "1"}],
                    "resources": {"requests": {"cpu": "0.5", "memory": "1024Mi"}, "limits": {"nvidia.com/gpu": "1"}},
                }
            ]
        }
    }
    _, obj = await send(s, "POST", DEPLOY, body)
    container = obj["spec"]["template"]["spec"]["containers"][0]
    assert container["env"] == [{"name": "EMPTY"}, {"name": "SET", "value": "1"}]
    assert container["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": "1"}}
    container["resources"] = {"limits": {"memory": "2048Mi"}}
    patch = {"spec": {"template": {"spec": {"containers": [container]}}}}
    _, obj = await send(s, "PATCH", DEPLOY + "/a", patch, MERGE)
    assert obj["spec"]["template"]["spec"]["containers"][0]["resources"] == {"limits": {"memory": "2Gi"}}


POD = "/api/v1/namespaces/default/pods"
STRATEGIC = {"Content-Type": "application/strategic-merge-patch+json"}


async def test_a_pod_with_a_readiness_gate_is_ready_only_once_its_condition_is_true_set_by_strategic_merge(api):
    _, s = api
    gate = "pagedinfer.io/warmed"
    pod = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c"}], "readinessGates": [{"conditionType": gate}]},
    }
    assert (await send(s, "POST", POD, pod))[0] == 201
    kubelet = {
        "status": {"conditions": [{"type": "ContainersReady", "status": "True"}, {"type": "Ready", "status": "True"}]}
    }
    _, obj = await send(s, "PATCH", POD + "/p/status", kubelet, MERGE)
    ready = lambda o: {c["type"]: c["status"] for c in o["status"]["conditions"]}["Ready"]  # noqa: E731
    assert ready(obj) == "False"  # the containers are ready, the gate is not
    opened = {"status": {"conditions": [{"type": gate, "status": "True", "reason": "Warmed"}]}}
    code, obj = await send(s, "PATCH", POD + "/p/status", opened, STRATEGIC)
    assert code == 200 and ready(obj) == "True"
    assert {c["type"] for c in obj["status"]["conditions"]} == {"ContainersReady", "Ready", gate}  # merged by type
    lost = {"status": {"conditions": [{"type": "ContainersReady", "status": "False"}]}}
    _, obj = await send(s, "PATCH", POD + "/p/status", lost, STRATEGIC)
    assert ready(obj) == "False"  # the gate alone does not make it ready
    code, _ = await send(s, "PATCH", POD + "/p/status", {"status": {"conditions": [{"status": "True"}]}}, STRATEGIC)
    assert code == 422  # an item of a list merged by type must name its type


async def test_a_watch_cancelled_while_it_takes_the_lock_back_waits_for_it_and_leaves_it_free():
    """A watch's wait for a change, cancelled twice (the server's shutdown, then asyncio.run's) while another
    holder has the emulator's lock: it ends only after that holder released it, and leaves it free. (With
    asyncio.wait_for on Python 3.11 the watch ended at once, released the other holder's lock, which then
    failed with 'Lock is not acquired', and the orphaned wait took the lock for good: every later write hung.)"""
    changed, entered, order = asyncio.Condition(), asyncio.Event(), []

    async def watch():
        try:
            async with changed:
                entered.set()
                await wait_changed(changed, 3600)
        finally:
            order.append("watch out")

    task = asyncio.create_task(watch())
    await entered.wait()
    await changed.acquire()  # another holder (a write, another watch taking the lock back)
    changed.notify_all()  # the watch wakes and queues for the lock
    task.cancel()
    for _ in range(5):
        await asyncio.sleep(0)  # let it handle the first cancellation
    task.cancel()
    await asyncio.sleep(0)
    order.append("holder released")
    changed.release()  # raised RuntimeError before: the watch had released it
    await asyncio.wait([task])
    for _ in range(5):
        await asyncio.sleep(0)  # an orphaned wait would take the lock here
    assert order == ["holder released", "watch out"] and task.cancelled()
    assert not changed.locked()
