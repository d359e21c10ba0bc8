"""Engine outputs to OpenAI response bodies (whole responses and SSE chunks).

Choice numbering: prompt i's completion j is choice `i * n + j`, as OpenAI
numbers choices for a list of prompts. Usage counts each prompt once (not
once per completion) and reports prefix-cache hits as
`prompt_tokens_details.cached_tokens`.

Streaming: the engine's text and token ids are cumulative, so a `DeltaTracker`
remembers, per choice, how much text and how many tokens were already sent
and emits only what is new. With n > 1 the engine keeps reporting a finished
completion in every later output of its prompt; the tracker sends each
choice's finish chunk (the one with `finish_reason`) exactly once and nothing
for that choice after it. With `stream_options.include_usage` every chunk
carries `"usage": null` and a last chunk with no choices carries the usage,
as OpenAI streams them.
"""

from __future__ import annotations

import json
from typing import Any

from pagedinfer.engine.server.serving import Plan
from pagedinfer.engine.server.token_bytes import token_bytes
from pagedinfer.engine.server.tools import calls as tool_calls

MISSING_LOGPROB = -9999.0  # OpenAI's stand-in for "not in the top-k"; JSON has no -inf


def usage(plan: Plan, finals: list[Any]) -> dict:
    prompt_tokens = sum(len(p) for p in plan.prompts)
    completion_tokens = (
        0
        if plan.completion.drop_generated
        else sum(len(c.token_ids) for out in finals if out is not None for c in out.outputs)
    )
    cached_tokens = sum((out.num_cached_tokens or 0) for out in finals if out is not None)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def _decoded(tokenizer: Any, token_id: int, entry: Any) -> str:
    text = getattr(entry, "decoded_token", None)
    return text if text is not None else tokenizer.decode([token_id])


def _top_entries(tokenizer: Any, step: dict, k: int) -> list[tuple[int, str, float]]:
    """(token id, text, logprob) of the k most likely tokens of one step."""
    ranked = sorted(step.items(), key=lambda item: item[1].rank if item[1].rank is not None else 1 << 30)
    return [(token_id, _decoded(tokenizer, token_id, entry), float(entry.logprob)) for token_id, entry in ranked[:k]]


def completion_logprobs(tokenizer: Any, token_ids: list[int], steps: list[dict], k: int, text_offset: int) -> dict:
    """OpenAI's legacy completion logprobs for tokens[start:] (tokens, token_logprobs, top_logprobs, text_offset)."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for token_id, step in zip(token_ids, steps):
        entry = step.get(token_id)
        text = _decoded(tokenizer, token_id, entry)
        tokens.append(text)
        token_logprobs.append(float(entry.logprob) if entry is not None else MISSING_LOGPROB)
        tops.append({t: lp for _, t, lp in _top_entries(tokenizer, step, k)} if k else {})
        offsets.append(text_offset)
        text_offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(tokenizer: Any, token_ids: list[int], steps: list[dict], k: int) -> dict:
    """OpenAI's chat logprobs; each `bytes` is the token's own bytes (token_bytes.py), also mid-character."""
    content = []
    for token_id, step in zip(token_ids, steps):
        entry = step.get(token_id)
        text = _decoded(tokenizer, token_id, entry)
        top = [
            {"token": t, "logprob": lp, "bytes": list(token_bytes(tokenizer, top_id, t))}
            for top_id, t, lp in _top_entries(tokenizer, step, k)
        ]
        content.append(
            {
                "token": text,
                "logprob": float(entry.logprob) if entry is not None else MISSING_LOGPROB,
                "bytes": list(token_bytes(tokenizer, token_id, text)),
                "top_logprobs": top,
            }
        )
    return {"content": content}


def _choices(plan: Plan, finals: list[Any]) -> list[tuple[int, Any]]:
    n = plan.params.n
    pairs = [(i * n + c.index, c) for i, out in enumerate(finals) for c in out.outputs]
    return sorted(pairs, key=lambda pair: pair[0])


def _best_of(plan: Plan, finals: list[Any]) -> list[tuple[int, int, Any]]:
    """(choice index, prompt index, completion): with best_of > n, each prompt's n best by cumulative logprob."""
    shape = plan.completion
    n = shape.n if shape.best_of is not None else plan.params.n
    picked = []
    for i, out in enumerate(finals):
        candidates = sorted(out.outputs, key=lambda c: c.index)
        if shape.best_of is not None:
            candidates = sorted(candidates, key=_cumulative_logprob, reverse=True)[:n]
        picked.extend((i * n + rank, i, c) for rank, c in enumerate(candidates))
    return picked


def _cumulative_logprob(c: Any) -> float:
    return sum(step[token].logprob for token, step in zip(c.token_ids, c.logprobs or []))


def _echoed_text(plan: Plan, tokenizer: Any, prompt_index: int, out: Any) -> str:
    """The prompt as echoed: as sent, or its token ids decoded."""
    texts = plan.completion.prompt_texts
    if prompt_index < len(texts) and texts[prompt_index] is not None:
        return texts[prompt_index]
    return tokenizer.decode(out.prompt_token_ids)


def _prompt_part(plan: Plan, tokenizer: Any, prompt_index: int, out: Any) -> tuple[str, dict | None]:
    """An echoed prompt's text and, with logprobs, its OpenAI logprobs (the first token's null)."""
    text = _echoed_text(plan, tokenizer, prompt_index, out)
    if plan.num_logprobs is None:
        return text, None
    k = plan.num_logprobs
    tokens, token_logprobs, tops, offsets = [], [], [], []
    offset = 0
    for position, token_id in enumerate(out.prompt_token_ids):
        step = out.prompt_logprobs[position] if out.prompt_logprobs else None
        token = _decoded(tokenizer, token_id, step.get(token_id) if step else None)
        tokens.append(token)
        token_logprobs.append(float(step[token_id].logprob) if step else None)
        tops.append(({t: lp for _, t, lp in _top_entries(tokenizer, step, k)} if k else {}) if step else None)
        offsets.append(offset)
        offset += len(token)
    return text, {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}


def _vllm_prompt_logprobs(out: Any) -> list | None:
    if out.prompt_logprobs is None:
        return None
    return [
        None
        if step is None
        else {
            str(t): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": lp.decoded_token}
            for t, lp in step.items()
        }
        for step in out.prompt_logprobs
    ]


def completion_choice(
    plan: Plan, tokenizer: Any, prompt_index: int, out: Any, c: Any, sent_chars: int = 0, sent_tokens: int = 0
) -> tuple[str, dict | None]:
    """(text, logprobs) of choice c from sent_chars/sent_tokens on, the echoed prompt leading a first part.

    With echo, the generated tokens' text_offset counts the prompt's text before them, in every part."""
    shape = plan.completion
    text, ids, steps = c.text[sent_chars:], c.token_ids[sent_tokens:], (c.logprobs or [])[sent_tokens:]
    if shape.drop_generated:
        text, ids, steps = "", [], []
    logprobs = None
    if plan.num_logprobs is not None and c.logprobs is not None:
        echoed_chars = len(_echoed_text(plan, tokenizer, prompt_index, out)) if shape.echo and sent_tokens else 0
        logprobs = completion_logprobs(tokenizer, ids, steps, plan.num_logprobs, echoed_chars + sent_chars)
    if not shape.echo or sent_chars or sent_tokens:
        return text, logprobs
    prompt_text, prompt_logprobs = _prompt_part(plan, tokenizer, prompt_index, out)
    if logprobs is not None and prompt_logprobs is not None:
        logprobs["text_offset"] = [o + len(prompt_text) for o in logprobs["text_offset"]]
        logprobs = {key: prompt_logprobs[key] + logprobs[key] for key in logprobs}
    return prompt_text + text, logprobs


def completion_response(plan: Plan, finals: list[Any], tokenizer: Any) -> dict:
    choices = []
    for index, prompt_index, c in _best_of(plan, finals):
        text, logprobs = completion_choice(plan, tokenizer, prompt_index, finals[prompt_index], c)
        choice = {
            "index": index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason,
        }
        if plan.completion.prompt_logprobs is not None:
            choice["prompt_logprobs"] = _vllm_prompt_logprobs(finals[prompt_index])
        choices.append(choice)
    return {
        "id": plan.request_id,
        "object": "text_completion",
        "created": plan.created,
        "model": plan.model,
        "choices": choices,
        "usage": usage(plan, finals),
    }


def chat_response(plan: Plan, finals: list[Any], tokenizer: Any) -> dict:
    choices = []
    for index, c in _choices(plan, finals):
        logprobs = None
        if plan.num_logprobs is not None and c.logprobs is not None:
            logprobs = chat_logprobs(tokenizer, c.token_ids, c.logprobs, plan.num_logprobs)
        message, called = (
            ({"role": "assistant", "content": c.text}, False)
            if plan.tools is None
            else tool_calls.message(plan.tools, c.text)
        )
        finish_reason = "tool_calls" if called and c.finish_reason == "stop" else c.finish_reason
        choices.append(
            {
                "index": index,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": finish_reason,
                "stop_reason": c.stop_reason,
            }
        )
    return {
        "id": plan.request_id,
        "object": "chat.completion",
        "created": plan.created,
        "model": plan.model,
        "choices": choices,
        "usage": usage(plan, finals),
    }


def sse(payload: dict | str) -> str:
    body = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {body}\n\n"


class DeltaTracker:
    """Turns cumulative outputs into stream chunks (one chunk per choice that changed)."""

    def __init__(self, plan: Plan, tokenizer: Any, chat: bool) -> None:
        self.plan = plan
        self.tokenizer = tokenizer
        self.chat = chat
        self._sent_chars: dict[int, int] = {}
        self._sent_tokens: dict[int, int] = {}
        self._finished: set[int] = set()  # choices whose finish chunk was sent
        self._streamed_args: dict[int, list[int]] = {}  # per choice, the argument characters sent per call
        self.finals: list[Any] = [None] * len(plan.prompts)

    def _envelope(self, choices: list[dict]) -> dict:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        payload = {
            "id": self.plan.request_id,
            "object": kind,
            "created": self.plan.created,
            "model": self.plan.model,
            "choices": choices,
        }
        if self.plan.include_usage:
            payload["usage"] = None
        return payload

    def opening_chunks(self) -> list[str]:
        """Chat streams announce the assistant role once per choice before any content."""
        if not self.chat:
            return []
        num_choices = len(self.plan.prompts) * self.plan.params.n
        return [
            sse(
                self._envelope(
                    [
                        {
                            "index": i,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ]
                )
            )
            for i in range(num_choices)
        ]

    def chunks(self, prompt_index: int, output: Any) -> list[str]:
        if output.finished:
            self.finals[prompt_index] = output
        out = []
        for c in output.outputs:
            index = prompt_index * self.plan.params.n + c.index
            if index in self._finished:
                continue
            sent_chars = self._sent_chars.get(index, 0)
            sent_tokens = self._sent_tokens.get(index, 0)
            delta_text = c.text[sent_chars:]
            new_tokens = len(c.token_ids) - sent_tokens
            if not delta_text and new_tokens <= 0 and c.finish_reason is None:
                continue
            logprobs = None
            if not self.chat:
                delta_text, logprobs = completion_choice(
                    self.plan, self.tokenizer, prompt_index, output, c, sent_chars, sent_tokens
                )
                if logprobs is not None and not logprobs["tokens"]:
                    logprobs = None
            elif self.plan.num_logprobs is not None and c.logprobs is not None and new_tokens > 0:
                ids, steps = c.token_ids[sent_tokens:], c.logprobs[sent_tokens:]
                logprobs = chat_logprobs(self.tokenizer, ids, steps, self.plan.num_logprobs)
            self._sent_chars[index] = len(c.text)
            self._sent_tokens[index] = len(c.token_ids)
            choice: dict[str, Any] = {"index": index, "logprobs": logprobs, "finish_reason": c.finish_reason}
            if self.chat and self.plan.tools is not None:
                choice["delta"], called = self._tool_delta(index, c, sent_chars)
                if called and c.finish_reason == "stop":
                    choice["finish_reason"] = "tool_calls"
                if not choice["delta"] and c.finish_reason is None:
                    continue
            elif self.chat:
                choice["delta"] = {"content": delta_text} if delta_text or c.finish_reason is None else {}
            else:
                choice["text"] = delta_text
            if c.finish_reason is not None:
                choice["stop_reason"] = c.stop_reason
                self._finished.add(index)
            out.append(sse(self._envelope([choice])))
        return out

    def _tool_delta(self, index: int, c: Any, sent_chars: int) -> tuple[dict, bool]:
        """A tools choice's delta: content up to where calls may start; at the end, the rest and the calls."""
        plan = self.plan.tools
        if plan.mode in ("named", "required"):  # the calls' arguments stream as they grow, as OpenAI streams them
            deltas = self._argument_deltas(index, tool_calls.growing_calls(plan, c.text))
            return ({"tool_calls": deltas} if deltas else {}), True
        if c.finish_reason is None:
            limit = max(sent_chars, tool_calls.streamable_chars(plan, c.text))
            self._sent_chars[index] = limit
            return ({"content": c.text[sent_chars:limit]} if limit > sent_chars else {}), False
        content, calls = tool_calls.stream_finish(plan, c.text, sent_chars)
        delta: dict[str, Any] = {"content": content} if content else {}
        if calls:
            delta["tool_calls"] = calls
        return delta, bool(calls)

    def _argument_deltas(self, index: int, calls: list[tuple[str, str]]) -> list[dict]:
        """OpenAI's tool_calls deltas for (name, arguments so far) calls: a call's first with id and name."""
        sent = self._streamed_args.setdefault(index, [])
        deltas = []
        for i, (name, arguments) in enumerate(calls):
            if i == len(sent):
                deltas.append(
                    {
                        "index": i,
                        "id": tool_calls.new_call_id(),
                        "type": "function",
                        "function": {"name": name, "arguments": arguments},
                    }
                )
                sent.append(len(arguments))
            elif len(arguments) > sent[i]:
                deltas.append({"index": i, "function": {"arguments": arguments[sent[i] :]}})
                sent[i] = len(arguments)
        return deltas

    def usage_chunk(self) -> str:
        payload = self._envelope([])
        payload["usage"] = usage(self.plan, self.finals)
        return sse(payload)
