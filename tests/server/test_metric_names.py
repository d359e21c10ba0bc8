"""contracts/metric_names.py is the one list of metric names: each process exposes exactly its part of it,
the docs list the server's, and importing it costs nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from pagedinfer.contracts import metric_names
from pagedinfer.engine.outputs import EngineStats
from pagedinfer.engine.server.metrics import ServerMetrics

REPO = Path(__file__).resolve().parents[2]


def families(registry) -> set[tuple[str, str]]:
    """(name, type) of every family a registry collects (prometheus_client's names: no `_total`, no `_info`)."""
    return {(f.name, f.type) for f in registry.collect()}


def named(metrics: tuple[metric_names.Metric, ...]) -> set[tuple[str, str]]:
    return {(m.name, m.kind) for m in metrics}


def test_the_server_exposes_exactly_the_server_names():
    metrics = ServerMetrics("tiny")
    metrics.on_stats(
        EngineStats(
            num_total_blocks=8,
            num_used_blocks=1,
            num_free_blocks=7,
            num_cached_free_blocks=0,
            kv_usage=0.125,
            prefix_cache_query_tokens=0,
            prefix_cache_hit_tokens=0,
            prefix_cache_preempted_query_tokens=0,
            prefix_cache_preempted_hit_tokens=0,
            num_allocation_failures=0,
            num_preemptions={},
            num_running_reqs=1,
            num_waiting_reqs=0,
            num_swapped_reqs=0,
            num_waiting_seqs=0,
            num_prompt_tokens=0,
            num_generation_tokens=0,
        )
    )
    metrics.on_ready(
        type(
            "Ready",
            (),
            {"block_size": 16, "num_gpu_blocks": 8, "gpu_memory_utilization": 0.9, "enable_prefix_caching": True},
        )()
    )
    assert families(metrics.registry) == named(metric_names.SERVER)


async def test_the_router_exposes_exactly_the_router_names():
    from pagedinfer.router.hold.queue import HoldQueue, HoldSettings
    from pagedinfer.router.metrics import RouterMetrics
    from pagedinfer.router.state import RouterState

    async with httpx.AsyncClient() as client:
        metrics = RouterMetrics(RouterState(["http://127.0.0.2:8000"], client), HoldQueue(HoldSettings()))
        assert families(metrics.registry) == named(metric_names.ROUTER)


def test_the_operator_exposes_exactly_the_operator_names():
    from pagedinfer.operator.metrics import OperatorMetrics

    assert families(OperatorMetrics().registry) == named(metric_names.OPERATOR)


def test_docs_design_lists_exactly_the_server_series():
    design = (REPO / "docs" / "design.md").read_text()
    section = design[design.index("## Metrics") :]
    section = section[: section.index("\n## ", 1)]
    documented = set(re.findall(r"`(pagedinfer_[a-z0-9_]+)", section))
    assert documented == {
        m.sample if m.kind in ("gauge", "counter") else m.series[0] if m.kind == "info" else m.name
        for m in metric_names.SERVER
    }


def test_importing_the_names_pulls_in_nothing_but_the_standard_library():
    code = (
        "import sys; before = set(sys.modules); import pagedinfer.contracts.metric_names\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names)\n"
        "assert new <= {'pagedinfer'}, sorted(new)"
    )
    subprocess.run([sys.executable, "-P", "-c", code], check=True, cwd="/")


def test_a_metric_name_carries_no_exposition_suffix_and_a_histogram_has_no_single_sample():
    with pytest.raises(ValueError, match="name"):
        metric_names.Metric("pagedinfer_x_total", metric_names.COUNTER)
    with pytest.raises(ValueError, match="kind"):
        metric_names.Metric("pagedinfer_x", "summary")
    with pytest.raises(ValueError, match="several sample names"):
        _ = metric_names.TIME_TO_FIRST_TOKEN_SECONDS.sample
    assert metric_names.PREFIX_CACHE_HITS.sample == "pagedinfer_prefix_cache_hits_total"
