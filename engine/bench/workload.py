"""The pure half of `pagedinfer bench serve`: workloads, arrival times, statistics.

No I/O, no randomness outside a seeded `random.Random`, so the same flags give
the same requests in the same order at the same offsets.

Workloads (one chat request each: an optional system message shared by all
requests, then a user message unique to the request):
- synthetic: every user message has `input_words` words, every completion
  `output_tokens` tokens;
- sharegpt-like: lengths vary the way chat logs do: a long-tailed
  (log-normal, `LengthDistribution.with_mean`) number of input words and of
  output tokens, around the same means, clipped to [4, 4x mean].
Arrivals are a Poisson process of `request_rate` per second (exponential
gaps); an infinite rate sends everything at time 0.

`LengthDistribution` is also the offline benchmark's (bench/workload.py
`make_workload`, its prompt and output lengths by their medians).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

WORDS = (
    "time person year way day thing man world life hand part child eye woman place work week case point "
    "government company number group problem fact be have do say get make go know take see come think look "
    "want give use find tell ask work seem feel try leave call good new first last long great little own other "
    "old right big high different small large next early young important few public bad same able to of in "
    "for on with at by from up about into over after the and a that I it not he as you this but his they her "
    "she or an will my one all would there their what so out if who which me when can like no just him know "
    "cache block token server request model prompt memory queue batch stream kernel engine python module"
).split()


@dataclass(frozen=True)
class ScheduledChatRequest:
    """One chat completion of the load and when the client sends it (the offline benchmark's
    token-id requests are bench/workload.py's TokenIdsRequest)."""

    system_prompt: str | None
    user_prompt: str
    max_tokens: int
    send_offset_seconds: float  # when to send it, from the start of the run


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


@dataclass(frozen=True)
class LengthDistribution:
    """Log-normal lengths (many short, a few long, as in chat traffic): round(exp(N(mu, sigma))), clipped
    to [min_length, max_length]. Its median is exp(mu) (`with_median`), its mean before clipping
    exp(mu + sigma^2 / 2) (`with_mean`). A draw takes one `lognormvariate` of the caller's seeded rng."""

    mu: float
    sigma: float
    min_length: int
    max_length: int

    def __post_init__(self) -> None:
        if not 1 <= self.min_length <= self.max_length:
            raise ValueError(f"min_length: need 1 <= min_length <= max_length, got {self}")
        if self.sigma < 0:
            raise ValueError(f"sigma: must be >= 0, got {self.sigma}")

    @classmethod
    def with_median(cls, median: int, sigma: float, min_length: int, max_length: int) -> LengthDistribution:
        if not 1 <= min_length <= median <= max_length:
            raise ValueError(
                f"median: need 1 <= min_length <= median <= max_length, got {min_length} <= {median} <= {max_length}"
            )
        return cls(math.log(median), sigma, min_length, max_length)

    @classmethod
    def with_mean(cls, mean: int, sigma: float, min_length: int, max_length: int) -> LengthDistribution:
        if mean < 1:
            raise ValueError(f"mean: must be >= 1, got {mean}")
        return cls(math.log(mean) - sigma * sigma / 2, sigma, min_length, max_length)

    def draw(self, rng: random.Random) -> int:
        return max(self.min_length, min(self.max_length, round(rng.lognormvariate(self.mu, self.sigma))))


SHAREGPT_SIGMA = 0.8  # the sharegpt-like workload's spread of both lengths


def _sharegpt_like(mean: int) -> LengthDistribution:
    return LengthDistribution.with_mean(mean, SHAREGPT_SIGMA, 4, 4 * max(mean, 4))


def build_workload(
    dataset: str,
    num_prompts: int,
    request_rate: float,
    input_words: int,
    output_tokens: int,
    shared_prefix_words: int,
    seed: int,
) -> list[ScheduledChatRequest]:
    if dataset not in ("synthetic", "sharegpt-like"):
        raise ValueError(f"dataset: must be 'synthetic' or 'sharegpt-like', got {dataset!r}")
    if num_prompts < 1:
        raise ValueError(f"num_prompts: must be >= 1, got {num_prompts}")
    if not request_rate > 0:
        raise ValueError(f"request_rate: must be > 0 (inf for all at once), got {request_rate}")
    for name, value, least in (
        ("input_words", input_words, 1),
        ("output_tokens", output_tokens, 1),
        ("shared_prefix_words", shared_prefix_words, 0),
    ):
        if value < least:
            raise ValueError(f"{name}: must be >= {least}, got {value}")
    rng = random.Random(seed)
    system = None
    if shared_prefix_words:
        system = "You are a helpful assistant. " + _words(rng, shared_prefix_words)
    requests = []
    offset = 0.0
    inputs, outputs = _sharegpt_like(input_words), _sharegpt_like(output_tokens)
    for i in range(num_prompts):
        if dataset == "synthetic":
            num_in, num_out = input_words, output_tokens
        else:
            num_in, num_out = inputs.draw(rng), outputs.draw(rng)
        user = f"Request {i}: " + _words(rng, num_in)
        requests.append(ScheduledChatRequest(system, user, num_out, offset))
        if math.isfinite(request_rate):
            offset += rng.expovariate(request_rate)
    return requests


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation between order statistics; None if empty."""
    if not 0 <= q <= 100:
        raise ValueError(f"q: must be in [0, 100], got {q}")
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class RequestResult:
    ok: bool
    ttft_seconds: float | None = None
    itl_seconds: tuple[float, ...] = ()
    latency_seconds: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None


@dataclass(frozen=True)
class BenchSummary:
    num_ok: int
    num_failed: int
    duration_seconds: float
    mean_prompt_tokens: float | None
    mean_completion_tokens: float | None
    request_throughput_per_second: float
    output_token_throughput_per_second: float
    total_token_throughput_per_second: float
    ttft_ms: dict[str, float | None]
    itl_ms: dict[str, float | None]
    e2e_ms: dict[str, float | None]
    cached_token_share: float | None  # cached / prompt tokens, from the responses' usage
    prefix_cache_hit_rate: float | None  # hits / queries, from the server's /metrics counters


def _distribution_ms(values: list[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {"mean": (sum(values) / len(values) * 1000) if values else None}
    for q in (50, 90, 99):
        p = percentile(values, q)
        out[f"p{q}"] = p * 1000 if p is not None else None
    return out


def summarize(
    results: list[RequestResult],
    duration_seconds: float,
    cache_queries_delta: float | None,
    cache_hits_delta: float | None,
) -> BenchSummary:
    ok = [r for r in results if r.ok]
    prompt = sum(r.prompt_tokens for r in ok)
    completion = sum(r.completion_tokens for r in ok)
    duration = max(duration_seconds, 1e-9)
    hit_rate = None
    if cache_queries_delta:
        hit_rate = (cache_hits_delta or 0.0) / cache_queries_delta
    return BenchSummary(
        num_ok=len(ok),
        num_failed=len(results) - len(ok),
        duration_seconds=duration_seconds,
        mean_prompt_tokens=prompt / len(ok) if ok else None,
        mean_completion_tokens=completion / len(ok) if ok else None,
        request_throughput_per_second=len(ok) / duration,
        output_token_throughput_per_second=completion / duration,
        total_token_throughput_per_second=(prompt + completion) / duration,
        ttft_ms=_distribution_ms([r.ttft_seconds for r in ok if r.ttft_seconds is not None]),
        itl_ms=_distribution_ms([x for r in ok for x in r.itl_seconds]),
        e2e_ms=_distribution_ms([r.latency_seconds for r in ok if r.latency_seconds is not None]),
        cached_token_share=(sum(r.cached_tokens for r in ok) / prompt) if prompt else None,
        prefix_cache_hit_rate=hit_rate,
    )


def format_summary(s: BenchSummary) -> str:
    def ms(d: dict[str, float | None]) -> str:
        return "  ".join(f"{k} {v:8.1f}" if v is not None else f"{k}      n/a" for k, v in d.items())

    def share(x: float | None) -> str:
        return f"{x * 100:.1f}%" if x is not None else "n/a"

    return "\n".join(
        [
            f"requests            ok {s.num_ok}, failed {s.num_failed}, in {s.duration_seconds:.2f} s"
            + (
                f"; mean {s.mean_prompt_tokens:.0f} prompt + {s.mean_completion_tokens:.0f} output tokens"
                if s.mean_prompt_tokens is not None
                else ""
            ),
            f"throughput          {s.request_throughput_per_second:.2f} req/s, "
            f"{s.output_token_throughput_per_second:.1f} output tok/s, {s.total_token_throughput_per_second:.1f} total tok/s",
            f"TTFT (ms)           {ms(s.ttft_ms)}",
            f"ITL (ms)            {ms(s.itl_ms)}",
            f"E2E latency (ms)    {ms(s.e2e_ms)}",
            f"prefix cache        hit rate {share(s.prefix_cache_hit_rate)} (server /metrics), "
            f"cached prompt tokens {share(s.cached_token_share)} (usage)",
        ]
    )
