"""The built Deployment and Service are valid Kubernetes objects that run the sized engine safely."""

import kubernetes_validate
import pytest

from pagedinfer.operator.children import builders
from pagedinfer.operator.children.drift import SPEC_HASH_ANNOTATION, patch_for
from pagedinfer.operator.children.labels import selector_string
from pagedinfer.operator.kv_plan import planning
from pagedinfer.operator.routing import builders as routing_builders
from pagedinfer.operator.spec.crd_model import DEFAULT_CPU_IMAGE, DEFAULT_IMAGE, EngineImages, SpecError
from pagedinfer.operator.spec.parser import parse_spec

OWNER = builders.Owner(name="llama", namespace="serving", uid="0b7d4b3e-1111-2222-3333-444455556666", generation=3)
ARCH = {"numLayers": 32, "numKVHeads": 8, "headDim": 128, "numParameters": 8_030_261_248}
KUBERNETES_VERSIONS = ("1.28.0", "1.30.0", kubernetes_validate.latest_version())  # 1.28: the chart's floor

SPECS = {
    "hf": {
        "model": {
            "uri": "hf://meta-llama/Meta-Llama-3-8B",
            "architecture": ARCH,
            "cacheClaimName": "hf-cache",
            "hfTokenSecretRef": {"name": "hf-token"},
        },
        "engine": {
            "apiKeySecretRef": {"name": "key"},
            "env": [{"name": "LOG_LEVEL", "value": "debug"}],
            "extraArgs": ["--seed=7"],
        },
        "resources": {"gpus": 1, "cpu": "4", "memory": "32Gi", "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]
                }
            }
        },
    },
    "pvc": {
        "model": {"uri": "pvc://models/llama/8b", "architecture": ARCH, "cacheClaimName": "hf-cache"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    },
    "file": {
        "model": {"uri": "file:///models/llama", "architecture": ARCH},
        "engine": {"tensorParallelSize": 2},
        "resources": {"gpus": 2},
    },
    "override": {"model": {"uri": "pvc://models/llama", "architecture": ARCH}, "engine": {"numGpuBlocksOverride": 100}},
    "cpu": {
        "resources": {"gpus": 0},
        "engine": {"enablePrefixCaching": False, "enableChunkedPrefill": False, "maxModelLen": 512},
    },
}


def plan_of(spec):
    shape = planning.shape_from_architecture(spec.model.architecture, "auto") if spec.model.architecture else None
    if spec.resources.gpus == 0 or spec.engine.num_gpu_blocks_override:
        return planning.plan_for(spec, shape, None, "engine")
    return planning.plan_for(spec, shape, 81559 * 2**20, "node-labels")


def built(key):
    spec = parse_spec(OWNER.name, SPECS[key], allow_host_path_models=True)
    plan = plan_of(spec)
    return spec, plan, builders.build_deployment(OWNER, spec, plan), builders.build_service(OWNER)


def container(deployment):
    return deployment["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("key", sorted(SPECS))
def test_every_manifest_passes_strict_kubernetes_validation(key, version):
    _, _, deployment, service = built(key)
    for manifest in (
        deployment,
        service,
        {**deployment, **patch_for(deployment), "apiVersion": "apps/v1", "kind": "Deployment"},
    ):
        kubernetes_validate.validate(manifest, version, strict=True)


def test_the_engine_gets_the_sized_block_count_and_every_flag():
    spec, plan, deployment, _ = built("hf")
    args = container(deployment)["args"]
    assert container(deployment)["command"] == ["pagedinfer"] and args[0] == "serve"
    flags = dict(zip(args[1::2], args[2::2]))
    assert flags["--num-gpu-blocks-override"] == str(plan.num_gpu_blocks)
    assert flags["--model"] == "meta-llama/Meta-Llama-3-8B"
    assert flags["--host"] == "0.0.0.0" and flags["--port"] == "8000"
    assert flags["--served-model-name"] == "llama" and flags["--dtype"] == "auto"
    assert "--enable-prefix-caching" in args and "--enable-chunked-prefill" in args
    assert args[-1] == "--seed=7"
    cpu_args = container(built("cpu")[2])["args"]
    assert "--no-enable-prefix-caching" in cpu_args and "--no-enable-chunked-prefill" in cpu_args
    assert "--num-gpu-blocks-override" not in cpu_args and "--model" not in cpu_args


def test_a_cpu_engine_gets_the_pod_memory_its_kv_budget_was_derived_from():
    spec, plan, deployment, _ = built("cpu")  # spec.resources.memory unset: the default
    flags = dict(zip(container(deployment)["args"][1::2], container(deployment)["args"][2::2]))
    assert container(deployment)["resources"] == {"requests": {"memory": "3Gi"}, "limits": {"memory": "3Gi"}}
    assert int(flags["--cpu-memory-budget"]) == plan.cpu_memory_budget_bytes == 3 * 2**30 - 2**30
    spec = parse_spec("tiny", {"resources": {"gpus": 0, "cpu": "2", "memory": "2Gi"}})
    cpu = container(builders.build_deployment(OWNER, spec, plan_of(spec)))
    assert cpu["resources"] == {"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"memory": "2Gi"}}
    assert cpu["args"][cpu["args"].index("--cpu-memory-budget") + 1] == str(2**30)
    gpu_container = container(built("hf")[2])
    assert "--cpu-memory-budget" not in gpu_container["args"]
    assert gpu_container["resources"]["limits"] == {"memory": "32Gi", "nvidia.com/gpu": "1"}


def test_an_unset_engine_image_is_the_operators_image_for_the_pods_kind_and_a_set_one_wins():
    cpu, gpu = built("cpu"), built("hf")
    assert container(cpu[2])["image"] == DEFAULT_CPU_IMAGE == EngineImages().cpu  # gpus: 0: CPU torch, CPU kernels
    assert container(gpu[2])["image"] == DEFAULT_IMAGE == EngineImages().gpu  # gpus: 1: CUDA torch
    mine = EngineImages(gpu="registry.local/engine:cuda", cpu="registry.local/engine:cpu")
    assert container(builders.build_deployment(OWNER, cpu[0], cpu[1], mine))["image"] == "registry.local/engine:cpu"
    assert container(builders.build_deployment(OWNER, gpu[0], gpu[1], mine))["image"] == "registry.local/engine:cuda"
    own = parse_spec("tiny", {"resources": {"gpus": 0}, "engine": {"image": "registry.local/own:1"}})
    assert container(builders.build_deployment(OWNER, own, plan_of(own), mine))["image"] == "registry.local/own:1"
    with pytest.raises(SpecError, match=r"spec.engine.image"):
        parse_spec("tiny", {"engine": {"image": ""}})


def test_gpu_limits_port_probes_and_security_context():
    _, _, deployment, service = built("hf")
    c = container(deployment)
    pod = deployment["spec"]["template"]["spec"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] >= 1800
    assert {"readinessProbe", "livenessProbe"} <= set(c)
    assert c["securityContext"] == {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsNonRoot"] and pod["automountServiceAccountToken"] is False
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_children_are_owned_by_the_inference_service():
    _, _, deployment, service = built("hf")
    for child in (deployment, service):
        (ref,) = child["metadata"]["ownerReferences"]
        assert ref == {
            "apiVersion": "serving.pagedinfer.dev/v1alpha1",
            "kind": "InferenceService",
            "name": "llama",
            "uid": OWNER.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def test_api_key_comes_from_the_secret_and_hf_models_are_offline_by_default():
    _, _, deployment, _ = built("hf")
    env = {e["name"]: e for e in container(deployment)["env"]}
    assert env["PAGEDINFER_API_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "key", "key": "api-key"}}
    assert env["HF_HUB_OFFLINE"]["value"] == "1" and env["LOG_LEVEL"]["value"] == "debug"
    spec = parse_spec("llama", {"model": {"uri": "hf://a/b", "allowDownload": True, "architecture": ARCH}})
    names = {e["name"] for e in container(builders.build_deployment(OWNER, spec, plan_of(spec)))["env"]}
    assert "HF_HUB_OFFLINE" not in names


def test_an_hf_token_reaches_the_pod_as_a_secret_reference_only():
    _, _, deployment, _ = built("hf")
    env = {e["name"]: e for e in container(deployment)["env"]}
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
    for key in ("pvc", "cpu"):
        assert "HF_TOKEN" not in {e["name"] for e in container(built(key)[2])["env"]}


def test_pvc_and_file_models_are_mounted_read_only():
    _, _, pvc, _ = built("pvc")
    volumes = {v["name"]: v for v in pvc["spec"]["template"]["spec"]["volumes"]}
    assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert volumes["model-cache"]["persistentVolumeClaim"] == {"claimName": "hf-cache"}
    args = container(pvc)["args"]
    assert args[args.index("--model") + 1] == "/mnt/models/llama/8b"
    _, _, file_, _ = built("file")
    mounts = {m["name"]: m for m in container(file_)["volumeMounts"]}
    assert mounts["model"] == {"name": "model", "mountPath": "/models/llama", "readOnly": True}
    assert container(file_)["resources"]["limits"]["nvidia.com/gpu"] == "2"


def test_s3_uris_are_refused_until_the_engine_can_read_them():
    with pytest.raises(SpecError, match="s3:// is reserved"):
        parse_spec(OWNER.name, {"model": {"uri": "s3://bucket/llama", "architecture": ARCH}})


def test_file_uris_need_the_operator_to_allow_host_paths():
    with pytest.raises(SpecError, match="--allow-host-path-models"):
        parse_spec(OWNER.name, SPECS["file"])


def test_no_pod_template_carries_a_hash_of_itself():
    # A hash of the template stored in that template rolls nothing the template change would not.
    spec = parse_spec("llama", {"model": {"architecture": ARCH}, "router": {"enabled": True}})
    engine = builders.build_deployment(OWNER, spec, plan_of(spec))
    assert engine["spec"]["template"]["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(builders.HTTP_PORT),
        "prometheus.io/path": "/metrics",
    }
    router = routing_builders.build_router_deployment(OWNER, spec, "router:1")
    assert "annotations" not in router["spec"]["template"]["metadata"]


def test_an_engine_change_rolls_the_pods_and_a_replica_change_does_not():
    spec = parse_spec("llama", {"model": {"architecture": ARCH}})
    plan = plan_of(spec)
    base = builders.build_deployment(OWNER, spec, plan)
    more = builders.build_deployment(OWNER, parse_spec("llama", {"model": {"architecture": ARCH}, "replicas": 3}), plan)
    longer = builders.build_deployment(
        OWNER, parse_spec("llama", {"model": {"architecture": ARCH}, "engine": {"maxNumSeqs": 64}}), plan
    )
    assert more["spec"]["template"] == base["spec"]["template"] != longer["spec"]["template"]
    assert more["spec"]["replicas"] == 3
    spec_hash = SPEC_HASH_ANNOTATION
    assert more["metadata"]["annotations"][spec_hash] != base["metadata"]["annotations"][spec_hash]


def test_the_update_patch_removes_pod_fields_the_spec_no_longer_sets():
    spec = parse_spec("llama", {"resources": {"gpus": 0}})
    patch = patch_for(builders.build_deployment(OWNER, spec, plan_of(spec)))
    pod = patch["spec"]["template"]["spec"]
    assert pod["nodeSelector"] is None and pod["tolerations"] is None and pod["affinity"] is None


def test_selector_string_matches_the_pod_labels():
    assert selector_string("x") == "app.kubernetes.io/instance=x,app.kubernetes.io/name=pagedinfer-engine"


def test_a_plan_sized_from_node_labels_keeps_the_pod_on_nodes_with_at_least_that_much_gpu_memory():
    spec, plan, deployment, _ = built("hf")
    assert plan.source == "node-labels"
    (term,) = deployment["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "zone", "operator": "In", "values": ["a"]},
        {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["81558"]},
    ]
    assert spec.affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    ]  # the spec is left alone
    from_spec = planning.plan_for(
        spec, planning.shape_from_architecture(spec.model.architecture, "auto"), 81559 * 2**20, planning.SOURCE_SPEC
    )
    pod = builders.build_deployment(OWNER, spec, from_spec)["spec"]["template"]["spec"]
    assert pod["affinity"] == spec.affinity  # gpuMemory from the spec: the user vouches for the nodes


def test_the_deployment_records_the_owner_generation_it_was_built_from_outside_the_pod_template():
    spec, plan, deployment, service = built("pvc")
    assert deployment["metadata"]["annotations"][builders.OWNER_GENERATION_ANNOTATION] == "3"
    assert builders.built_for_generation(deployment) == 3
    assert builders.OWNER_GENERATION_ANNOTATION not in service["metadata"]["annotations"]
    later = builders.build_deployment(builders.Owner("llama", "serving", OWNER.uid, generation=4), spec, plan)
    assert later["spec"] == deployment["spec"]  # a new generation alone rolls nothing
    assert builders.built_for_generation({"metadata": {"annotations": {}}}) is None


def test_the_engine_images_come_from_the_flags_else_the_environment(monkeypatch):
    from pagedinfer.operator.settings import OperatorConfig

    assert OperatorConfig.from_env().engine_images == EngineImages()
    monkeypatch.setenv("PAGEDINFER_ENGINE_IMAGE", "registry.local/engine:env")
    monkeypatch.setenv("PAGEDINFER_ENGINE_CPU_IMAGE", "registry.local/engine:cpu-env")
    assert OperatorConfig.from_env().engine_images == EngineImages(
        "registry.local/engine:env", "registry.local/engine:cpu-env"
    )
    flagged = OperatorConfig.from_env(engine_cpu_image="registry.local/engine:cpu-flag").engine_images
    assert flagged == EngineImages("registry.local/engine:env", "registry.local/engine:cpu-flag")
