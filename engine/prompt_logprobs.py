"""Prompt logprobs (vLLM's `prompt_logprobs=k`): each prompt token's logprob given its prefix, plus the top k.

The model runner keeps, for a request that asks, the logits of every prompt
position computed in a step (position p predicts token p + 1) from the same
packed forward as the step's samples. This turns all such rows of a step into
`Logprob` dicts at once: one log-softmax, one gather, one top-k over the
widest k, and one host transfer. The first prompt token has no prefix and
gets None, as in vLLM.

Cost: such a request keeps num_prompt_tokens x vocab logits (in the model's
dtype) per step instead of one row, and takes no prefix-cache hits (the
scheduler recomputes its whole prompt, see `scheduler.py`).
"""

from __future__ import annotations

import torch

from pagedinfer.engine.outputs import Logprob


def prompt_logprobs(logits: torch.Tensor, targets: list[int], ks: list[int]) -> list[dict[int, Logprob]]:
    """Row i of logits [m, vocab] scored at token targets[i], plus its top ks[i] tokens."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    target = torch.tensor(targets, device=logits.device)[:, None]
    chosen = logprobs.gather(1, target)
    ranks = (logprobs > chosen).sum(dim=-1) + 1
    widest = max(ks)
    top = torch.topk(logprobs, widest, dim=-1) if widest else None
    chosen_list, ranks_list = chosen[:, 0].tolist(), ranks.tolist()
    top_values = top.values.tolist() if top is not None else [[] for _ in targets]
    top_ids = top.indices.tolist() if top is not None else [[] for _ in targets]
    out = []
    for token, lp, rank, values, ids, k in zip(targets, chosen_list, ranks_list, top_values, top_ids, ks):
        entry = {token: Logprob(lp, rank)}
        for r, (v, i) in enumerate(zip(values[:k], ids[:k]), start=1):
            entry.setdefault(i, Logprob(v, r))
        out.append(entry)
    return out


def record_prompt_logprobs(sched, prompt_logits: dict, requests: dict, tokenizer) -> None:
    """Score a step's prompt positions (all requests at once) into their requests' `prompt_logprobs`
    (`requests`: the engine's, by request id; `prompt_logits`: the runner's, by seq_id).

    A prompt recomputed after a preemption overwrites its entries with the same values.
    """
    seqs = {it.seq.seq_id: it.seq for it in sched.scheduled}
    rows, targets, ks, slots = [], [], [], []
    for seq_id, part in prompt_logits.items():
        seq = seqs[seq_id]
        req = requests.get(seq.request_id)
        if req is None or req.prompt_logprobs is None:
            continue
        count = part.logits.shape[0]
        rows.append(part.logits)
        targets.extend(seq.prompt_token_ids[part.first_target : part.first_target + count])
        ks.extend([seq.params.prompt_logprobs] * count)
        slots.extend((req, part.first_target + i) for i in range(count))
    if not rows:
        return
    texts: dict[int, str] = {}  # each token decoded once per step
    for (req, position), entry in zip(slots, prompt_logprobs(torch.cat(rows), targets, ks)):
        for tid in entry.keys() - texts.keys():
            texts[tid] = tokenizer.decode([tid])
        req.prompt_logprobs[position] = {tid: Logprob(lp.logprob, lp.rank, texts[tid]) for tid, lp in entry.items()}
