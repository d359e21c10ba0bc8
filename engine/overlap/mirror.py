"""The output side's own state, as the output process holds it (`EngineConfig.overlap == "process"`).

The engine never ships a `Sequence` or a request: per step it sends a
`StepMessage` of plain tuples with only what changed, and this module keeps,
per request, what `text.py` reads and writes (the outputs' token ids, text and
logprobs, each sequence's detokenizer, output text and stop-string state, the
request's `num_sent`). `text.py`'s functions run on these mirror objects as
they run on the engine's in the other modes: one implementation of
detokenization, stop strings and deltas.

Wire shapes (pickle protocol 5, tuples and lists only, except the
`CompletionOutput`s of a finished beam search and the logprob dicts), engine -> child:
- new request, once, with its first touched step: `NewRequest`;
- token: `(key, seq index, token id, logprobs | None, num output tokens, early finish,
  early stop reason, late finish)` (a `TokenItem` without its objects);
- touched request: `(key, num_cached_tokens, beam outputs | None)`;
- frees: keys of requests the engine aborted (a finished request is freed
  here when its finished output is built).
Back: `StepReply` (each output's completions as tuples, without the prompt).
Invariants: a key is known here from its `NewRequest` until its finished
output or its free, so the state is bounded by the engine's live requests;
keys are never reused (a request id may come back after an abort).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from pagedinfer.engine.detokenizer import IncrementalDetokenizer
from pagedinfer.engine.outputs import CompletionOutput
from pagedinfer.engine.overlap.text import OutputBatch, TokenItem, process_batch


class TextParams(NamedTuple):
    """What `text.py` reads of a sequence's SamplingParams (its `params` here)."""

    stop_strings: tuple[str, ...]
    include_stop_str_in_output: bool
    min_tokens: int
    skip_special_tokens: bool
    has_logprobs: bool  # the outputs carry per-token logprobs


class NewRequest(NamedTuple):
    key: int
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: TextParams | None  # None: a beam search (its outputs come whole, when it is done)
    n: int
    prompt_logprobs: list | None  # complete by the request's first token


class StepMessage(NamedTuple):
    """One step's crossing, engine -> output process."""

    cumulative: bool
    frees: list[int]
    news: list[NewRequest]
    tokens: list[tuple]
    touched: list[tuple]


class StepReply(NamedTuple):
    """What the output process made of a `StepMessage`."""

    # per touched request: (key, finished, num_cached_tokens, each completion's fields in order, prompt logprobs);
    # the engine rebuilds the RequestOutput(Delta) with its own prompt, prompt ids and metrics (not sent back)
    outputs: list[tuple[int, bool, int, list[tuple], list | None]]
    stopped: list[tuple[int, int]]  # (key, seq index) ended by a stop string
    num_batches: int  # processed so far (by this process)
    num_requests: int  # requests whose state it holds after this batch


class _BeamDone:
    done = True  # text.outputs_finished reads `req.beam.done`; a beam search crosses only when done


class MirrorSeq:
    """What text.py reads and writes of a `Sequence`."""

    __slots__ = ("key", "index", "params", "output_text", "detok", "num_cached_tokens")

    def __init__(self, key: int, index: int, params: TextParams | None, detok: Any) -> None:
        self.key, self.index, self.params, self.detok = key, index, params, detok
        self.output_text = ""
        self.num_cached_tokens = 0


class MirrorRequest:
    """What text.py reads and writes of the engine's `EngineRequest` (metrics: attached by the engine)."""

    __slots__ = (
        "request_id",
        "prompt",
        "prompt_token_ids",
        "metrics",
        "outputs",
        "seqs",
        "beam",
        "prompt_logprobs",
        "num_sent",
    )

    def __init__(self, new: NewRequest, seqs: list[MirrorSeq], outputs: list[CompletionOutput]) -> None:
        self.request_id, self.prompt, self.prompt_token_ids = new.request_id, new.prompt, new.prompt_token_ids
        self.prompt_logprobs = new.prompt_logprobs
        self.metrics = None
        self.seqs, self.outputs = seqs, outputs
        self.beam = None if new.params is not None else _BeamDone()
        self.num_sent: dict[int, tuple[int, int]] = {}


class OutputMirror:
    """The output process's requests; `apply` runs one step's message through text.py."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.requests: dict[int, MirrorRequest] = {}
        self.num_batches = 0
        self._pieces: dict[bool, dict[int, str]] = {True: {}, False: {}}  # the detokenizers' decode memo

    def apply(self, message: StepMessage) -> StepReply:
        requests = self.requests
        for key in message.frees:
            requests.pop(key, None)
        for new in message.news:
            requests[new.key] = self._new_request(new)
        items = []
        for key, index, token, logprobs, num_output_tokens, early, stop_reason, late in message.tokens:
            req = requests[key]
            items.append(
                TokenItem(
                    req.seqs[index], req.outputs[index], token, logprobs, num_output_tokens, early, stop_reason, late
                )
            )
        touched = []
        for key, num_cached_tokens, beam_outputs in message.touched:
            req = requests[key]
            req.seqs[0].num_cached_tokens = num_cached_tokens
            if beam_outputs is not None:
                req.outputs = beam_outputs
            touched.append(req)
        processed = process_batch(OutputBatch(items, touched, message.cumulative), self.tokenizer)
        self.num_batches += 1
        outputs = []
        for req, output, finished in processed.outputs:
            key = req.seqs[0].key
            if finished:
                del requests[key]
            outputs.append(
                (
                    key,
                    finished,
                    output.num_cached_tokens,
                    [tuple(o.__dict__.values()) for o in output.outputs],
                    output.prompt_logprobs,
                )
            )
        return StepReply(outputs, [(seq.key, seq.index) for seq in processed.stopped], self.num_batches, len(requests))

    def _new_request(self, new: NewRequest) -> MirrorRequest:
        p = new.params
        if p is None:  # beam search: only its num_cached_tokens and final outputs are read
            return MirrorRequest(new, [MirrorSeq(new.key, 0, None, None)], [])
        pieces = self._pieces[p.skip_special_tokens]
        # every completion of n > 1 starts from the prompt (forks happen before the first token)
        seqs = [
            MirrorSeq(
                new.key,
                i,
                p,
                IncrementalDetokenizer(self.tokenizer, new.prompt_token_ids, p.skip_special_tokens, pieces),
            )
            for i in range(new.n)
        ]
        outputs = [CompletionOutput(index=i, logprobs=[] if p.has_logprobs else None) for i in range(new.n)]
        return MirrorRequest(new, seqs, outputs)
