"""A step's host inputs, read from its sequences, and how the forward's logits rows split back (pure of device
state: async scheduling prepares a step on the engine thread and runs it later on the forward thread)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedinfer.engine.distributed.step_message import StepInputs
from pagedinfer.engine.scheduler import SchedulerOutput


def prepare_step(
    sched: SchedulerOutput,
    sample_seq_ids: set[int],
    prompt_logprob_seq_ids: frozenset[int] | set[int] = frozenset(),
) -> PreparedStep:
    """`ModelRunner.execute`'s host half: the step's inputs, read from the sequences now (async scheduling runs
    the forward later, on its own thread: engine/async_step/)."""
    # decodes (one new token) first, as the attention metadata requires
    items = sorted(sched.scheduled, key=lambda it: it.num_new_tokens != 1)
    ids: list[int] = []
    seq_ids: list[int] = []
    seq_lens: list[int] = []
    query_lens: list[int] = []
    keep: list[int] = []
    keep_ids: list[int] = []
    # (seq_id, first target position, flat index of its first row, rows)
    prompt_keep: list[tuple[int, int, int, int]] = []
    for it in items:
        start = it.seq.num_computed_tokens
        end = start + it.num_new_tokens
        if it.seq.seq_id in prompt_logprob_seq_ids and start < it.seq.num_prompt_tokens - 1:
            last = min(end, it.seq.num_prompt_tokens - 1)  # the last prompt position predicts no prompt token
            prompt_keep.append((it.seq.seq_id, start + 1, len(ids), last - start))
        ids.extend(it.seq.token_ids[start:end])
        seq_ids.append(it.seq.seq_id)
        seq_lens.append(end)
        query_lens.append(it.num_new_tokens)
        if it.seq.seq_id in sample_seq_ids:
            keep.append(len(ids) - 1)
            keep_ids.append(it.seq.seq_id)
    for _, _, flat, count in prompt_keep:
        keep.extend(range(flat, flat + count))
    if not keep:
        keep, keep_ids = [len(ids) - 1], []  # logits_to_keep must select something
    return PreparedStep(
        StepInputs(
            ids,
            seq_ids,
            seq_lens,
            query_lens,
            keep,
            sched.table_deltas,
            sched.blocks_to_copy,
            sched.blocks_to_swap_out,
            sched.blocks_to_swap_in,
            sched.tier_copies.stores,
            sched.tier_copies.loads,
        ),
        keep_ids,
        tuple(prompt_keep),
    )


@dataclass(frozen=True)
class PreparedStep:
    """A step's inputs for `ModelRunner.run_step`, and how its logits rows split (`prepare_step`)."""

    inputs: StepInputs
    sampled_seq_ids: list[int]  # the seq_id of each of the first len(sampled_seq_ids) logits rows
    prompt_keep: tuple[tuple[int, int, int, int], ...]  # (seq_id, first target, flat index, rows): prompt logprobs

    def split(self, logits: torch.Tensor) -> tuple[torch.Tensor, list[int], dict[int, PromptLogits]]:
        """`ModelRunner.execute`'s result from the forward's logits."""
        num_sampled = len(self.sampled_seq_ids)
        prompt_logits: dict[int, PromptLogits] = {}
        row = num_sampled
        for seq_id, first_target, _, count in self.prompt_keep:
            prompt_logits[seq_id] = PromptLogits(first_target, logits[row : row + count])
            row += count
        return logits[:num_sampled].float(), self.sampled_seq_ids, prompt_logits


@dataclass(frozen=True)
class PromptLogits:
    """A sequence's prompt-position logits from one step: rows i predicts prompt token first_target + i."""

    first_target: int  # the prompt position whose token row 0 predicts
    logits: torch.Tensor  # [num_targets, vocab], the model's dtype
