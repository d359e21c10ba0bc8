"""The output side of a step: token texts, stop strings, and what each touched request gained.

Owned by one thread at a time (the output thread with overlap, else the
engine thread): `CompletionOutput`s, `Sequence.output_text`, `Sequence.detok`
and `num_sent` of the requests are written here only. The engine thread
writes `Sequence.token_ids` and the scheduler's state; what this side needs
of them is copied into each `TokenItem` when the token is appended, so the
engine may run ahead by a step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pagedinfer.engine.outputs import CompletionDelta, CompletionOutput, RequestOutput, RequestOutputDelta
from pagedinfer.engine.sequence import Sequence


class TokenItem(NamedTuple):
    """One sampled token as the engine thread appended it, and the finishes it decided at once
    (a named tuple: one per sampled token)."""

    seq: Sequence
    out: CompletionOutput  # the request's output for seq.index
    token: int
    logprobs: dict | None
    num_output_tokens: int  # seq's, this token included
    early_finish: str | None  # EOS or a stop token: decided before any text (the stop text is dropped)
    early_stop_reason: int | None
    late_finish: str | None  # grammar end ("stop") or a length limit: a stop string in this token wins


@dataclass
class OutputBatch:
    """One step's output work: its tokens in sampling order, then one output per touched request."""

    items: list[TokenItem]
    requests: list[Any]  # the engine's EngineRequest of each touched request, in first-touched order
    cumulative: bool  # step(): a RequestOutput (copy of all so far) each; step_deltas(): a RequestOutputDelta


@dataclass
class ProcessedBatch:
    """What the output side made of a batch."""

    outputs: list[tuple[Any, RequestOutput | RequestOutputDelta, bool]]  # (request, output, finished)
    stopped: list[Sequence] = field(default_factory=list)  # ended by a stop string: the engine finishes them


def process_batch(batch: OutputBatch, tokenizer: Any) -> ProcessedBatch:
    """Apply every token's text, then build each touched request's output (invariant: no engine state read
    that the engine thread may change meanwhile, except the requests' own metrics and prompt logprobs)."""
    stopped = [item.seq for item in batch.items if _apply_token(item, tokenizer)]
    build = output_of if batch.cumulative else delta_of
    outputs = []
    for req in batch.requests:
        finished = outputs_finished(req)
        outputs.append((req, build(req, finished), finished))
    return ProcessedBatch(outputs, stopped)


def outputs_finished(req: Any) -> bool:
    """Whether every completion of req has its finish reason (beam search: its search is done)."""
    if req.beam is not None:
        return req.beam.done
    outs = req.outputs
    if len(outs) == 1:  # n == 1: no generator per request per step
        return outs[0].finish_reason is not None
    return all(o.finish_reason is not None for o in outs)


def _apply_token(item: TokenItem, tokenizer: Any) -> bool:
    """Append the token's ids, logprobs and text to its output; True if a stop string ended it here."""
    seq, out, token, p = item.seq, item.out, item.token, item.seq.params
    out.token_ids.append(token)
    if out.logprobs is not None and item.logprobs is not None:
        logprobs = {tid: type(lp)(lp.logprob, lp.rank, tokenizer.decode([tid])) for tid, lp in item.logprobs.items()}
        out.logprobs.append(logprobs)
    finish, stop_reason = item.early_finish, item.early_stop_reason
    text_stop = False
    # as vLLM: the text of a stop token (EOS, stop_token_ids) is in the output only with
    # include_stop_str_in_output (and then skip_special_tokens still applies to it)
    if finish is None or p.include_stop_str_in_output:
        emitted = len(seq.output_text)
        seq.output_text += seq.detok.add(token)
        if finish is None and p.stop_strings and item.num_output_tokens >= p.min_tokens:
            hit = find_stop(seq.output_text, emitted, p.stop_strings)
            if hit is not None:
                at, stop = hit
                seq.output_text = seq.output_text[: at + len(stop) if p.include_stop_str_in_output else at]
                finish, stop_reason, text_stop = "stop", stop, True
    if finish is None:
        finish = item.late_finish
    if finish is None and p.stop_strings:
        out.text = hold_back_stop_prefix(seq.output_text, p.stop_strings)
    else:
        out.text = seq.output_text
    if finish is not None:
        out.finish_reason = finish
        out.stop_reason = stop_reason
    return text_stop


def output_of(req: Any, finished: bool) -> RequestOutput:
    """req's cumulative output: a copy of everything so far."""
    first = req.seqs[0]
    outs = [
        CompletionOutput(
            o.index,
            o.text,
            list(o.token_ids),
            o.finish_reason,
            o.stop_reason,
            list(o.logprobs) if o.logprobs is not None else None,
            o.cumulative_logprob,
        )
        for o in req.outputs
    ]
    return RequestOutput(
        request_id=req.request_id,
        prompt=req.prompt,
        prompt_token_ids=req.prompt_token_ids,
        num_cached_tokens=first.num_cached_tokens,
        outputs=outs,
        finished=finished,
        metrics=req.metrics,
        prompt_logprobs=list(req.prompt_logprobs) if req.prompt_logprobs is not None else None,
    )


def delta_of(req: Any, finished: bool) -> RequestOutputDelta:
    """What req gained since its previous delta (each token and character is sent once)."""
    first_delta = not req.num_sent
    outs = []
    for position, o in enumerate(req.outputs):
        num_tokens, num_chars = req.num_sent.get(position, (0, 0))
        outs.append(
            CompletionDelta(
                o.index,
                o.text[num_chars:],
                o.token_ids[num_tokens:],
                o.logprobs[num_tokens:] if o.logprobs is not None else None,
                o.finish_reason,
                o.stop_reason,
                o.cumulative_logprob,
            )
        )
        req.num_sent[position] = (len(o.token_ids), len(o.text))
    send_prompt_logprobs = req.prompt_logprobs is not None and (first_delta or finished)
    return RequestOutputDelta(
        request_id=req.request_id,
        prompt=req.prompt,
        prompt_token_ids=req.prompt_token_ids,
        num_cached_tokens=req.seqs[0].num_cached_tokens,
        outputs=outs,
        finished=finished,
        metrics=req.metrics,
        prompt_logprobs=list(req.prompt_logprobs) if send_prompt_logprobs else None,
    )


def find_stop(text: str, emitted: int, stops: tuple[str, ...]) -> tuple[int, str] | None:
    """The earliest stop string in text that ends after position `emitted` (where new text began)."""
    longest = max(len(stop) for stop in stops)
    search_from = max(0, emitted - longest + 1)
    best: tuple[int, str] | None = None
    for stop in stops:
        at = text.find(stop, search_from)
        if at != -1 and (best is None or at < best[0]):
            best = (at, stop)
    return best


def hold_back_stop_prefix(text: str, stops: tuple[str, ...]) -> str:
    """text without its longest suffix that could still grow into a stop string.

    What a client sees only ever grows: held-back characters are released when
    the next token rules the stop out, and dropped when the stop matches.
    """
    for keep in range(max(0, len(text) - max(len(s) for s in stops) + 1), len(text)):
        tail = text[keep:]
        if any(s.startswith(tail) for s in stops):
            return text[:keep]
    return text
