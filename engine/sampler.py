"""Token sampling for one step: penalties, temperature, top-k/top-p/min-p, seeds, logprobs.

Order (as vLLM): logprobs are taken from the raw model distribution; then
min_tokens masks EOS and stop tokens; repetition (prompt + output), presence
and frequency (output) penalties; greedy rows take the argmax; other rows are
scaled by 1/temperature, cut by top-k, top-p and min-p, and drawn, all rows
of the step in one batch of tensor operations (no per-row host round trip: on a
GPU a step of 256 sampled rows costs one sync, as in vLLM's sampler). A request
with a seed draws from its own generator (seeded with seed and its completion
index), so it is reproducible whatever else shares the batch; the others
draw from the engine's generator, seeded from the engine's seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedinfer.engine.outputs import Logprob
from pagedinfer.engine.sequence import Sequence


@dataclass(frozen=True)
class SampleResult:
    token_id: int
    logprobs: dict[int, Logprob] | None  # the sampled token and the top-k, when asked


class Sampler:
    """Samples one token per row of a step's logits, all rows at once.

    Invariants: one device sync per step (the final `.tolist()`), whatever the
    batch; a seeded request's draw consumes only its own generator, so it does
    not depend on what else is in the batch.
    """

    def __init__(self, seed: int, eos_token_ids: set[int], device: torch.device) -> None:
        self.device = device
        self.eos_token_ids = eos_token_ids
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.seq_generators: dict[int, torch.Generator] = {}

    def forget(self, seq_id: int) -> None:
        self.seq_generators.pop(seq_id, None)

    def _seq_generator(self, seq: Sequence) -> torch.Generator:
        gen = self.seq_generators.get(seq.seq_id)
        if gen is None:
            gen = torch.Generator(device=self.device).manual_seed((seq.params.seed * 1_000_003 + seq.index) % 2**63)
            self.seq_generators[seq.seq_id] = gen
        return gen

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[SampleResult]:
        logits = logits.float()
        raw_logprobs = None
        if any(s.params.logprobs is not None for s in seqs):
            raw_logprobs = torch.log_softmax(logits, dim=-1)
        logits = logits.clone()
        for row, seq in enumerate(seqs):
            self._apply_penalties(logits[row], seq)
        tokens = logits.argmax(dim=-1)
        drawn_rows = [row for row, seq in enumerate(seqs) if not seq.params.greedy]
        if drawn_rows:
            index = torch.tensor(drawn_rows, device=logits.device)
            tokens[index] = self._draw(logits[index], [seqs[row] for row in drawn_rows])
        results: list[SampleResult] = []
        for row, (seq, token) in enumerate(zip(seqs, tokens.tolist())):
            lp = None
            if seq.params.logprobs is not None:
                lp = _logprobs(raw_logprobs[row], token, seq.params.logprobs)
            results.append(SampleResult(token, lp))
        return results

    def _apply_penalties(self, row: torch.Tensor, seq: Sequence) -> None:
        p = seq.params
        if seq.num_output_tokens < p.min_tokens:
            banned = set(p.stop_token_ids or ())
            if not p.ignore_eos:
                banned |= self.eos_token_ids
            if banned:
                row[torch.tensor(sorted(banned), device=row.device)] = float("-inf")
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(seq.token_ids)), device=row.device)
            vals = row[seen]
            row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if (p.presence_penalty or p.frequency_penalty) and seq.num_output_tokens:
            out = torch.tensor(seq.output_token_ids, device=row.device)
            counts = torch.bincount(out, minlength=row.shape[0])[: row.shape[0]].to(row.dtype)
            row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)

    def _draw(self, rows: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """One token per row of `rows` [n, vocab]: temperature, top-k, top-p, min-p, then a draw.

        With top-k or top-p, the rows are ranked once (`topk` of the largest k when
        every row has a top-k, else a full sort) and cut in ranked order; a top-k
        keeps the ties of its k-th value. The draw is inverse-CDF sampling: one
        uniform per row, searched in the running sum of the kept probabilities.
        A row whose distribution is empty or not finite (every token masked,
        overflow) takes the argmax of its logits.
        """
        vocab = rows.shape[1]
        params = [s.params for s in seqs]
        column = lambda values: torch.tensor(values, dtype=rows.dtype, device=rows.device)[:, None]  # noqa: E731
        scaled = rows / column([p.temperature for p in params])
        top_k = [p.top_k if p.top_k is not None and p.top_k < vocab else vocab for p in params]
        top_p = [p.top_p for p in params]
        min_p = [p.min_p for p in params]
        token_ids = None  # candidates in natural order
        if max(top_k) < vocab:
            scaled, token_ids = torch.topk(scaled, max(top_k), dim=-1)
        elif min(top_k) < vocab or min(top_p) < 1.0:
            scaled, token_ids = torch.sort(scaled, dim=-1, descending=True)
        if token_ids is not None and min(top_k) < vocab:
            kth = scaled.gather(1, torch.tensor(top_k, device=rows.device)[:, None].clamp_max(scaled.shape[1]) - 1)
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        if min(top_p) < 1.0:  # ranked: keep the smallest prefix reaching top_p; rows with top_p = 1 keep all
            drop = (torch.cumsum(probs, dim=-1) - probs > column(top_p)) & (column(top_p) < 1.0)
            probs = probs.masked_fill(drop, 0.0)
        if max(min_p) > 0.0:
            probs = probs.masked_fill(probs < column(min_p) * probs.amax(dim=-1, keepdim=True), 0.0)
        cumulative = torch.cumsum(probs, dim=-1)
        picked = torch.searchsorted(cumulative, self._uniforms(seqs, rows.device)[:, None] * cumulative[:, -1:],
                                    right=True).clamp_max(probs.shape[1] - 1)
        drawn = picked if token_ids is None else token_ids.gather(1, picked)
        usable = torch.isfinite(probs).all(dim=-1, keepdim=True) & (cumulative[:, -1:] > 0)
        return torch.where(usable, drawn, rows.argmax(dim=-1, keepdim=True))[:, 0]

    def _uniforms(self, seqs: list[Sequence], device: torch.device) -> torch.Tensor:
        """One U[0, 1) per row: a seeded request's from its own generator, the others' from the engine's."""
        unseeded = [i for i, s in enumerate(seqs) if s.params.seed is None]
        draws = torch.empty(len(seqs), device=device)
        if unseeded:
            draws[torch.tensor(unseeded, device=device)] = torch.rand(len(unseeded), generator=self.generator,
                                                                       device=device)
        for i, seq in enumerate(seqs):
            if seq.params.seed is not None:
                draws[i] = torch.rand(1, generator=self._seq_generator(seq), device=device)[0]
        return draws


def _logprobs(logprobs: torch.Tensor, token: int, k: int) -> dict[int, Logprob]:
    token_lp = float(logprobs[token])
    rank = int((logprobs > logprobs[token]).sum()) + 1
    out = {token: Logprob(token_lp, rank)}
    if k:
        top = torch.topk(logprobs, k)
        for r, (v, i) in enumerate(zip(top.values.tolist(), top.indices.tolist()), start=1):
            out.setdefault(i, Logprob(v, r))
    return out
