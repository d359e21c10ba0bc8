"""The waiting-queue limit (`--max-waiting-requests`): admit a request, or say why not.

A request costs `num_prompts * n` sequences: the engine schedules each
prompt's n completions as sequences of their own, so the cost is what the
request adds to the queue, not 1 per HTTP request (one completions request
with thousands of prompts must not slip past a limit of 1024).

Decision, for a limit L, `num_waiting` sequences already waiting (or on
their way to the engine) and a request costing c:
- c > L: 400. The request can never be admitted, however long the client
  waits; the error names `n` when the prompts alone fit, else `prompt`.
- num_waiting + c > L: 503 + Retry-After. It fits once the queue drains.
- otherwise: admitted.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedinfer.contracts import validators


@dataclass(frozen=True)
class Refusal:
    """Why a request is not admitted: 400 (never fits) or 503 (retry later)."""

    status_code: int
    message: str
    param: str | None


def check_waiting_limit(num_waiting: int, num_prompts: int, n: int, limit: int | None) -> Refusal | None:
    """None when the request fits under `limit` (None: no limit), else the refusal."""
    validators.positive_int("num_prompts", num_prompts)
    validators.positive_int("n", n)
    if limit is None:
        return None
    cost = num_prompts * n
    if cost > limit:
        param = "n" if num_prompts <= limit else "prompt"
        return Refusal(
            400,
            f"{param}: {num_prompts} prompt(s) x n={n} = {cost} sequences exceed this server's "
            f"waiting-queue limit of {limit}; send fewer prompts or a smaller n",
            param,
        )
    if num_waiting + cost > limit:
        return Refusal(
            503,
            f"too many waiting requests ({num_waiting} sequences waiting, this request adds {cost}, "
            f"limit {limit}); retry later",
            None,
        )
    return None
