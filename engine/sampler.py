"""Token sampling for one step: penalties, temperature, top-k/top-p/min-p, seeds, logprobs.

Order (as vLLM): logprobs are taken from the raw model distribution; then
min_tokens masks EOS and stop tokens; repetition (prompt + output), presence
and frequency (output) penalties; greedy rows take the argmax; other rows are
scaled by 1/temperature, cut by top-k, top-p and min-p, and drawn. A request
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
    def __init__(self, seed: int, eos_token_ids: set[int], device: torch.device) -> None:
        self.device = device
        self.eos_token_ids = eos_token_ids
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self.seq_generators: dict[int, torch.Generator] = {}

    def forget(self, seq_id: int) -> None:
        self.seq_generators.pop(seq_id, None)

    def _generator(self, seq: Sequence) -> torch.Generator:
        if seq.params.seed is None:
            return self.generator
        gen = self.seq_generators.get(seq.seq_id)
        if gen is None:
            gen = torch.Generator(device="cpu").manual_seed((seq.params.seed * 1_000_003 + seq.index) % 2**63)
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
        results: list[SampleResult] = []
        greedy = [s.params.greedy for s in seqs]
        argmax = logits.argmax(dim=-1).tolist() if any(greedy) else None
        for row, seq in enumerate(seqs):
            if greedy[row]:
                token = argmax[row]
            else:
                token = self._draw(logits[row], seq)
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

    def _draw(self, row: torch.Tensor, seq: Sequence) -> int:
        p = seq.params
        row = row / p.temperature
        if p.top_k is not None and p.top_k < row.shape[0]:
            kth = torch.topk(row, p.top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        probs = torch.softmax(row, dim=-1)
        if p.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            cumulative = torch.cumsum(sorted_probs, dim=-1)
            drop = cumulative - sorted_probs > p.top_p  # keep the smallest prefix reaching top_p
            sorted_probs = sorted_probs.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        if p.min_p > 0.0:
            probs = probs.masked_fill(probs < p.min_p * probs.max(), 0.0)
        probs = probs.cpu()
        if not torch.isfinite(probs).all() or probs.sum() <= 0:
            return int(row.argmax())
        return int(torch.multinomial(probs, 1, generator=self._generator(seq)))


def _logprobs(logprobs: torch.Tensor, token: int, k: int) -> dict[int, Logprob]:
    token_lp = float(logprobs[token])
    rank = int((logprobs > logprobs[token]).sum()) + 1
    out = {token: Logprob(token_lp, rank)}
    if k:
        top = torch.topk(logprobs, k)
        for r, (v, i) in enumerate(zip(top.values.tolist(), top.indices.tolist()), start=1):
            out.setdefault(i, Logprob(v, r))
    return out
