"""The CRD is a valid Kubernetes object, its schema admits the examples, and its defaults are parse_spec's."""

import dataclasses
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from pagedinfer.contracts.config.engine_config import EngineConfig
from pagedinfer.contracts.config.options import field_default, flag_fields, managed_flags
from pagedinfer.contracts.config.serve_args import ServeArgs
from pagedinfer.contracts.inference_service import API_GROUP, API_VERSION, KIND, PLURAL
from pagedinfer.operator.kv_plan import planning
from pagedinfer.operator.spec.crd_model import DTYPES, MANAGED_FLAGS, EngineSpec
from pagedinfer.operator.spec.parser import parse_spec
from pagedinfer.operator.status import conditions

REPO = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((REPO / "crds" / "inferenceservices.yaml").read_text())
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def validator():
    return jsonschema.Draft4Validator(SCHEMA)


@pytest.mark.parametrize("version", ["1.28.0", "1.30.0", kubernetes_validate.latest_version()])
def test_the_crd_manifest_validates(version):
    kubernetes_validate.validate(CRD, version, strict=True)


def test_names_scale_subresource_and_printer_columns():
    names = CRD["spec"]["names"]
    assert (CRD["spec"]["group"], names["kind"], names["plural"]) == (API_GROUP, KIND, PLURAL)
    assert "isvc" not in names["shortNames"]
    assert VERSION["name"] == API_VERSION
    assert VERSION["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    columns = [c["name"] for c in VERSION["additionalPrinterColumns"]]
    assert {"Ready", "Replicas", "KV blocks", "Max tokens", "Age"} <= set(columns)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate_against_the_schema_and_the_operator(path):
    doc = yaml.safe_load(path.read_text())
    validator().validate(doc)
    parse_spec(doc["metadata"]["name"], doc["spec"])


def test_the_readme_inference_service_validates_against_the_schema_and_the_operator():
    blocks = re.findall(r"```yaml\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    (doc,) = [d for d in map(yaml.safe_load, blocks) if isinstance(d, dict) and d.get("kind") == "InferenceService"]
    validator().validate(doc)
    parse_spec(doc["metadata"]["name"], doc["spec"])


def test_the_schema_rejects_what_the_operator_rejects():
    bad = {
        "apiVersion": "serving.pagedinfer.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "x"},
        "spec": {"engine": {"blockSize": 24}},
    }
    with pytest.raises(jsonschema.ValidationError):
        validator().validate(bad)
    bad["spec"] = {"engine": {"gpuMemoryUtilization": 0}}
    with pytest.raises(jsonschema.ValidationError):
        validator().validate(bad)


def test_schema_defaults_equal_the_operators_defaults():
    engine = SCHEMA["properties"]["spec"]["properties"]["engine"]["properties"]
    defaults = EngineSpec()
    for field, attr in [
        ("blockSize", "block_size"),
        ("gpuMemoryUtilization", "gpu_memory_utilization"),
        ("maxNumSeqs", "max_num_seqs"),
        ("maxNumBatchedTokens", "max_num_batched_tokens"),
        ("enablePrefixCaching", "enable_prefix_caching"),
        ("enableChunkedPrefill", "enable_chunked_prefill"),
        ("swapSpaceGiB", "swap_space_gib"),
        ("tensorParallelSize", "tensor_parallel_size"),
    ]:
        assert engine[field]["default"] == getattr(defaults, attr), field
    # image has no schema default: the operator picks its CPU or CUDA engine image by resources.gpus
    assert "default" not in engine["image"] and defaults.image is None
    spec = SCHEMA["properties"]["spec"]["properties"]
    # gpus has no schema default: the operator defaults it to engine.tensorParallelSize (one GPU per rank)
    assert "default" not in spec["resources"]["properties"]["gpus"]
    assert parse_spec("x", {}).resources.gpus == engine["tensorParallelSize"]["default"]
    assert spec["replicas"]["default"] == parse_spec("x", {}).replicas


def test_every_cel_rule_has_an_operator_check():
    rules = []

    def walk(node):
        if isinstance(node, dict):
            rules.extend(r["message"] for r in node.get("x-kubernetes-validations", []))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(SCHEMA)
    violations = {
        "minReplicas must be <= maxReplicas": {"minReplicas": 2, "maxReplicas": 1},
        "maxReplicas is required when autoscaling.enabled is true": {
            "autoscaling": {"enabled": True, "metrics": [{"name": "kvCacheUsage", "target": 0.5}]}
        },
        "engine.tensorParallelSize must be 1 when resources.gpus is 0 (CPU engine)": {
            "resources": {"gpus": 0},
            "engine": {"tensorParallelSize": 2},
        },
        "resources.gpus must equal engine.tensorParallelSize (one GPU per rank; leave gpus unset to default to it)": {
            "resources": {"gpus": 1},
            "engine": {"tensorParallelSize": 2},
        },
        "engine.tensorParallelSize must divide model.architecture.numKVHeads": {
            "engine": {"tensorParallelSize": 4},
            "model": {"architecture": {"numLayers": 1, "numKVHeads": 2, "headDim": 8, "numParameters": 1}},
        },
        "set at most one of architecture and configMapRef": {
            "model": {
                "architecture": {"numLayers": 1, "numKVHeads": 8, "headDim": 8, "numParameters": 1},
                "configMapRef": {"name": "c"},
            }
        },
        "maxNumBatchedTokens must be >= maxNumSeqs": {"engine": {"maxNumSeqs": 300, "maxNumBatchedTokens": 200}},
        "maxNumBatchedTokens must be >= maxModelLen when enableChunkedPrefill is false": {
            "engine": {"enableChunkedPrefill": False, "maxModelLen": 4096}
        },
        "extraArgs may not set or abbreviate a flag the operator sets from the spec": {
            "engine": {"extraArgs": ["--api-k", "x"]}
        },
        "this variable is set by the operator": {"engine": {"env": [{"name": "HF_HOME", "value": "/x"}]}},
        "an hf:// model needs allowDownload: true or cacheClaimName (with neither, the pods run offline over an "
        "empty cache)": {"model": {"uri": "hf://a/b", "allowDownload": False}},
        "hfTokenSecretRef is for hf:// models only": {"model": {"uri": "pvc://c/m", "hfTokenSecretRef": {"name": "t"}}},
        "engine.env may not set HF_TOKEN when model.hfTokenSecretRef is set": {
            "model": {"uri": "hf://a/b", "allowDownload": True, "hfTokenSecretRef": {"name": "t"}},
            "engine": {"env": [{"name": "HF_TOKEN", "value": "v"}]},
        },
        "autoscaling.metrics may list prefixCacheHitRate only with engine.enablePrefixCaching: true (with it off "
        "the hit rate is always 0)": {
            "engine": {"enablePrefixCaching": False},
            "autoscaling": {
                "metrics": [{"name": "kvCacheUsage", "target": 0.8}, {"name": "prefixCacheHitRate", "target": 0.5}]
            },
        },
        "minReplicas 0 needs the router (router.enabled; default on only when maxReplicas > 1): nothing else could"
        " hold the requests while no engine runs": {"minReplicas": 0, "maxReplicas": 1},
        "autoscaling.idle and autoscaling.standby need minReplicas: 0": {
            "minReplicas": 1,
            "maxReplicas": 2,
            "autoscaling": {"idle": {"afterSeconds": 60}},
        },
        "autoscaling.standby must be <= maxReplicas": {
            "minReplicas": 0,
            "maxReplicas": 2,
            "autoscaling": {"standby": 3},
        },
        "autoscaling.standby cannot be used with engine.apiKeySecretRef (the engines' POST /sleep needs their key,"
        " which the operator never reads)": {
            "minReplicas": 0,
            "maxReplicas": 2,
            "autoscaling": {"standby": 1},
            "engine": {"apiKeySecretRef": {"name": "key"}},
        },
        "source.url is required when source.type is prometheus": None,  # the autoscaler parses spec.autoscaling
        "prefixCacheHitRate needs kvCacheUsage listed too": None,  # (test_autoscaling_spec.py)
    }
    name_rule = "metadata.name must be at most 47 characters (the engine pods' names derive from it)"
    assert set(rules) == set(violations) | {name_rule}
    for _message, spec in violations.items():
        if spec is not None:
            with pytest.raises(ValueError):
                parse_spec("x", spec)
    with pytest.raises(ValueError):
        parse_spec("x" * 48, {})


def test_the_status_schema_holds_every_kv_cache_field_and_source():
    kv_cache = SCHEMA["properties"]["status"]["properties"]["kvCache"]["properties"]
    assert set(kv_cache["source"]["enum"]) == set(conditions.SIZED_REASONS)
    fields = {field.name for field in dataclasses.fields(planning.KVCachePlan)}
    full = planning.KVCachePlan(**{name: 1 for name in fields}).to_status()
    assert set(full) | {"maxTokens"} == set(kv_cache)


def test_the_extra_args_rule_lists_the_operators_managed_flags():
    engine = SCHEMA["properties"]["spec"]["properties"]["engine"]["properties"]
    (rule,) = [v["rule"] for v in engine["extraArgs"]["x-kubernetes-validations"]]
    listed = re.fullmatch(
        r"self\.all\(a, !a\.startsWith\('--'\) \|\| !\[(.*)\]\.exists\(f, "
        r"f\.startsWith\(a\.split\('='\)\[0\]\)\)\)",
        rule,
    )
    assert listed, rule
    derived = managed_flags(EngineConfig, ServeArgs)
    expected = ", ".join(f"'{flag}'" for flag in derived)
    assert tuple(re.findall(r"'([^']*)'", listed.group(1))) == MANAGED_FLAGS == derived, (
        f"the CEL list must be the flags marked managed, in order: [{expected}]"
    )


def test_the_crds_engine_defaults_are_the_engines_own():
    """spec.engine's defaults (and spec.model.dtype's) are EngineConfig's, the options' one definition."""
    spec = SCHEMA["properties"]["spec"]["properties"]
    engine = spec["engine"]["properties"]
    for field, option in [
        ("blockSize", "block_size"),
        ("gpuMemoryUtilization", "gpu_memory_utilization"),
        ("maxNumSeqs", "max_num_seqs"),
        ("maxNumBatchedTokens", "max_num_batched_tokens"),
        ("enablePrefixCaching", "enable_prefix_caching"),
        ("enableChunkedPrefill", "enable_chunked_prefill"),
        ("swapSpaceGiB", "swap_space"),
        ("tensorParallelSize", "tensor_parallel_size"),
    ]:
        assert engine[field]["default"] == field_default(EngineConfig, option), field
    dtype = spec["model"]["properties"]["dtype"]
    assert dtype["default"] == field_default(EngineConfig, "dtype")
    (dtype_flag,) = [flag for f, flag in flag_fields(EngineConfig) if f.name == "dtype"]
    assert set(dtype["enum"]) == set(dtype_flag.choices) == set(DTYPES)


def test_only_kubernetes_types_preserve_unknown_fields():
    """The API server prunes what the schema does not name (a misspelt field is dropped, or refused by
    `kubectl apply --validate=strict`); only subtrees that hold a Kubernetes type the CRD does not spell
    out keep everything: a typo inside one of our own objects must never survive."""
    preserving = []

    def walk(node, path):
        if node.get("x-kubernetes-preserve-unknown-fields"):
            preserving.append(path)
        for key, child in (node.get("properties") or {}).items():
            walk(child, f"{path}.{key}" if path else key)
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")

    walk(SCHEMA, "")
    assert preserving == ["spec.engine.env[].valueFrom", "spec.affinity"]
