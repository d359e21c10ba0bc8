"""A router's warm-up prefill (`x-pagedinfer-warmup: 1`) runs, fills the prefix cache, and stays out of the
request series: request_success and the latency histograms do not move, pagedinfer_warmup_requests_total does."""

import httpx


def test_a_warmup_request_is_cached_but_counted_apart_from_user_requests(server):
    prompt = list(range(100, 164))  # 4 whole blocks of 16
    before = server.metrics()
    warm = httpx.post(
        server.url + "/v1/completions",
        headers={"x-pagedinfer-warmup": "1"},
        timeout=60,
        json={"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0.0},
    )
    assert warm.status_code == 200 and warm.json()["id"].startswith("warmup-")
    after = server.metrics()
    assert after["pagedinfer_warmup_requests_total"] == before["pagedinfer_warmup_requests_total"] + 1
    for series in (
        'pagedinfer_request_success_total{finished_reason="length"}',
        "pagedinfer_time_to_first_token_seconds_count",
        "pagedinfer_e2e_request_latency_seconds_count",
    ):
        assert after[series] == before[series], series
    user = httpx.post(
        server.url + "/v1/completions",
        timeout=60,
        json={"model": "tiny", "prompt": prompt + [7], "max_tokens": 1, "temperature": 0.0},
    )
    assert user.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 64  # the warm-up's blocks
    assert (
        server.metrics()['pagedinfer_request_success_total{finished_reason="length"}']
        == after['pagedinfer_request_success_total{finished_reason="length"}'] + 1
    )
