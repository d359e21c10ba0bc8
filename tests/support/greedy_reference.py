"""transformers' own greedy generate, the reference engine outputs are compared with."""

from __future__ import annotations

import random

import torch
import transformers


def hf_greedy(model_dir, prompts, max_new_tokens):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    outs = []
    for ids in prompts:
        with torch.no_grad():
            gen = model.generate(
                torch.tensor([ids]),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                min_new_tokens=max_new_tokens,
                pad_token_id=0,
            )
        outs.append(gen[0, len(ids) :].tolist())
    return outs


def mixed_prompts(vocab, seed=0, lengths=(1, 5, 16, 17, 40, 75)):
    """Prompts of 1 token to several blocks; the last two share a 40-token prefix."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(8, vocab) for _ in range(n)] for n in lengths]
    shared = prompts[-2]
    prompts.append(shared + [rng.randrange(8, vocab) for _ in range(9)])
    return prompts
