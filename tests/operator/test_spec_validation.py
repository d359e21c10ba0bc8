"""parse_spec accepts what the CRD accepts, applies the CRD's defaults, and names every bad field."""

import pytest

from pagedinfer.operator.spec.crd_model import SpecError
from pagedinfer.operator.spec.parser import parse_model_uri, parse_spec, quantity_bytes

ARCH = {"numLayers": 32, "numKVHeads": 8, "headDim": 128, "numParameters": 8_030_261_248}


def test_an_empty_spec_gets_the_defaults():
    spec = parse_spec("tiny", {})
    assert spec.model.uri is None and spec.model.dtype == "auto"
    assert spec.engine.block_size == 16 and spec.engine.gpu_memory_utilization == 0.9
    assert spec.engine.max_num_seqs == 256 and spec.engine.max_num_batched_tokens == 2048
    assert spec.engine.enable_prefix_caching and spec.engine.enable_chunked_prefill
    assert spec.resources.gpus == 1 and spec.replicas == 1 and spec.engine.num_gpu_blocks_override is None


@pytest.mark.parametrize(
    "uri, field, value",
    [
        ("hf://meta-llama/Meta-Llama-3-8B", "repo_id", "meta-llama/Meta-Llama-3-8B"),
        ("pvc://models/llama/8b", "claim_name", "models"),
        ("pvc://models/llama/8b", "path", "llama/8b"),
        ("file:///data/llama", "path", "/data/llama"),
        ("s3://bucket/llama", "raw", "s3://bucket/llama"),
    ],
)
def test_model_uris_are_split_into_what_the_pod_needs(uri, field, value):
    assert getattr(parse_model_uri(uri), field) == value


@pytest.mark.parametrize(
    "uri",
    ["http://x/y", "hf://only-one-part", "pvc://Bad_Claim/x", "file://relative", "file:///a/../etc", "s3://", "llama"],
)
def test_bad_model_uris_are_rejected_with_the_expected_form(uri):
    with pytest.raises(SpecError, match=r"spec\.model\.uri"):
        parse_spec("x", {"model": {"uri": uri}})


@pytest.mark.parametrize(
    "spec, path",
    [
        ({"engine": {"blockSize": 24}}, "spec.engine.blockSize"),
        ({"engine": {"gpuMemoryUtilization": 0}}, "spec.engine.gpuMemoryUtilization"),
        ({"engine": {"gpuMemoryUtilization": 1.5}}, "spec.engine.gpuMemoryUtilization"),
        ({"engine": {"maxNumSeqs": 0}}, "spec.engine.maxNumSeqs"),
        ({"engine": {"maxNumSeqs": 512, "maxNumBatchedTokens": 256}}, "spec.engine.maxNumBatchedTokens"),
        ({"engine": {"enableChunkedPrefill": False, "maxModelLen": 8192}}, "spec.engine.maxNumBatchedTokens"),
        ({"engine": {"enablePrefixCaching": "yes"}}, "spec.engine.enablePrefixCaching"),
        ({"engine": {"swapSpaceGiB": -1}}, "spec.engine.swapSpaceGiB"),
        ({"engine": {"numGpuBlocksOverride": 0}}, "spec.engine.numGpuBlocksOverride"),
        ({"engine": {"extraArgs": ["--port=9000"]}}, "spec.engine.extraArgs"),
        ({"engine": {"extraArgs": ["--num-gpu-blocks-override", "5"]}}, "spec.engine.extraArgs"),
        ({"engine": {"extraArgs": ["--cpu-memory-budget=8GiB"]}}, "spec.engine.extraArgs"),
        ({"engine": {"env": [{"name": "PAGEDINFER_API_KEY", "value": "leak"}]}}, "spec.engine.env[0].name"),
        ({"engine": {"apiKeySecretRef": {"key": "k"}}}, "spec.engine.apiKeySecretRef.name"),
        ({"engine": {"tensorParallelSize": 2}, "resources": {"gpus": 0}}, "spec.engine.tensorParallelSize"),
        ({"engine": {"tensorParallelSize": 4}, "resources": {"gpus": 2}}, "spec.engine.tensorParallelSize"),
        ({"engine": {"tensorParallelSize": 1}, "resources": {"gpus": 2}}, "spec.engine.tensorParallelSize"),
        ({"engine": {"tensorParallelSize": 16}}, "spec.engine.tensorParallelSize"),
        (
            {"engine": {"tensorParallelSize": 2}, "model": {"architecture": {**ARCH, "numKVHeads": 1}}},
            "spec.engine.tensorParallelSize",
        ),
        ({"resources": {"gpus": -1}}, "spec.resources.gpus"),
        ({"resources": {"gpuMemory": "lots"}}, "spec.resources.gpuMemory"),
        ({"resources": {"cpu": "two"}}, "spec.resources.cpu"),
        ({"resources": {"memory": "2 GiB"}}, "spec.resources.memory"),
        ({"model": {"uri": "pvc://models/x", "hfTokenSecretRef": {"name": "t"}}}, "spec.model.hfTokenSecretRef"),
        (
            {"model": {"uri": "hf://a/b", "allowDownload": True, "hfTokenSecretRef": {"key": "k"}}},
            "spec.model.hfTokenSecretRef.name",
        ),
        (
            {
                "model": {"uri": "hf://a/b", "allowDownload": True, "hfTokenSecretRef": {"name": "t"}},
                "engine": {"env": [{"name": "HF_TOKEN", "value": "leak"}]},
            },
            "spec.engine.env[0].name",
        ),
        ({"model": {"dtype": "int4"}}, "spec.model.dtype"),
        ({"model": {"architecture": {"numLayers": 32}}}, "spec.model.architecture.numKVHeads"),
        ({"model": {"architecture": ARCH, "configMapRef": {"name": "c"}}}, "spec.model"),
        ({"minReplicas": 3, "maxReplicas": 2}, "spec.minReplicas"),
        ({"replicas": -1}, "spec.replicas"),
        ({"nodeSelector": {"a": 1}}, "spec.nodeSelector"),
        ({"tolerations": "all"}, "spec.tolerations"),
    ],
)
def test_each_invalid_field_is_named(spec, path):
    with pytest.raises(SpecError) as info:
        parse_spec("svc", spec)
    assert any(p.startswith(path) for p in info.value.problems), info.value.problems


def test_every_problem_is_reported_at_once():
    with pytest.raises(SpecError) as info:
        parse_spec("svc", {"engine": {"blockSize": 7, "maxNumSeqs": "many"}, "resources": {"gpus": "one"}})
    assert len(info.value.problems) == 3


@pytest.mark.parametrize("name", ["Upper", "1abc", "a" * 48, "has_underscore"])
def test_names_that_cannot_name_a_service_are_rejected(name):
    with pytest.raises(SpecError, match="metadata.name"):
        parse_spec(name, {})


def test_replicas_are_clamped_into_min_max_for_the_deployment():
    assert parse_spec("s", {"replicas": 9, "maxReplicas": 4}).effective_replicas == 4
    assert parse_spec("s", {"replicas": 0, "minReplicas": 1}).effective_replicas == 1
    assert parse_spec("s", {"replicas": 3}).effective_replicas == 3


def test_gpu_memory_accepts_kubernetes_and_byte_sizes():
    assert parse_spec("s", {"resources": {"gpuMemory": "80Gi"}}).resources.gpu_memory_bytes == 80 * 2**30
    assert parse_spec("s", {"resources": {"gpuMemory": "81559Mi"}}).resources.gpu_memory_bytes == 81559 * 2**20


@pytest.mark.parametrize(
    "quantity, size_bytes",
    [
        ("80Gi", 80 * 2**30),
        ("80G", 80 * 10**9),
        ("500M", 500 * 10**6),
        ("500Mi", 500 * 2**20),
        ("1.5Gi", 3 * 2**29),
        ("8000000k", 8 * 10**9),
        (85_899_345_920, 80 * 2**30),
    ],
)
def test_gpu_memory_is_a_kubernetes_quantity_as_resources_memory_is(quantity, size_bytes):
    assert parse_spec("s", {"resources": {"gpuMemory": quantity}}).resources.gpu_memory_bytes == size_bytes


@pytest.mark.parametrize(
    "quantity, says",
    [
        ("500m", "'500m' is 0.5 bytes, not a whole number of bytes (m is milli"),  # was 500 MB in the size grammar
        ("1.5", "'1.5' is 1.5 bytes"),
        ("80GiB", "write '80Gi'"),  # was accepted by the size grammar
        ("80 Gi", "not a Kubernetes quantity"),
        ("1e9", "not a Kubernetes quantity"),
        ("0", "more than 0"),
        ("2Pi", "at most 1Pi"),
        (True, "not a Kubernetes quantity"),
    ],
)
def test_gpu_memory_that_is_no_whole_byte_count_is_refused_naming_the_field(quantity, says):
    with pytest.raises(SpecError) as exc:
        parse_spec("s", {"resources": {"gpuMemory": quantity}})
    assert "spec.resources.gpuMemory: " in str(exc.value) and says in str(exc.value)


def test_memory_is_read_as_kubernetes_reads_a_quantity():
    assert quantity_bytes("2Gi") == 2 * 2**30 and quantity_bytes("1.5G") == 1_500_000_000
    assert quantity_bytes("512M") == 512 * 10**6 and quantity_bytes("3000000000") == 3_000_000_000
    assert quantity_bytes("1500m") == 2  # milli, rounded up to a whole byte
    assert parse_spec("s", {"resources": {"memory": "2.5Gi"}}).resources.memory_bytes == 5 * 2**29


def test_an_hf_model_that_can_neither_download_nor_read_a_cache_claim_is_refused():
    with pytest.raises(SpecError) as info:
        parse_spec("s", {"model": {"uri": "hf://meta-llama/Meta-Llama-3-8B-Instruct"}})
    (problem,) = info.value.problems
    assert problem.startswith("spec.model: hf://meta-llama/Meta-Llama-3-8B-Instruct needs allowDownload: true")
    assert "cacheClaimName" in problem and "HF_HUB_OFFLINE=1" in problem
    assert parse_spec("s", {"model": {"uri": "hf://a/b", "allowDownload": True}}).model.allow_download
    assert parse_spec("s", {"model": {"uri": "hf://a/b", "cacheClaimName": "hub"}}).model.cache_claim_name == "hub"


def test_an_hf_token_secret_is_a_reference_and_env_may_set_hf_token_without_one():
    spec = parse_spec("s", {"model": {"uri": "hf://a/b", "allowDownload": True, "hfTokenSecretRef": {"name": "t"}}})
    assert (spec.model.hf_token_secret_ref.name, spec.model.hf_token_secret_ref.key) == ("t", "token")
    env = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "mine", "key": "k"}}}]
    assert parse_spec("s", {"engine": {"env": env}}).engine.env[0]["name"] == "HF_TOKEN"


def test_tensor_parallelism_requests_one_gpu_per_rank_and_refuses_what_one_pod_cannot_run():
    # gpus defaults to N: the pod requests one GPU per rank
    spec = parse_spec("svc", {"engine": {"tensorParallelSize": 4}})
    assert (spec.engine.tensor_parallel_size, spec.resources.gpus) == (4, 4)
    assert parse_spec("svc", {"engine": {"tensorParallelSize": 2}, "resources": {"gpus": 2}}).resources.gpus == 2
    assert parse_spec("svc", {}).resources.gpus == 1
    with pytest.raises(SpecError, match=r"must equal spec.resources.gpus \(4\)"):
        parse_spec("svc", {"engine": {"tensorParallelSize": 2}, "resources": {"gpus": 4}})
    with pytest.raises(SpecError, match=r"must be one of \[1, 2, 4, 8\], got 3"):
        parse_spec("svc", {"engine": {"tensorParallelSize": 3}})


def test_extra_args_may_not_abbreviate_a_managed_flag_and_values_are_never_echoed():
    extra = [
        "--api-k",
        "sk-LITERAL",
        "--num-gpu-blocks=999999",
        "--served=other",
        "--seed",
        "7",
        "--api-key=sk-OTHER",
        "--revision=evil",
    ]
    with pytest.raises(SpecError) as info:
        parse_spec("svc", {"engine": {"extraArgs": extra}})
    problems = info.value.problems
    assert [p.split(":", 1)[0] for p in problems] == [f"spec.engine.extraArgs[{i}]" for i in (0, 2, 3, 6, 7)]
    assert "'--api-k' abbreviates --api-key" in problems[0]
    assert "'--num-gpu-blocks=...' abbreviates --num-gpu-blocks-override" in problems[1]
    assert "'--served=...' abbreviates --served-model-name" in problems[2]
    assert "'--api-key=...' is --api-key" in problems[3]
    assert not any(secret in str(info.value) for secret in ("sk-LITERAL", "sk-OTHER", "999999", "other", "evil"))


def test_extra_args_that_are_values_or_other_flags_pass():
    extra = ["--seed", "7", "--preemption-mode=swap", "--log-level", "debug", "--max-waiting-requests=8", "-x"]
    assert parse_spec("svc", {"engine": {"extraArgs": extra}}).engine.extra_args == tuple(extra)


def test_autoscaling_on_the_hit_rate_with_prefix_caching_off_is_invalid_and_names_both_fields():
    metrics = [{"name": "kvCacheUsage", "target": 0.8}, {"name": "prefixCacheHitRate", "target": 0.5}]
    with pytest.raises(SpecError) as caught:
        parse_spec(
            "x",
            {
                "engine": {"enablePrefixCaching": False},
                "autoscaling": {"enabled": True, "metrics": metrics},
                "maxReplicas": 4,
            },
        )
    (problem,) = caught.value.problems
    assert problem.startswith("spec.autoscaling.metrics: prefixCacheHitRate needs spec.engine.enablePrefixCaching")
    parse_spec("x", {"autoscaling": {"enabled": True, "metrics": metrics}, "maxReplicas": 4})


AUTOSCALING_ON = {"enabled": True, "metrics": [{"name": "kvCacheUsage", "target": 0.7}]}


@pytest.mark.parametrize(
    "spec, problem",
    [
        ({"autoscaling": AUTOSCALING_ON}, "spec.maxReplicas is required when spec.autoscaling.enabled is true"),
        (
            {"maxReplicas": 4, "autoscaling": {**AUTOSCALING_ON, "intervalSeconds": -1}},
            "spec.autoscaling.intervalSeconds must be positive, got -1",
        ),
        (
            {"maxReplicas": 4, "autoscaling": {"enabled": True}},
            "spec.autoscaling.metrics must list at least one metric",
        ),
        ({"maxReplicas": 4, "autoscaling": {**AUTOSCALING_ON, "source": {"type": "prometheus"}}}, "source.url"),
        (
            {"maxReplicas": 4, "autoscaling": {**AUTOSCALING_ON, "scaleDown": {"selectPolicy": "Fastest"}}},
            "spec.autoscaling.scaleDown.selectPolicy",
        ),
        ({"autoscaling": []}, "spec.autoscaling must be an object"),
    ],
)
def test_an_autoscaling_spec_the_autoscaler_refuses_is_invalid(spec, problem):
    with pytest.raises(SpecError) as info:
        parse_spec("svc", spec)
    assert any(problem in p for p in info.value.problems), info.value.problems


def test_every_problem_of_the_whole_spec_is_listed_at_once():
    spec = {
        "engine": {"blockSize": 24},
        "minReplicas": 3,
        "maxReplicas": 2,
        "autoscaling": {
            "enabled": "yes",
            "intervalSeconds": -1,
            "tolerance": 2,
            "scrapeConcurrency": 0,
            "metrics": [{"name": "cpu", "target": 0.5}, {"name": "kvCacheUsage", "target": 7}],
            "scaleUp": {
                "stabilizationWindowSeconds": -1,
                "policies": [{"type": "Nodes", "value": 0, "periodSeconds": 5}],
            },
        },
    }
    with pytest.raises(SpecError) as info:
        parse_spec("svc", spec)
    expected = [
        "spec.engine.blockSize",
        "spec.minReplicas",
        "spec.autoscaling.enabled",
        "intervalSeconds",
        "tolerance",
        "scrapeConcurrency",
        "metrics[0]",
        "metrics[1]",
        "scaleUp.stabilizationWindowSeconds",
        "scaleUp.policies[].type",
    ]
    for field in expected:
        assert sum(field in p for p in info.value.problems) >= 1, (field, info.value.problems)
    assert sum("maxReplicas" in p or "minReplicas" in p for p in info.value.problems) == 1  # named once
    assert not any("at least one metric" in p for p in info.value.problems)  # the bad ones are named instead


def test_a_valid_autoscaling_spec_is_parsed_once_for_the_reconciler():
    spec = parse_spec("svc", {"maxReplicas": 4, "autoscaling": AUTOSCALING_ON})
    assert spec.autoscaling.enabled and spec.autoscaling.max_replicas == 4
    assert parse_spec("svc", {}).autoscaling.enabled is False


@pytest.mark.parametrize(
    "key, value",
    [
        ("numLayers", 10_001),
        ("headDim", 2**16 + 1),
        ("numParameters", 10**15 + 1),
        ("maxPositionEmbeddings", 2**32 + 1),
    ],
)
def test_architecture_fields_have_the_bounds_of_the_config_fields_they_stand_for(key, value):
    """Beyond them sizing would refuse the shape; the spec is refused first, naming the field."""
    with pytest.raises(SpecError) as info:
        parse_spec("svc", {"model": {"architecture": {**ARCH, key: value}}})
    assert any(p.startswith(f"spec.model.architecture.{key}: must be <=") for p in info.value.problems)
