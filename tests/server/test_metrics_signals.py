"""The signals an operator and the autoscaler act on mean what their names say.

- `prefix_cache_hits_total / prefix_cache_queries_total` is the prompt-cache
  hit rate: one query per request, in prompt tokens, at its first admission.
  A recompute after preemption finds the victim's own freed blocks; that is
  counted in `prefix_cache_preempted_*_total`, never as a prompt-cache hit.
- `num_requests_running` / `_waiting` / `_swapped` count requests: a prompt
  with n completions is one request, as the autoscaler's requestsWaiting means.
"""

from __future__ import annotations

import httpx
import pytest
from serving_harness import start_server, stop_server

from pagedinfer.engine import LLM, SamplingParams
from pagedinfer.engine.server.metrics import ServerMetrics
from pagedinfer.operator.autoscaling.readings import parse_pod_metrics


# swap mode with a one-block host pool: the two-block victim cannot be swapped out and is
# recomputed instead, the path that re-admits it (a victim that fits the pool is never looked up again)
@pytest.mark.parametrize(
    "mode, swap_space_gib", [("recompute", 4.0), ("swap", 1e-5)], ids=["recompute", "swap-pool-too-small"]
)
def test_preemption_of_unrelated_prompts_reports_no_prefix_cache_hit(tiny_llama, mode, swap_space_gib):
    # 5 blocks of 16 tokens: two 20-token prompts growing to 60 tokens cannot both fit
    running = start_server(
        tiny_llama, max_model_len=64, num_gpu_blocks_override=5, preemption_mode=mode, swap_space=swap_space_gib
    )
    try:
        prompts = [list(range(10, 30)), list(range(200, 220))]
        body = {"model": "tiny", "prompt": prompts, "max_tokens": 40, "temperature": 0, "ignore_eos": True}
        response = httpx.post(running.url + "/v1/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        assert [c["finish_reason"] for c in response.json()["choices"]] == ["length", "length"]
        m = running.wait_idle()
        assert m['pagedinfer_num_preemptions_total{mode="recompute"}'] >= 1
        assert m["pagedinfer_prefix_cache_hits_total"] == 0
        assert m["pagedinfer_prefix_cache_queries_total"] == 40  # each prompt once
        assert m["pagedinfer_prefix_cache_preempted_hits_total"] > 0  # the victim found its own blocks
        assert m["pagedinfer_prefix_cache_preempted_queries_total"] > 20
    finally:
        stop_server(running)


def test_queue_gauges_count_requests_whatever_their_n(tiny_llama):
    llm = LLM(
        model=str(tiny_llama),
        block_size=16,
        max_model_len=256,
        num_gpu_blocks_override=64,
        max_num_seqs=4,
        dtype="float32",
    )
    engine = llm.llm_engine
    params = SamplingParams(n=4, max_tokens=8, ignore_eos=True)
    engine.add_request("a", [5, 6, 7], params)
    engine.add_request("b", [8, 9, 10], params)
    engine.step()  # a holds all 4 seats: its prompt is sampled and its 3 children are forked; b waits
    stats = engine.get_stats()
    assert len(engine.scheduler.running) == 4
    assert (stats.num_running_reqs, stats.num_waiting_reqs, stats.num_swapped_reqs) == (1, 1, 0)
    assert stats.num_waiting_seqs == 4  # what the server's waiting limit counts

    metrics = ServerMetrics("tiny")
    metrics.on_stats(stats)
    exposition = metrics.render().decode()
    assert 'pagedinfer_num_requests_running{model_name="tiny"} 1.0' in exposition
    assert 'pagedinfer_num_requests_waiting{model_name="tiny"} 1.0' in exposition
    assert parse_pod_metrics(exposition, "tiny").num_requests_waiting == 1.0  # the autoscaler's requestsWaiting
    llm.llm_engine.abort_request(["a", "b"])
    assert engine.get_stats().num_used_blocks == 0
