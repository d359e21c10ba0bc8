"""InferenceServices are pruned by the CRD's structural schema, and `fieldValidation` is honoured (over HTTP).

As kube-apiserver: a field the schema does not name is dropped before it is stored; `Strict` refuses
the request with 400 naming every such field, `Warn` (the default) answers with one `Warning` header
each, `Ignore` says nothing. `x-kubernetes-preserve-unknown-fields` subtrees keep what they hold.
"""

import json

import aiohttp
import pytest

from pagedinfer.testing.kube_emulator_schema import crd_schema, prune
from pagedinfer.testing.operator_harness import ISVC as ISVC_RESOURCE
from pagedinfer.testing.operator_harness import serving_emulator

pytestmark = pytest.mark.timeout(30)
ISVC = "/apis/serving.pagedinfer.dev/v1alpha1/namespaces/default/inferenceservices"
MERGE = {"Content-Type": "application/merge-patch+json"}
JSON_PATCH = {"Content-Type": "application/json-patch+json"}


@pytest.fixture
async def api():
    async with serving_emulator() as (emulator, url), aiohttp.ClientSession(base_url=url + "/") as session:
        yield emulator, session


async def send(session, method, path, body, headers=None, validation=None):
    params = {"fieldValidation": validation} if validation else {}
    async with session.request(
        method,
        path.lstrip("/"),
        data=json.dumps(body),
        params=params,
        headers=headers or {"Content-Type": "application/json"},
    ) as r:
        return r.status, await r.json(), r.headers.getall("Warning", [])


def misspelt(name="typo"):
    return {
        "apiVersion": "serving.pagedinfer.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {"modle": {"uri": "hf://a/b"}, "replicas": 1},
    }


async def test_a_misspelt_field_is_pruned_and_warned_about_by_default(api):
    emulator, s = api
    code, obj, warnings = await send(s, "POST", ISVC, misspelt())
    assert code == 201 and obj["spec"] == {"replicas": 1}
    assert warnings == ['299 - "unknown field \\"spec.modle\\""']
    assert emulator.read(ISVC_RESOURCE, "default", "typo")["spec"] == {"replicas": 1}


async def test_strict_field_validation_refuses_unknown_fields_with_400_naming_each(api):
    emulator, s = api
    body = misspelt()
    body["spec"]["engine"] = {"blockSize": 16, "gpuMemoryUtilisation": 0.8}
    code, status, _ = await send(s, "POST", ISVC, body, validation="Strict")
    assert code == 400 and status["reason"] == "BadRequest"
    assert status["message"] == (
        'InferenceService in version "v1alpha1" cannot be handled as a InferenceService: '
        'strict decoding error: unknown field "spec.modle", '
        'unknown field "spec.engine.gpuMemoryUtilisation"'
    )
    assert emulator.read(ISVC_RESOURCE, "default", "typo") is None


async def test_ignore_prunes_silently_and_an_unknown_directive_is_a_bad_request(api):
    _, s = api
    code, obj, warnings = await send(s, "POST", ISVC, misspelt(), validation="Ignore")
    assert (code, obj["spec"], warnings) == (201, {"replicas": 1}, [])
    code, status, _ = await send(s, "POST", ISVC, misspelt("other"), validation="Loud")
    assert code == 400 and "fieldValidation" in status["message"]


async def test_updates_and_patches_are_pruned_and_validated_too(api):
    emulator, s = api
    await send(s, "POST", ISVC, {"metadata": {"name": "a"}, "spec": {"replicas": 1}})
    code, status, _ = await send(s, "PATCH", ISVC + "/a", {"spec": {"modle": {}}}, MERGE, validation="Strict")
    assert code == 400 and 'unknown field "spec.modle"' in status["message"]
    code, obj, warnings = await send(
        s,
        "PATCH",
        ISVC + "/a",
        [{"op": "add", "path": "/spec/tolerations", "value": [{"key": "k", "colour": "red"}]}],
        JSON_PATCH,
    )
    assert code == 200 and obj["spec"]["tolerations"] == [{"key": "k"}]
    assert warnings == ['299 - "unknown field \\"spec.tolerations[0].colour\\""']
    current = emulator.read(ISVC_RESOURCE, "default", "a")
    code, obj, _ = await send(s, "PUT", ISVC + "/a", {**current, "spec": {"replicas": 2, "replicaz": 3}})
    assert code == 200 and obj["spec"] == {"replicas": 2}
    code, obj, warnings = await send(
        s, "PATCH", ISVC + "/a/status", {"status": {"phase": "Ready", "mood": "ok"}}, MERGE
    )
    assert obj["status"] == {"phase": "Ready"} and warnings == ['299 - "unknown field \\"status.mood\\""']


def test_preserve_unknown_fields_subtrees_keep_everything_and_maps_keep_their_keys():
    schema = crd_schema()
    obj = {
        "apiVersion": "v",
        "kind": "k",
        "metadata": {"name": "x", "anything": 1},
        "spec": {
            "affinity": {"nodeAffinity": {"whatever": [1]}},
            "nodeSelector": {"gpu": "h100"},
            "engine": {"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}, "valu": "x"}]},
        },
        "extra": True,
    }
    dropped = prune(obj, schema)
    assert obj["spec"]["affinity"] == {"nodeAffinity": {"whatever": [1]}}
    assert obj["spec"]["nodeSelector"] == {"gpu": "h100"} and obj["metadata"]["anything"] == 1
    assert obj["spec"]["engine"]["env"] == [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    assert sorted(dropped) == ["extra", "spec.engine.env[0].valu"]
