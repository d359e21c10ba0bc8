"""The engine's side of beam search: a request's live beams as one `SequenceGroup`.

Each engine step (`step_beams`), every live beam whose last token was computed reports the
top tokens of its log-softmax (`top_candidates`, one topk and one host copy
for all beam rows of the step) to its request's `BeamSearch`. Once all of a
group's beams have reported (normally in the same step: the scheduler runs a
group as one unit), `advance` applies the search's `BeamStep`:
- a parent with one surviving child continues as that child (appends the token);
- a parent with more forks the extra children first: they share its whole
  block table (reference counts up, no copy); the shared last block is copied
  only when two of them write it (copy-on-write, in the next step's allocation);
- a parent with no surviving child is pruned: finished, its blocks freed at once.
Finished hypotheses need no blocks: they are token lists in the search.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pagedinfer.engine.beam.params import BeamSearchParams
from pagedinfer.engine.beam.search import BeamSearch, BeamStep
from pagedinfer.engine.outputs import CompletionOutput
from pagedinfer.engine.sequence import Sequence, SequenceGroup

PRUNED = "pruned"  # finish reason of a beam that no candidate continues (never reported to users)


def max_group_blocks(num_prompt_tokens: int, params: BeamSearchParams, block_size: int) -> int:
    """The most blocks a beam group can hold at once: its longest beam's blocks, plus, for every
    other beam, its own blocks from the one where the prompt ends (all beams diverging right there)."""
    total = -(-(num_prompt_tokens + params.max_tokens) // block_size)
    own = total - num_prompt_tokens // block_size
    return total + (params.beam_width - 1) * own


def check_beam_request(
    num_prompt_tokens: int,
    params: BeamSearchParams,
    max_num_seqs: int,
    num_gpu_blocks: int,
    block_size: int,
    width_name: str = "beam_width",
) -> None:
    """Raise ValueError (naming the parameter: width_name is what the caller calls the beam width)
    if the beam search could never run in this engine."""
    if params.beam_width > max_num_seqs:
        raise ValueError(f"{width_name}: {params.beam_width} beams exceed max_num_seqs={max_num_seqs}")
    needed = max_group_blocks(num_prompt_tokens, params, block_size)
    if needed > num_gpu_blocks:
        raise ValueError(
            f"{width_name}: {params.beam_width} beams of up to {params.max_tokens} tokens after a"
            f" {num_prompt_tokens}-token prompt may need {needed} KV blocks; the pool has {num_gpu_blocks}."
            f" Lower {width_name} or max_tokens"
        )


def new_search(params: BeamSearchParams, eos_token_ids: set[int]) -> BeamSearch:
    return BeamSearch(
        params.beam_width,
        params.max_tokens,
        float(params.length_penalty),
        frozenset() if params.ignore_eos else frozenset(eos_token_ids),
    )


def start(req: Any, params: BeamSearchParams, eos_token_ids: set[int]) -> Sequence:
    """Give a new beam-search request (the engine's `EngineRequest`) its search and its group with one live beam,
    the leader, holding the prompt; returns the leader, to be queued."""
    req.group = SequenceGroup(req.request_id, params.beam_width, [])
    req.beam = new_search(params, eos_token_ids)
    seq = Sequence(
        request_id=req.request_id,
        prompt_token_ids=req.prompt_token_ids,
        params=params.beam_sampling_params(),
        arrival_time=req.metrics.arrival_time,
        prompt=req.prompt,
        group=req.group,
    )
    req.group.seqs.append(seq)
    req.seqs.append(seq)
    return seq


def top_candidates(logits: Any, k: int) -> list[list[tuple[int, float]]]:
    """Per row of logits [rows, vocab], its top k (token, log-probability) pairs, best first (float32,
    as transformers' log_softmax over float32 logits)."""
    import torch

    logprobs = torch.log_softmax(logits.to(torch.float32), dim=-1)
    top = torch.topk(logprobs, min(k, logprobs.shape[-1]), dim=-1)
    return [list(zip(ids, values)) for ids, values in zip(top.indices.tolist(), top.values.tolist())]


def advance(scheduler: Any, group: SequenceGroup, step: BeamStep, fork: Callable[[Sequence], Sequence]) -> None:
    """Apply one beam step to the group's sequences (see the module docstring)."""
    old = group.seqs
    if step.done:
        for seq in old:
            scheduler.finish(seq, PRUNED)
        return
    continuing: set[int] = set()
    children: list[Sequence] = []
    for p in step.parents:
        if p in continuing:
            children.append(fork(old[p]))  # before any token is appended: it shares all of old[p]'s blocks
        else:
            continuing.add(p)
            children.append(old[p])
    for i, seq in enumerate(old):
        if i not in continuing:
            scheduler.finish(seq, PRUNED)
    for child, token in zip(children, step.tokens):
        child.token_ids.append(token)
    group.seqs = children


def step_beams(
    logits: Any,
    rows: list[int],
    seqs: list[Sequence],
    requests: Mapping[str, Any],
    scheduler: Any,
    fork: Callable[[Sequence], Sequence],
    tokenizer: Any,
    now: float,
) -> tuple[list[Any], int]:
    """Report a step's beam rows (`rows` of logits, of the live beams `seqs`) to their requests' searches, and
    `advance` each group whose beams have all reported.

    Returns the requests whose search finished (a beam search reports only its final output) and the tokens
    the step generated: one per new live beam; the last step's tokens end the beams that produced them."""
    import torch

    reqs = [requests[seq.request_id] for seq in seqs]
    k = max(req.beam.num_candidates for req in reqs)
    tops = top_candidates(logits[torch.tensor(rows, device=logits.device)], k)
    ready: dict[str, Any] = {}
    for seq, req, top in zip(seqs, reqs, tops):
        req.beam.report(req.group.seqs.index(seq), top)
        if req.beam.ready:
            ready[req.request_id] = req
    num_tokens = 0
    for req in ready.values():
        num_live = len(req.group.seqs)
        step = req.beam.step()
        advance(scheduler, req.group, step, fork)
        num_tokens += num_live if step.done else len(step.tokens)
        if req.metrics.first_token_time is None:
            req.metrics.first_token_time = now
        req.metrics.last_token_time = now
        if step.done:
            req.outputs = completions(req.beam, req.params, tokenizer)
    return [req for req in ready.values() if req.finished], num_tokens


def completions(search: BeamSearch, params: BeamSearchParams, tokenizer: Any) -> list[CompletionOutput]:
    """The finished search's hypotheses, best first, as completions (text without a final EOS's
    text unless include_stop_str_in_output; special tokens skipped)."""
    outs = []
    for i, h in enumerate(search.hypotheses):
        shown = h.token_ids[:-1] if h.finish_reason == "stop" and not params.include_stop_str_in_output else h.token_ids
        outs.append(
            CompletionOutput(
                index=i,
                text=tokenizer.decode(list(shown), skip_special_tokens=True),
                token_ids=list(h.token_ids),
                finish_reason=h.finish_reason,
                cumulative_logprob=h.cum_logprob,
            )
        )
    return outs
