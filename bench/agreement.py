"""How far two systems' greedy outputs agree, request by request (standard library only).

Outputs are lists of generated token ids, one per request, in workload order.
A reference may cover only the first requests of the workload (transformers
runs on a subset of the 125M workload): the comparison covers the requests
both sides have.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Agreement:
    num_requests: int  # requests compared
    first_token: float  # fraction of them whose first generated token is equal
    whole_sequence: float  # fraction whose whole output is equal
    prefix_tokens: float  # reference tokens reproduced before the first divergence, over all reference tokens

    @property
    def first_token_stderr(self) -> float:
        """The standard error of first_token as a binomial proportion: on 48 requests near 70% it is 6.6
        points, so a gap of 12.5 points between two systems is under 2 of them (and was noise)."""
        return math.sqrt(self.first_token * (1 - self.first_token) / self.num_requests)

    def __str__(self) -> str:
        return (
            f"first token {self.first_token:.1%} +- {self.first_token_stderr:.1%}, whole sequence "
            f"{self.whole_sequence:.1%} of {self.num_requests} requests"
        )


def agreement(outputs: Sequence[Sequence[int]], reference: Sequence[Sequence[int]]) -> Agreement:
    """Compare the first min(len(outputs), len(reference)) requests; ValueError if that is none."""
    n = min(len(outputs), len(reference))
    if n == 0:
        raise ValueError("agreement: no request to compare")
    first = whole = same_tokens = reference_tokens = 0
    for out, ref in zip(outputs[:n], reference[:n]):
        common = 0
        while common < min(len(out), len(ref)) and out[common] == ref[common]:
            common += 1
        first += common > 0 or (not out and not ref)
        whole += len(out) == len(ref) == common
        same_tokens += common
        reference_tokens += len(ref)
    return Agreement(n, first / n, whole / n, same_tokens / reference_tokens if reference_tokens else 1.0)
