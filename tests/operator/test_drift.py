"""Drift is a difference in a field the operator sets; what the API server defaults or others add is not."""

from pagedinfer.operator.children import builders
from pagedinfer.operator.children.drift import SPEC_HASH_ANNOTATION, drifted_paths, fingerprint, patch_for
from pagedinfer.operator.children.labels import OWNER_LABEL
from pagedinfer.operator.kv_plan import planning
from pagedinfer.operator.spec.parser import parse_spec

OWNER = builders.Owner(name="llama", namespace="default", uid="uid-1", generation=2)
SPEC_DICT = {
    "model": {"architecture": {"numLayers": 32, "numKVHeads": 8, "headDim": 128, "numParameters": 8_030_261_248}}
}
SPEC = parse_spec("llama", SPEC_DICT)
PLAN = planning.plan_for(
    SPEC, planning.shape_from_architecture(SPEC.model.architecture, "auto"), 81559 * 2**20, planning.SOURCE_NODE_LABELS
)


def live_deployment():
    """The built Deployment as an API server returns it: defaulted fields and controller bookkeeping added."""
    live = builders.build_deployment(OWNER, SPEC, PLAN)
    live["metadata"].update(uid="d-1", resourceVersion="7", generation=2, creationTimestamp="2025-01-01T00:00:00Z")
    live["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "2"
    pod = live["spec"]["template"]["spec"]
    pod.update(restartPolicy="Always", dnsPolicy="ClusterFirst", schedulerName="default-scheduler")
    pod["containers"][0].update(imagePullPolicy="IfNotPresent", terminationMessagePath="/dev/termination-log")
    pod["containers"][0]["readinessProbe"]["successThreshold"] = 1
    live["status"] = {"replicas": 1, "readyReplicas": 1, "observedGeneration": 2}
    return live


def wanted():
    return patch_for(builders.build_deployment(OWNER, SPEC, PLAN))


def test_defaults_and_other_controllers_fields_are_not_drift():
    assert drifted_paths(live_deployment(), wanted()) == []


def test_a_hand_edited_image_replicas_and_sidecar_are_drift_with_their_paths():
    live = live_deployment()
    live["spec"]["replicas"] = 5
    live["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:latest"
    assert drifted_paths(live, wanted()) == ["spec.replicas", "spec.template.spec.containers[0].image"]
    live["spec"]["template"]["spec"]["containers"].append({"name": "sidecar", "image": "x"})
    assert "spec.template.spec.containers" in drifted_paths(live, wanted())


def test_a_removed_owned_field_and_an_added_field_the_spec_leaves_unset_are_drift():
    live = live_deployment()
    del live["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    live["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "mine"}  # patch_for: None, must be absent
    del live["metadata"]["annotations"][SPEC_HASH_ANNOTATION]
    assert drifted_paths(live, wanted()) == [
        f"metadata.annotations.{SPEC_HASH_ANNOTATION}",
        "spec.template.spec.containers[0].securityContext",
        "spec.template.spec.nodeSelector",
    ]


def test_the_fingerprint_ignores_status_and_write_bookkeeping_but_not_edits():
    live = live_deployment()
    same = {**live, "status": {"replicas": 3}, "metadata": {**live["metadata"], "resourceVersion": "99"}}
    assert fingerprint(same) == fingerprint(live)
    edited = live_deployment()
    edited["spec"]["replicas"] = 4
    assert fingerprint(edited) != fingerprint(live)


def test_the_fingerprint_covers_only_the_metadata_the_operator_sets():
    live = live_deployment()
    others = live_deployment()
    others["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "3"  # the Deployment controller's
    others["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = "{}"
    others["metadata"]["labels"] = {**others["metadata"]["labels"], "team": "search"}
    others["metadata"]["finalizers"] = ["example.com/backup"]
    assert fingerprint(others) == fingerprint(live)
    for edit in (
        {"annotations": {**live["metadata"]["annotations"], SPEC_HASH_ANNOTATION: "x"}},
        {"labels": {**live["metadata"]["labels"], OWNER_LABEL: "other"}},
        {"ownerReferences": []},
    ):
        assert fingerprint({**live, "metadata": {**live["metadata"], **edit}}) != fingerprint(live), edit


def test_quantities_and_empty_values_as_the_api_server_stores_them_are_not_drift():
    spec = parse_spec(
        "llama",
        {
            "model": SPEC_DICT["model"],
            "resources": {"cpu": "0.5", "memory": "1024Mi"},
            "engine": {"env": [{"name": "EMPTY", "value": ""}]},
        },
    )
    desired = builders.build_deployment(OWNER, spec, PLAN)
    live = builders.build_deployment(OWNER, spec, PLAN)
    container = live["spec"]["template"]["spec"]["containers"][0]
    container["resources"] = {
        "requests": {"cpu": "500m", "memory": "1Gi"},
        "limits": {"memory": "1Gi", "nvidia.com/gpu": "1"},
    }
    container["env"] = [{"name": "EMPTY"} if e["name"] == "EMPTY" else e for e in container["env"]]
    assert drifted_paths(live, patch_for(desired, live)) == []
    container["resources"]["requests"]["cpu"] = "2000m"
    container["env"][-1]["value"] = "set by hand"
    assert drifted_paths(live, patch_for(desired, live)) == [
        "spec.template.spec.containers[0].env[2].value",
        "spec.template.spec.containers[0].resources.requests.cpu",
    ]
    args = container["args"]
    args[args.index("--max-num-seqs") + 1] = "256.0"  # not a quantity: compared as text
    assert f"spec.template.spec.containers[0].args[{args.index('256.0')}]" in drifted_paths(
        live, patch_for(desired, live)
    )


def test_a_key_added_to_a_map_the_operator_owns_whole_is_drift_and_the_patch_deletes_it():
    live = live_deployment()
    live["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "theirs"}
    live["spec"]["template"]["metadata"]["labels"]["team"] = "a"  # labels are open: others may add their own
    patch = patch_for(builders.build_deployment(OWNER, SPEC, PLAN), live)
    assert drifted_paths(live, patch) == ["spec.template.spec.nodeSelector"]
    service = builders.build_service(OWNER)
    edited = {**service, "spec": {**service["spec"], "selector": {**service["spec"]["selector"], "app": "x"}}}
    patch = patch_for(service, edited)
    assert patch["spec"]["selector"]["app"] is None
    assert drifted_paths(edited, patch) == ["spec.selector.app"]
