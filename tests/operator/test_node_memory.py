"""GPU memory per GPU is the smallest nvidia.com/gpu.memory among the nodes the pod can land on."""

from pagedinfer.operator.kv_plan.node_memory import (
    Placement,
    discover_gpu_memory,
    gpu_memory_bytes_from_labels,
    require_gpu_memory,
    required_affinity_holds,
    tolerates,
)


def node(name, memory_mib=None, product="NVIDIA-H100-80GB-HBM3", gpus=8, taints=(), labels=None, unschedulable=False):
    node_labels = {"nvidia.com/gpu.product": product, **(labels or {})}
    if memory_mib is not None:
        node_labels["nvidia.com/gpu.memory"] = str(memory_mib)
    return {
        "metadata": {"name": name, "labels": node_labels},
        "spec": {"taints": list(taints), **({"unschedulable": True} if unschedulable else {})},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}},
    }


def test_label_is_mib_per_gpu():
    assert gpu_memory_bytes_from_labels({"nvidia.com/gpu.memory": "81559"}) == 81559 * 2**20
    assert gpu_memory_bytes_from_labels({"nvidia.com/gpu.memory": "n/a"}) is None
    assert gpu_memory_bytes_from_labels({}) is None


def test_the_smallest_matching_node_decides():
    found = discover_gpu_memory([node("h100", 81559), node("a100-40", 40960), node("l4", 23034)], Placement(gpus=1))
    assert found.gpu_memory_bytes == 23034 * 2**20 and found.node_name == "l4"
    assert found.num_matching_nodes == 3


def test_gpu_product_and_node_selector_narrow_the_nodes():
    nodes = [node("h100", 81559), node("l4", 23034, product="NVIDIA-L4")]
    found = discover_gpu_memory(
        nodes, Placement(gpus=1, node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    )
    assert found.node_name == "h100"
    assert found.rejections == {"without label nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3": 1}


def test_untolerated_taints_exclude_a_node_and_tolerations_admit_it():
    taint = {"key": "dedicated", "value": "training", "effect": "NoSchedule"}
    nodes = [node("small", 23034, taints=[taint]), node("big", 81559)]
    assert discover_gpu_memory(nodes, Placement(gpus=1)).node_name == "big"
    tolerated = Placement(
        gpus=1, tolerations=({"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"},)
    )
    assert discover_gpu_memory(nodes, tolerated).node_name == "small"


def test_toleration_rules():
    taint = {"key": "k", "value": "v", "effect": "NoExecute"}
    assert tolerates(taint, [{"operator": "Exists"}])
    assert tolerates(taint, [{"key": "k", "operator": "Exists"}])
    assert not tolerates(taint, [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}])
    assert not tolerates(taint, [{"key": "k", "value": "other"}])


def test_prefer_no_schedule_taints_do_not_exclude():
    soft = {"key": "x", "effect": "PreferNoSchedule"}
    assert discover_gpu_memory([node("n", 1000, taints=[soft])], Placement(gpus=1)).node_name == "n"


def test_nodes_without_enough_gpus_unschedulable_or_unlabelled_are_rejected_with_reasons():
    nodes = [node("two", 81559, gpus=2), node("cordoned", 81559, unschedulable=True), node("bare")]
    found = discover_gpu_memory(nodes, Placement(gpus=4))
    assert found.gpu_memory_bytes is None
    assert found.rejections == {
        "with fewer than 4 allocatable nvidia.com/gpu": 1,
        "unschedulable": 1,
        "without a nvidia.com/gpu.memory label": 1,
    }
    assert "0 of 3 nodes" in found.message and "unschedulable" in found.message


def test_required_node_affinity_is_honoured():
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                    {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["3"]}]},
                ]
            }
        }
    }
    assert required_affinity_holds("n", {"zone": "a"}, affinity)
    assert required_affinity_holds("n", {"gen": "4"}, affinity)
    assert not required_affinity_holds("n", {"zone": "b", "gen": "3"}, affinity)
    assert required_affinity_holds("n", {}, None)
    nodes = [node("a", 1000, labels={"zone": "a"}), node("b", 500, labels={"zone": "b"})]
    assert discover_gpu_memory(nodes, Placement(gpus=1, affinity=affinity)).node_name == "a"


def test_no_nodes_at_all_is_no_memory():
    found = discover_gpu_memory([], Placement(gpus=1))
    assert found.gpu_memory_bytes is None and found.num_nodes == 0


def required(*terms):
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def test_match_fields_select_nodes_by_name_and_an_empty_term_selects_none_as_the_scheduler_does():
    by_name = required({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["big"]}]})
    assert required_affinity_holds("big", {}, by_name)
    assert not required_affinity_holds("small", {}, by_name)
    not_small = required(
        {
            "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["small"]}],
            "matchExpressions": [{"key": "zone", "operator": "Exists"}],
        }
    )
    assert required_affinity_holds("big", {"zone": "a"}, not_small)
    assert not required_affinity_holds("big", {}, not_small)  # both halves of a term must hold
    assert not required_affinity_holds("small", {"zone": "a"}, not_small)
    assert not required_affinity_holds("big", {"zone": "a"}, required({}))
    nodes = [node("big", 81559), node("small", 23034)]
    found = discover_gpu_memory(nodes, Placement(gpus=1, affinity=by_name))
    assert found.node_name == "big" and found.rejections == {"outside the required node affinity": 1}


def test_the_gpu_memory_floor_joins_every_required_term_and_keeps_unlabelled_and_smaller_nodes_out():
    zone = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    by_name = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b1"]}]}
    affinity = {**required(zone, by_name, {}), "podAntiAffinity": {"x": 1}}
    floored = require_gpu_memory(affinity, 40960)
    floor = {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["40959"]}
    assert floored == {
        **required(
            {"matchExpressions": [*zone["matchExpressions"], floor]}, {**by_name, "matchExpressions": [floor]}, {}
        ),
        "podAntiAffinity": {"x": 1},
    }
    assert affinity == {**required(zone, by_name, {}), "podAntiAffinity": {"x": 1}}  # not modified
    assert require_gpu_memory(None, 40960) == required({"matchExpressions": [floor]})
    mem = "nvidia.com/gpu.memory"
    assert required_affinity_holds("a1", {"zone": "a", mem: "40960"}, floored)
    assert required_affinity_holds("b1", {mem: "81559"}, floored)
    assert not required_affinity_holds("a1", {"zone": "a", mem: "40959"}, floored)
    assert not required_affinity_holds("a1", {"zone": "a"}, floored)  # unlabelled
    assert not required_affinity_holds("b1", {}, floored)
