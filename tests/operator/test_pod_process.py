"""The kubelet harness runs the operator's own container command line; only the address and volume paths change."""

from pathlib import Path

import pytest

from pagedinfer.operator.children import builders
from pagedinfer.operator.kv_plan import planning
from pagedinfer.operator.spec.parser import parse_spec
from pagedinfer.testing.pod_process import http_port, local_process

POD_DIR = Path("/work/pods/tiny-engine-1")


def pod_spec(raw):
    spec = parse_spec("tiny", raw, allow_host_path_models=True)
    return builders.build_pod_spec(spec, planning.plan_for(spec, None, None, "engine"))


@pytest.fixture
def bin_dir(tmp_path):
    (tmp_path / "pagedinfer").touch()
    return tmp_path


def test_the_container_command_line_runs_unchanged_but_for_the_pods_address(bin_dir):
    spec = pod_spec({"resources": {"gpus": 0}, "engine": {"numGpuBlocksOverride": 32, "maxModelLen": 256}})
    container = spec["containers"][0]
    local = local_process(spec, "127.0.0.3", POD_DIR, bin_dir)
    assert local.argv[0] == str(bin_dir / "pagedinfer")
    assert list(local.argv[1:]) == ["127.0.0.3" if a == "0.0.0.0" else a for a in container["args"]]
    assert local.argv[local.argv.index("--num-gpu-blocks-override") + 1] == "32"
    assert "--model" not in local.argv  # no model.uri: the engine's embedded default model
    assert http_port(container) == 8000


def test_env_paths_on_empty_dirs_move_into_the_pods_folder(bin_dir):
    local = local_process(pod_spec({"resources": {"gpus": 0}}), "127.0.0.2", POD_DIR, bin_dir)
    assert local.env["HOME"] == str(POD_DIR / "tmp")
    assert local.env["HF_HOME"] == str(POD_DIR / "model-cache" / "huggingface")


def test_it_runs_in_the_pods_folder_or_the_containers_working_dir_never_the_test_runners(bin_dir):
    spec = pod_spec({"resources": {"gpus": 0}})
    assert local_process(spec, "127.0.0.2", POD_DIR, bin_dir).cwd == str(POD_DIR)
    spec["containers"][0]["workingDir"] = "/tmp/work"  # on the pod's emptyDir mounted at /tmp
    assert local_process(spec, "127.0.0.2", POD_DIR, bin_dir).cwd == str(POD_DIR / "tmp" / "work")


def test_a_host_path_model_is_the_same_directory_here(bin_dir):
    spec = pod_spec({"resources": {"gpus": 0}, "model": {"uri": "file:///srv/models/tiny"}})
    local = local_process(spec, "127.0.0.2", POD_DIR, bin_dir)
    assert local.argv[local.argv.index("--model") + 1] == "/srv/models/tiny"


def test_what_cannot_be_mounted_or_resolved_locally_is_refused(bin_dir):
    with pytest.raises(ValueError, match="volume 'model' of kind persistentVolumeClaim"):
        local_process(
            pod_spec({"resources": {"gpus": 0}, "model": {"uri": "pvc://models/tiny"}}), "127.0.0.2", POD_DIR, bin_dir
        )
    with pytest.raises(ValueError, match="env 'PAGEDINFER_API_KEY': valueFrom"):
        local_process(
            pod_spec({"resources": {"gpus": 0}, "engine": {"apiKeySecretRef": {"name": "key"}}}),
            "127.0.0.2",
            POD_DIR,
            bin_dir,
        )
    with pytest.raises(ValueError, match="'pagedinfer' is not in"):
        local_process(pod_spec({"resources": {"gpus": 0}}), "127.0.0.2", POD_DIR, bin_dir / "missing")
