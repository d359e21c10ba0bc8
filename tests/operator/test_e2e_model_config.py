"""A bad model config in a ConfigMap is reported, counted and waited on, never retried in a loop.

Sized=False ModelConfigInvalid names the field and the value, a Warning Event says the same, the
reconcile error is counted (the chart's alert fires on that counter), no Deployment is made, and
the operator does not retry on its own: fixing the ConfigMap (or the spec) sizes the service.
"""

import dataclasses
import json
import logging

import pytest

from pagedinfer.testing.operator_harness import (
    CONFIGMAPS,
    DEPLOYMENTS,
    EVENTS,
    FAST_CONFIG,
    ISVC,
    condition,
    eventually,
    inference_service,
    isvc_of,
    logged,
    reconciles,
    reconciles_once_handled,
    running_operator,
)

pytestmark = pytest.mark.timeout(120)

GOOD = {
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}
SPEC = {
    "model": {"uri": "pvc://models/llama", "configMapRef": {"name": "llama-config"}},
    "resources": {"gpuMemory": "80Gi"},
}


def config_map(text: str) -> dict:
    return {"metadata": {"name": "llama-config", "namespace": "default"}, "data": {"config.json": text}}


def model_config_errors(runtime) -> float:
    return runtime.metrics.errors.labels(reason="model_config_invalid")._value.get()


def warnings(emulator) -> list[str]:
    return [e["message"] for e in emulator.read_all(EVENTS) if e.get("reason") == "ModelConfigInvalid"]


@pytest.mark.parametrize(
    "text, named",
    [
        (
            json.dumps({**GOOD, "num_attention_heads": 0}),
            "num_attention_heads must be an integer from 1 to 65536, got 0",
        ),
        (json.dumps([GOOD]), "config.json must hold a JSON object, got 'list'"),
        (json.dumps({**GOOD, "head_dim": [1]}), "head_dim must be an integer from 1 to 65536, got [1]"),
        (
            json.dumps(GOOD)[:-1] + ', "max_position_embeddings": 1e400}',
            "max_position_embeddings must be an integer from 1 to 4294967296, got inf",
        ),
        ("{not json", "is not JSON"),
    ],
)
async def test_a_bad_config_map_is_named_counted_and_fixed_by_editing_it(emulator, text, named):
    await emulator.create(CONFIGMAPS, config_map(text))
    async with running_operator() as runtime:
        await emulator.create(ISVC, inference_service("llama", SPEC))
        sized = await eventually(
            lambda: condition(isvc_of(emulator), "Sized")["status"] == "False" and condition(isvc_of(emulator), "Sized")
        )
        assert sized["reason"] == "ModelConfigInvalid" and named in sized["message"], sized
        assert "ConfigMap llama-config" in sized["message"]
        assert isvc_of(emulator)["status"]["phase"] == "Failed"
        await eventually(lambda: any(named in message for message in warnings(emulator)))
        assert model_config_errors(runtime) == 1
        assert emulator.read(DEPLOYMENTS, "default", "llama") is None
        # No retry of its own: kopf records the spec as handled (its last-handled-configuration) only once
        # no retry is due; a TemporaryError would keep the retry pending and never write it.
        await reconciles_once_handled(emulator, runtime)
        assert model_config_errors(runtime) == 1

        await emulator.merge(CONFIGMAPS, "default", "llama-config", {"data": {"config.json": json.dumps(GOOD)}})
        await eventually(lambda: condition(isvc_of(emulator), "Sized")["status"] == "True")
        assert isvc_of(emulator)["status"]["kvCache"]["bytesPerToken"] == 128 * 1024
        assert emulator.read(DEPLOYMENTS, "default", "llama") is not None
        assert model_config_errors(runtime) == 1


async def test_a_config_map_created_after_the_service_sizes_it(emulator):
    """ModelConfigUnavailable (no ConfigMap yet) is sized as soon as the ConfigMap appears, not at the next
    retry (set here far beyond the test's timeout)."""
    async with running_operator(dataclasses.replace(FAST_CONFIG, no_nodes_retry_seconds=3600)):
        await emulator.create(ISVC, inference_service("llama", SPEC))
        await eventually(lambda: condition(isvc_of(emulator), "Sized")["reason"] == "ModelConfigUnavailable")
        await emulator.create(CONFIGMAPS, config_map(json.dumps(GOOD)))
        await eventually(lambda: condition(isvc_of(emulator), "Sized")["status"] == "True")


async def test_a_spec_change_also_retries_a_bad_config(emulator):
    await emulator.create(CONFIGMAPS, config_map(json.dumps({**GOOD, "num_hidden_layers": -3})))
    async with running_operator():
        await emulator.create(ISVC, inference_service("llama", SPEC))
        await eventually(lambda: condition(isvc_of(emulator), "Sized")["reason"] == "ModelConfigInvalid")
        fixed = {
            "model": {
                "uri": "pvc://models/llama",
                "configMapRef": None,
                "architecture": {"numLayers": 32, "numKVHeads": 8, "headDim": 128, "numParameters": 8_030_261_248},
            }
        }
        await emulator.merge(ISVC, "default", "llama", {"spec": fixed})
        await eventually(lambda: condition(isvc_of(emulator), "Sized")["status"] == "True")


async def test_config_maps_nobody_references_cost_no_reconcile(emulator, caplog):
    caplog.set_level(logging.DEBUG, logger="kopf.objects")
    await emulator.create(CONFIGMAPS, config_map(json.dumps(GOOD)))
    async with running_operator() as runtime:
        await emulator.create(ISVC, inference_service("llama", SPEC))
        await eventually(lambda: condition(isvc_of(emulator), "Sized")["status"] == "True")
        done = await reconciles_once_handled(emulator, runtime)
        handled = "Handler 'config_map_event' succeeded"
        listed = logged(caplog.records, "llama-config", handled)  # kopf's listing at start: event type None
        await emulator.create(
            CONFIGMAPS, {"metadata": {"name": "other", "namespace": "default"}, "data": {"config.json": "{}"}}
        )
        await emulator.merge(CONFIGMAPS, "default", "llama-config", {"metadata": {"labels": {"a": "b"}}})
        # both events handled: the unreferenced one filtered out (the filter says so), the other one's handler done
        await eventually(lambda: logged(caplog.records, "other", "its event is not handled"))
        await eventually(lambda: logged(caplog.records, "llama-config", handled) > listed)
        assert reconciles(runtime) == done + 1  # the referenced one only


async def test_a_tensor_parallel_size_the_configs_heads_do_not_divide_is_an_invalid_spec(emulator):
    """The CRD cannot see a ConfigMap's head counts: the operator says Valid=False once it reads them."""
    await emulator.create(CONFIGMAPS, config_map(json.dumps({**GOOD, "num_key_value_heads": 2})))
    async with running_operator():
        await emulator.create(
            ISVC,
            inference_service(
                "llama", {**SPEC, "engine": {"tensorParallelSize": 4}, "resources": {"gpuMemory": "80Gi"}}
            ),
        )
        valid = await eventually(
            lambda: condition(isvc_of(emulator), "Valid")["status"] == "False" and condition(isvc_of(emulator), "Valid")
        )
        assert valid["reason"] == "InvalidSpec"
        assert "spec.engine.tensorParallelSize: 4 does not divide the model's 2 KV heads" in valid["message"]
        assert emulator.read(DEPLOYMENTS, "default", "llama") is None
        await emulator.merge(ISVC, "default", "llama", {"spec": {"engine": {"tensorParallelSize": 2}}})
        await eventually(lambda: condition(isvc_of(emulator), "Sized")["status"] == "True")
        assert condition(isvc_of(emulator), "Valid")["status"] == "True"
