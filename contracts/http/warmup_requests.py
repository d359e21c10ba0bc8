"""Warm-up requests: prefills a router replays to fill an engine's prefix cache, kept out of user metrics.

A request carrying the header `x-pagedinfer-warmup: 1` (the router's warm-up,
router/warmup/) runs as any other (it is a real prefill: the prefix-cache
counters, which count cache work, include it), but its request id is
`warmup-...` instead of `cmpl-...`, and the server's per-request series (TTFT,
inter-token and end-to-end latency, queue time, request_success_total) skip
it; `pagedinfer_warmup_requests_total` counts it instead. Torch-free: the
router imports the header from here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

WARMUP_HEADER = "x-pagedinfer-warmup"
WARMUP_REQUEST_KIND = "warmup"


def is_warmup(headers: Mapping[str, str]) -> bool:
    return headers.get(WARMUP_HEADER) == "1"


def is_warmup_request_id(request_id: str) -> bool:
    return request_id.startswith(WARMUP_REQUEST_KIND + "-")


def as_warmup(plan: Any) -> Any:
    """The plan with its request id of the warm-up kind (`warmup-<same hex>`)."""
    return dataclasses.replace(plan, request_id=WARMUP_REQUEST_KIND + "-" + plan.request_id.partition("-")[2])
