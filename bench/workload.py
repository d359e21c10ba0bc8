"""The benchmark's workload and result records (the standard library only when run).

Shared by `throughput.py` (pagedinfer's venv) and `vllm_runner.py` (vLLM's
own venv), so both read the same requests from the same JSON file.

A workload is a seeded list of requests. Prompt and output lengths are drawn
from log-normal distributions (`pagedinfer.engine.bench.workload.LengthDistribution`,
which the scripts that make workloads import: a few long requests, many short
ones, as in chat traffic), clipped to [min, max] and so that prompt + output fits
max_model_len. Prompt tokens are uniform random ids outside the special
tokens. Every system must generate exactly `max_tokens` tokens for every
request (EOS ignored), so all of them do the same work.
"""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # vllm_runner.py imports this module where pagedinfer is not installed
    from pagedinfer.engine.bench.workload import LengthDistribution


@dataclass(frozen=True)
class TokenIdsRequest:
    """One offline request: prompt token ids and exactly max_tokens to generate (EOS ignored)."""

    prompt_token_ids: tuple[int, ...]
    max_tokens: int

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("prompt_token_ids: must not be empty")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens: must be >= 1, got {self.max_tokens}")


def make_workload(
    num_requests: int,
    seed: int,
    vocab_size: int,
    first_regular_token_id: int,
    prompt_lengths: LengthDistribution,
    output_lengths: LengthDistribution,
    max_model_len: int,
) -> list[TokenIdsRequest]:
    """Seeded requests; prompt + output never exceeds max_model_len."""
    if num_requests < 1:
        raise ValueError(f"num_requests: must be >= 1, got {num_requests}")
    if not 0 <= first_regular_token_id < vocab_size:
        raise ValueError(f"first_regular_token_id: must be in [0, {vocab_size}), got {first_regular_token_id}")
    rng = random.Random(seed)
    requests = []
    for _ in range(num_requests):
        prompt_len = prompt_lengths.draw(rng)
        output_len = min(output_lengths.draw(rng), max_model_len - prompt_len)
        ids = tuple(rng.randrange(first_regular_token_id, vocab_size) for _ in range(prompt_len))
        requests.append(TokenIdsRequest(ids, output_len))
    return requests


def save_workload(requests: list[TokenIdsRequest], path: str | Path) -> None:
    Path(path).write_text(
        json.dumps([{"prompt_token_ids": list(r.prompt_token_ids), "max_tokens": r.max_tokens} for r in requests])
    )


def load_workload(path: str | Path) -> list[TokenIdsRequest]:
    data = json.loads(Path(path).read_text())
    return [TokenIdsRequest(tuple(r["prompt_token_ids"]), int(r["max_tokens"])) for r in data]


@dataclass(frozen=True)
class RunResult:
    """One system's timed runs over the whole workload (model load and warm-up excluded).

    elapsed_seconds is the median of all_elapsed_seconds (one per repeat);
    outputs are those of the first repeat. all_cpu_seconds (one per repeat, or
    none) is the CPU time the system's processes used in each timed span;
    start-up (model load + warm-up, compiles included) is timed apart.
    """

    system: str
    num_requests: int
    num_output_tokens: int  # each request's own tokens only (padding never counts)
    all_elapsed_seconds: tuple[float, ...]
    num_threads: int
    outputs: tuple[tuple[int, ...], ...]  # generated ids per request, workload order
    notes: str = ""
    dtype: str = "float32"
    all_cpu_seconds: tuple[float, ...] = ()
    startup_seconds: float = 0.0
    peak_rss_bytes: int = 0  # vLLM: the sum of its processes' own peaks

    @property
    def cpu_per_wall(self) -> float | None:
        """CPU time over wall time of the timed spans (median over repeats); None if not measured."""
        if not self.all_cpu_seconds:
            return None
        return statistics.median(c / t for c, t in zip(self.all_cpu_seconds, self.all_elapsed_seconds))

    @property
    def elapsed_seconds(self) -> float:
        return statistics.median(self.all_elapsed_seconds)

    @property
    def output_tokens_per_second(self) -> float:
        return self.num_output_tokens / self.elapsed_seconds

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def pooled(cls, rounds: list[RunResult]) -> RunResult:
        """One system's runs over several rounds (`--rounds`) as one result: every round's timed runs
        (so the medians are over all of them), the median start-up, the highest peak RSS, the first
        round's outputs. Every round must have generated the same tokens (greedy is deterministic)."""
        if not rounds:
            raise ValueError("pooled: no rounds given")
        first = rounds[0]
        for i, r in enumerate(rounds[1:], start=2):
            if (r.system, r.dtype, r.num_output_tokens) != (first.system, first.dtype, first.num_output_tokens):
                raise ValueError(
                    f"pooled: round {i} is {r.system} {r.dtype} with {r.num_output_tokens} tokens, "
                    f"round 1 {first.system} {first.dtype} with {first.num_output_tokens}"
                )
            if r.outputs != first.outputs:
                raise ValueError(f"pooled: {r.system}'s tokens in round {i} differ from round 1's")
        cpu = tuple(c for r in rounds for c in r.all_cpu_seconds)
        return replace(
            first,
            all_elapsed_seconds=tuple(t for r in rounds for t in r.all_elapsed_seconds),
            all_cpu_seconds=cpu if all(r.all_cpu_seconds for r in rounds) else (),
            startup_seconds=statistics.median(r.startup_seconds for r in rounds),
            peak_rss_bytes=max(r.peak_rss_bytes for r in rounds),
        )

    @classmethod
    def from_json(cls, text: str) -> RunResult:
        data = json.loads(text)
        data["outputs"] = tuple(tuple(o) for o in data["outputs"])
        data["all_elapsed_seconds"] = tuple(data["all_elapsed_seconds"])
        data["all_cpu_seconds"] = tuple(data.get("all_cpu_seconds", ()))
        return cls(**data)


def check_lengths(result: RunResult, requests: list[TokenIdsRequest]) -> None:
    """ValueError unless the system generated exactly max_tokens tokens for every request."""
    if len(result.outputs) != len(requests):
        raise ValueError(f"{result.system}: {len(result.outputs)} outputs for {len(requests)} requests")
    for i, (out, req) in enumerate(zip(result.outputs, requests)):
        if len(out) != req.max_tokens:
            raise ValueError(f"{result.system}: request {i} generated {len(out)} tokens, expected {req.max_tokens}")
