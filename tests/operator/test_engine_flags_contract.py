"""Every command line the operator builds is one `pagedinfer serve` accepts.

The operator (no torch) and the engine's CLI meet only through these flags; a
renamed or missing flag would crash-loop every pod, so the built args are
parsed by the real `pagedinfer` parser here. The flags the operator sets are
exactly the ones `spec.engine.extraArgs` may not set, spelled out or
abbreviated, and no other flag of the engine is refused there.
"""

import argparse

import pytest

from pagedinfer.engine.cli import build_parser
from pagedinfer.operator.children import builders
from pagedinfer.operator.kv_plan import planning
from pagedinfer.operator.spec.crd_model import MANAGED_FLAGS
from pagedinfer.operator.spec.parser import managed_flag_of, parse_spec

OWNER = builders.Owner(name="llama", namespace="serving", uid="0b7d4b3e-1111-2222-3333-444455556666")
ARCH = {"numLayers": 32, "numKVHeads": 8, "headDim": 128, "numParameters": 8_030_261_248}

SPECS = [
    {
        "model": {
            "uri": "hf://meta-llama/Meta-Llama-3-8B",
            "revision": "v1.0",
            "architecture": ARCH,
            "allowDownload": True,
        },
        "engine": {
            "blockSize": 32,
            "gpuMemoryUtilization": 0.85,
            "maxModelLen": 4096,
            "maxNumSeqs": 64,
            "maxNumBatchedTokens": 4096,
            "enablePrefixCaching": False,
            "enableChunkedPrefill": False,
            "swapSpaceGiB": 2,
        },
        "resources": {"gpus": 1},
    },
    {"model": {"uri": "pvc://models/llama/8b", "architecture": ARCH}, "resources": {"gpus": 1}},
    {"resources": {"gpus": 0}, "engine": {"maxModelLen": 512}},
]


@pytest.mark.parametrize("raw", SPECS)
def test_the_engine_cli_parses_every_built_command_line(raw):
    spec = parse_spec(OWNER.name, raw)
    shape = planning.shape_from_architecture(spec.model.architecture, "auto") if spec.model.architecture else None
    memory = None if spec.resources.gpus == 0 else 81559 * 2**20
    plan = planning.plan_for(spec, shape, memory, "engine" if memory is None else "node-labels")
    container = builders.build_deployment(OWNER, spec, plan)["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["pagedinfer"]
    assert {a for a in container["args"] if a.startswith("--")} <= set(MANAGED_FLAGS)
    args = build_parser().parse_args(container["args"])
    assert args.command == "serve"
    assert args.block_size == spec.engine.block_size
    assert args.enable_prefix_caching is spec.engine.enable_prefix_caching
    assert args.enable_chunked_prefill is spec.engine.enable_chunked_prefill
    assert args.num_gpu_blocks_override == plan.num_gpu_blocks
    assert args.served_model_name == spec.served_model_name
    if spec.model.revision != "main":
        assert args.revision == spec.model.revision
    # preStop keeps serving while endpoints go; SIGTERM's drain follows; both fit the grace period
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep" and 0 < float(pre_stop[1]) < args.shutdown_grace_seconds
    grace = builders.build_deployment(OWNER, spec, plan)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert float(pre_stop[1]) + args.shutdown_grace_seconds + 10 <= grace


def serve_flags():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {flag for action in sub.choices["serve"]._actions for flag in action.option_strings}


def test_every_managed_flag_is_a_serve_flag_and_no_other_serve_flag_is_refused():
    flags = serve_flags()
    assert set(MANAGED_FLAGS) <= flags
    assert {f for f in flags if f.startswith("--") and managed_flag_of(f) is not None} == set(MANAGED_FLAGS)


def test_every_prefix_of_a_managed_flag_is_refused():
    for flag in MANAGED_FLAGS:
        for end in range(2, len(flag) + 1):
            assert managed_flag_of(flag[:end]) is not None and managed_flag_of(flag[:end] + "=v") is not None


@pytest.mark.parametrize("resources, graphs", [({"gpus": 0, "memory": "2Gi"}, 0), ({"gpus": 0}, 0), ({"gpus": 0}, 16)])
def test_a_cpu_engine_sizes_the_pool_the_operator_reports_within_the_budget_it_passes(resources, graphs):
    """The engine's own CPU plan (no override) from the operator's flags equals status.kvCache's; with decode
    graphs (maxCudagraphCaptureSize) the same graph term, fewer blocks."""
    import dataclasses

    from pagedinfer.contracts.embedded_model import default_model_dir
    from pagedinfer.engine.engine_args import engine_config_from_args
    from pagedinfer.engine.runner.model_runner import ModelRunner
    from pagedinfer.engine.runner.profiling import size_kv_cache
    from pagedinfer.operator.kv_plan import resolver

    spec = parse_spec(
        "tiny", {"resources": resources, "engine": {"maxModelLen": 512, "maxCudagraphCaptureSize": graphs}}
    )
    shape = planning.shape_from_config(resolver._embedded_default_config(), spec.model.dtype, cpu=True)
    plan = planning.plan_for(spec, shape, None, planning.SOURCE_MEMORY)
    args = build_parser().parse_args(builders.engine_args(spec, plan))
    assert args.cpu_memory_budget == str(plan.cpu_memory_budget_bytes)
    config = dataclasses.replace(
        engine_config_from_args(args, model=str(default_model_dir())), num_gpu_blocks_override=None, device="cpu"
    )
    engine_plan = size_kv_cache(ModelRunner(config), 512)
    assert (engine_plan.num_gpu_blocks, engine_plan.bytes_per_block) == (plan.num_gpu_blocks, plan.bytes_per_block)
    assert engine_plan.gpu_memory_bytes == plan.cpu_memory_budget_bytes == planning.cpu_memory(spec)[1] - 2**30
    assert args.max_cudagraph_capture_size == graphs
    assert (engine_plan.cuda_graph_bytes or None) == plan.cuda_graph_bytes == (plan.to_status().get("cudaGraphBytes"))
    if graphs:
        without = planning.plan_for(
            parse_spec("tiny", {"resources": resources, "engine": {"maxModelLen": 512}}),
            shape,
            None,
            planning.SOURCE_MEMORY,
        )
        assert plan.cuda_graph_bytes > 0 and plan.num_gpu_blocks < without.num_gpu_blocks
