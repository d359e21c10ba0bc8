"""Token sampling for one step: penalties, temperature, top-k/top-p/min-p, seeds, logprobs.

Order (as vLLM): logprobs are taken from the raw model distribution; then
logit_bias is added (`logit_bias.py`); a structured-output row's grammar
masks the tokens it does not allow (`structured/bitmask.py`); min_tokens
masks EOS and stop tokens; repetition (prompt + output), presence and
frequency (output) penalties; greedy rows take the argmax; other rows are
scaled by 1/temperature, cut by top-k, top-p and min-p, and drawn, all rows
of the step in one batch of tensor operations (no per-row host round trip: on a
GPU a step of 256 sampled rows costs one sync, as in vLLM's sampler). A request
with a seed draws from its own generator (seeded with seed and its completion
index), so it is reproducible whatever else shares the batch; the others
draw from the engine's generator, seeded from the engine's seed.
A batch whose every row is greedy or drawn without per-row work and without a
seed (`SamplingParams.device_sampled`, no grammar) takes `sample_device`: its
token ids stay a device tensor until the one `.tolist()` (the drawn rows'
options reach the device in one non-blocking transfer, `engine/draw.py`);
`sample` runs it and falls back to the general path for any other batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from pagedinfer.engine.draw import draw, draw_columns
from pagedinfer.engine.logit_bias import apply_logit_bias
from pagedinfer.engine.outputs import Logprob
from pagedinfer.engine.sequence import Sequence
from pagedinfer.engine.structured.bitmask import GrammarBitmask
from pagedinfer.engine.structured.eos import GrammarEos


class SampleResult(NamedTuple):
    """One row's draw (a named tuple: one per sampled row per step)."""

    token_id: int
    logprobs: dict[int, Logprob] | None  # the sampled token and the top-k, when asked


class Sampler:
    """Samples one token per row of a step's logits, all rows at once.

    Invariants: the caller's logits are never written (the engine passes the runner's own when every row
    samples); one device sync per step (the final `.tolist()`, which also
    carries every requested logprob), whatever the batch; a seeded request's draw consumes only its own generator, so it does
    not depend on what else is in the batch.
    """

    def __init__(self, seed: int, eos_token_ids: set[int], device: torch.device) -> None:
        self.device = device
        self.eos_token_ids = eos_token_ids
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.seq_generators: dict[int, torch.Generator] = {}
        self.grammar_bitmask = GrammarBitmask(GrammarEos.of(eos_token_ids))

    def forget(self, seq_id: int) -> None:
        self.seq_generators.pop(seq_id, None)

    def _seq_generator(self, seq: Sequence) -> torch.Generator:
        gen = self.seq_generators.get(seq.seq_id)
        if gen is None:
            gen = torch.Generator(device=self.device).manual_seed((seq.params.seed * 1_000_003 + seq.index) % 2**63)
            self.seq_generators[seq.seq_id] = gen
        return gen

    def sample(
        self, logits: torch.Tensor, seqs: list[Sequence], on_tokens: Callable[[torch.Tensor], None] | None = None
    ) -> list[SampleResult]:
        """One token per row; `on_tokens` (async scheduling) gets the tokens as a tensor on the logits' device
        before the step's one sync brings them to the host."""
        tokens = self.sample_device(logits, seqs)
        if tokens is not None:
            # every row greedy or drawn without per-row work (the common batch): greedy rows take the argmax of
            # the rows as they are (a float32 copy holds the same values, so the same first maximum); one sync
            self.grammar_bitmask.apply(logits, [])  # drops a prefetch of no rows, as the general path does
            if on_tokens is not None:
                on_tokens(tokens)
            return [SampleResult(token, None) for token in tokens.tolist()]
        logits = logits.to(torch.float32, copy=True)  # one copy: the penalties below write into it
        raw_logprobs = None
        if any(s.params.logprobs is not None for s in seqs):
            raw_logprobs = torch.log_softmax(logits, dim=-1)
        apply_logit_bias(logits, seqs)
        self.grammar_bitmask.apply(logits, [(row, s.grammar) for row, s in enumerate(seqs) if s.grammar is not None])
        for row, seq in enumerate(seqs):
            self._apply_penalties(logits[row], seq)
        tokens = logits.argmax(dim=-1)
        drawn_rows = [row for row, seq in enumerate(seqs) if not seq.params.greedy]
        if drawn_rows:
            index = torch.tensor(drawn_rows, device=logits.device)
            tokens[index] = self._draw(logits[index], [seqs[row] for row in drawn_rows])
        if on_tokens is not None:
            on_tokens(tokens)
        logprob_rows = [row for row, seq in enumerate(seqs) if seq.params.logprobs is not None]
        if not logprob_rows:
            return [SampleResult(token, None) for token in tokens.tolist()]
        ks = [seqs[row].params.logprobs for row in logprob_rows]
        token_list, entries = _with_logprobs(tokens, raw_logprobs, logprob_rows, ks)
        results = [SampleResult(token, None) for token in token_list]
        for row, entry in zip(logprob_rows, entries):
            results[row] = SampleResult(token_list[row], entry)
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
            known = seq.token_ids[: len(seq.token_ids) - seq.num_placeholders]  # no async-scheduling placeholder
            seen = torch.tensor(sorted(set(known)), device=row.device)
            vals = row[seen]
            row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if (p.presence_penalty or p.frequency_penalty) and seq.num_output_tokens:
            out = torch.tensor(seq.output_token_ids, device=row.device)
            counts = torch.bincount(out, minlength=row.shape[0])[: row.shape[0]].to(row.dtype)
            row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)

    def _draw(self, rows: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """One token per row of `rows` [n, vocab]: temperature, top-k, top-p, min-p, then a draw (`engine/draw.py`)."""
        return draw(
            rows, draw_columns([s.params for s in seqs], rows.shape[1], rows.device), self._uniforms(seqs, rows.device)
        )

    def sample_device(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor | None:
        """The rows' tokens as a device tensor `[n]` (int64), with no host sync, when every row is drawn on the
        device (`SamplingParams.device_sampled`: greedy or temperature/top-k/top-p/min-p, unseeded, no logprobs,
        logit bias, min_tokens or penalties) and has no grammar; None otherwise (`sample` takes those rows).

        The same tokens `sample` gives for the same generator state: greedy rows take the argmax; the drawn
        rows' options go to the device in one non-blocking transfer and their uniforms come from the
        engine's generator, on the device."""
        if not all(s.params.device_sampled and s.grammar is None for s in seqs):
            return None
        tokens = logits.argmax(dim=-1)
        drawn = [row for row, seq in enumerate(seqs) if not seq.params.greedy]
        if not drawn:
            return tokens
        columns = draw_columns([seqs[row].params for row in drawn], logits.shape[1], logits.device, drawn)
        rows = logits.float() if len(drawn) == len(seqs) else logits[columns.rows].float()
        chosen = draw(rows, columns, torch.rand(len(drawn), generator=self.generator, device=logits.device))
        if len(drawn) == len(seqs):
            return chosen
        return tokens.index_put_((columns.rows,), chosen)

    def _uniforms(self, seqs: list[Sequence], device: torch.device) -> torch.Tensor:
        """One U[0, 1) per row: a seeded request's from its own generator, the others' from the engine's."""
        unseeded = [i for i, s in enumerate(seqs) if s.params.seed is None]
        draws = torch.empty(len(seqs), device=device)
        if unseeded:
            draws[torch.tensor(unseeded, device=device)] = torch.rand(
                len(unseeded), generator=self.generator, device=device
            )
        for i, seq in enumerate(seqs):
            if seq.params.seed is not None:
                draws[i] = torch.rand(1, generator=self._seq_generator(seq), device=device)[0]
        return draws


def _with_logprobs(
    tokens: torch.Tensor, raw_logprobs: torch.Tensor, rows: list[int], ks: list[int]
) -> tuple[list[int], list[dict[int, Logprob]]]:
    """The sampled tokens, and for each of `rows` its token's logprob and rank plus the top ks[i], in ONE sync.

    Everything is computed on the device for all rows at once and moved to the
    host in a single float64 transfer (exact for float32 values and for token
    ids and ranks below 2**53): tokens, then per row [logprob, rank, top-k
    values, top-k ids] padded to the widest k.
    """
    index = torch.tensor(rows, device=tokens.device)
    lp = raw_logprobs[index]
    picked = tokens[index][:, None]
    token_lp = lp.gather(1, picked)
    rank = (lp > token_lp).sum(dim=-1, keepdim=True) + 1
    width = max(ks)
    top = torch.topk(lp, width, dim=-1)
    block = torch.cat([token_lp.double(), rank.double(), top.values.double(), top.indices.double()], dim=1)
    flat = torch.cat([tokens.double(), block.flatten()]).tolist()
    token_list = [int(t) for t in flat[: tokens.shape[0]]]
    stride = 2 + 2 * width
    entries = []
    for i, (row, k) in enumerate(zip(rows, ks)):
        words = flat[tokens.shape[0] + i * stride : tokens.shape[0] + (i + 1) * stride]
        out = {token_list[row]: Logprob(words[0], int(words[1]))}
        for r, (value, tid) in enumerate(zip(words[2 : 2 + k], words[2 + width : 2 + width + k]), start=1):
            out.setdefault(int(tid), Logprob(value, r))
        entries.append(out)
    return token_list, entries
