"""A misspelt field never reaches the operator: the API server prunes it, or refuses it under Strict.

`kubectl apply --validate=strict` (kubectl's default) sends fieldValidation=Strict: a manifest with
`spec.modle` is refused with 400 naming the field, and nothing is created. A client that sends no
directive gets the server's default, Warn: the field is dropped with a `Warning` header, and the
operator, which never sees it, serves the spec without it (here: the embedded model).
"""

import json

import aiohttp
import pytest

from pagedinfer.testing.operator_harness import (
    DEPLOYMENTS,
    condition,
    eventually,
    inference_service,
    isvc_of,
    running_operator,
    serving_emulator,
    write_kubeconfig,
)

pytestmark = pytest.mark.timeout(120)
PATH = "apis/serving.pagedinfer.dev/v1alpha1/namespaces/default/inferenceservices"
MISSPELT = {"modle": {"uri": "hf://meta-llama/Meta-Llama-3-8B-Instruct"}, "resources": {"gpus": 0}}


@pytest.fixture
async def api(tmp_path, monkeypatch):
    async with serving_emulator() as (emulator, url), aiohttp.ClientSession(base_url=url + "/") as session:
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", url)))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield emulator, session


async def apply(session, body, validation=None):
    params = {"fieldValidation": validation} if validation else {}
    async with session.post(
        PATH, data=json.dumps(body), params=params, headers={"Content-Type": "application/json"}
    ) as r:
        return r.status, await r.json(), r.headers.getall("Warning", [])


async def test_strict_refuses_a_misspelt_field_and_warn_drops_it_before_the_operator_sees_it(api):
    emulator, session = api
    async with running_operator():
        code, status, _ = await apply(session, inference_service("strict", MISSPELT), "Strict")
        assert code == 400 and 'unknown field "spec.modle"' in status["message"]
        code, _, warnings = await apply(session, inference_service("lenient", MISSPELT))
        assert code == 201 and warnings == ['299 - "unknown field \\"spec.modle\\""']
        await eventually(lambda: emulator.read(DEPLOYMENTS, "default", "lenient"))
        assert condition(isvc_of(emulator, "lenient"), "Valid")["status"] == "True"
        assert "modle" not in isvc_of(emulator, "lenient")["spec"]
        assert isvc_of(emulator, "strict") is None and emulator.read(DEPLOYMENTS, "default", "strict") is None
        assert emulator.count("create", "inferenceservices") == 2
