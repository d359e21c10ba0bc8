"""The bookkeeping of one beam search: live beams, candidates, finished hypotheses.

Pure Python, no torch: the engine reports each live beam's top next tokens
with their log-probabilities and applies the `BeamStep` that comes back
(which beam continues with which token). The algorithm is transformers'
`GenerationMixin._beam_search` (the vectorised one of transformers >= 4.50)
with `early_stopping=True`, so that for the same log-probabilities both pick
the same sequences in the same order:

1. Every live beam reports its top `num_candidates` tokens, where
   num_candidates = max(2, 1 + number of EOS ids) * beam_width (transformers'
   `beams_to_keep`). The step ranks all (beam, token) pairs by accumulated
   log-probability, cum_logprob(beam) + logprob(token), and keeps the best
   num_candidates: the global top-k over beams x vocabulary, since no pair
   outside a beam's own top-k can beat one inside it.
2. A candidate "hits a stop" if its token is an EOS id, or if it reaches
   max_tokens (then every candidate hits). Hitting candidates ranked below
   beam_width are dropped; those ranked within it become finished hypotheses
   with score = cum_logprob / len(generated tokens) ** length_penalty. The
   length counts the generated tokens, the EOS included, not the prompt (as
   transformers since 4.28; vLLM counts the prompt too and not the EOS).
3. The best beam_width candidates that did not hit a stop are the next live
   beams.
4. The best beam_width hypotheses are kept. The search is done when
   beam_width hypotheses are finished (early_stopping=True: no waiting for a
   better one) or at max_tokens.

Invariants: all live beams have generated the same number of tokens; at most
beam_width beams are live and at most beam_width hypotheses kept, best first.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Beam:
    token_ids: tuple[int, ...]  # generated so far
    cum_logprob: float


@dataclass(frozen=True)
class Hypothesis:
    """A finished sequence: its generated tokens (a final EOS included) and its score."""

    token_ids: tuple[int, ...]
    cum_logprob: float
    score: float  # cum_logprob / len(token_ids) ** length_penalty
    finish_reason: str  # "stop" (an EOS) or "length" (max_tokens)


@dataclass(frozen=True)
class BeamStep:
    """What the engine does with its live beams after one step of the search."""

    parents: tuple[int, ...]  # per new live beam, its parent's index among the previous live beams
    tokens: tuple[int, ...]  # per new live beam, the token it appends
    done: bool  # the search is over: every live beam stops, `hypotheses` is the result


@dataclass
class BeamSearch:
    beam_width: int
    max_tokens: int
    length_penalty: float = 1.0
    eos_token_ids: frozenset[int] = frozenset()  # empty with ignore_eos
    live: list[Beam] = field(default_factory=lambda: [Beam((), 0.0)])
    hypotheses: list[Hypothesis] = field(default_factory=list)
    done: bool = False
    _reports: dict[int, list[tuple[int, float]]] = field(default_factory=dict)

    @property
    def num_candidates(self) -> int:
        """Top tokens each live beam reports (transformers' beams_to_keep)."""
        return max(2, 1 + len(self.eos_token_ids)) * self.beam_width

    def report(self, beam_index: int, top: list[tuple[int, float]]) -> None:
        """Live beam `beam_index`'s top (token, logprob) pairs for its next token, best first."""
        if self.done or not 0 <= beam_index < len(self.live):
            raise ValueError(f"beam_index: {beam_index} is not a live beam")
        self._reports[beam_index] = list(top[: self.num_candidates])

    @property
    def ready(self) -> bool:
        """Every live beam has reported: the step can be taken."""
        return not self.done and len(self._reports) == len(self.live)

    def step(self) -> BeamStep:
        if not self.ready:
            raise RuntimeError(f"beam step: {len(self._reports)} of {len(self.live)} live beams reported")
        candidates = sorted(
            (
                (beam.cum_logprob + logprob, b, token)
                for b, beam in enumerate(self.live)
                for token, logprob in self._reports[b]
            ),
            key=lambda c: -c[0],
        )[: self.num_candidates]
        self._reports.clear()
        num_generated = len(self.live[0].token_ids) + 1
        at_max_tokens = num_generated >= self.max_tokens
        norm = num_generated**self.length_penalty
        next_live: list[tuple[int, int, float]] = []
        for rank, (cum_logprob, b, token) in enumerate(candidates):
            is_eos = token in self.eos_token_ids
            if is_eos or at_max_tokens:
                if rank < self.beam_width:
                    self.hypotheses.append(
                        Hypothesis(
                            self.live[b].token_ids + (token,),
                            cum_logprob,
                            cum_logprob / norm,
                            "stop" if is_eos else "length",
                        )
                    )
            elif len(next_live) < self.beam_width:
                next_live.append((b, token, cum_logprob))
        self.hypotheses.sort(key=lambda h: -h.score)
        del self.hypotheses[self.beam_width :]
        self.done = at_max_tokens or len(self.hypotheses) >= self.beam_width or not next_live
        if self.done:
            self.live = []
            return BeamStep((), (), True)
        self.live = [Beam(self.live[b].token_ids + (token,), cum) for b, token, cum in next_live]
        return BeamStep(tuple(b for b, _, _ in next_live), tuple(t for _, t, _ in next_live), False)
