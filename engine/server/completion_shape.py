"""What a completions request asks of its choices beyond the tokens: echo, best_of, prompt logprobs.

- `echo`: each choice's text starts with the prompt, and with `logprobs` its
  tokens lead the logprobs, scored by the engine's prompt logprobs (the first
  token has none: null, as OpenAI and vLLM report it). `max_tokens: 0` is
  allowed with echo (lm-evaluation-harness scores a prompt that way): the
  engine must sample one token, which the response drops, as vLLM does.
- `best_of` > n: the engine samples best_of completions and the response
  keeps the n with the highest cumulative logprob (vLLM's semantics), so the
  engine computes the sampled tokens' logprobs even when `logprobs` is null.
- vLLM's `prompt_logprobs` field: each choice carries the engine's prompt
  logprobs as vLLM returns them (token id -> logprob, rank, decoded token).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CompletionShape:
    echo: bool = False
    drop_generated: bool = False  # echo with max_tokens 0: the one sampled token is not returned
    best_of: int | None = None  # completions the engine samples, when more than the n returned
    n: int = 1  # completions returned per prompt
    prompt_logprobs: int | None = None  # vLLM's prompt_logprobs field, reported per choice
    prompt_texts: tuple[str | None, ...] = ()  # the prompts as sent, None for token ids (echo decodes them)

    @classmethod
    def of(cls, req, prompt_texts: list[str | None]) -> CompletionShape:
        best_of = req.best_of if req.best_of is not None and req.best_of > req.n else None
        return cls(
            echo=req.echo,
            drop_generated=bool(req.echo and req.max_tokens == 0),
            best_of=best_of,
            n=req.n,
            prompt_logprobs=req.prompt_logprobs,
            prompt_texts=tuple(prompt_texts),
        )

    def engine_max_tokens(self, max_tokens: int | None) -> int | None:
        return 1 if self.drop_generated else max_tokens

    def engine_logprobs(self, logprobs: int | None) -> int | None:
        """Sampled-token logprobs the engine computes: best_of ranks by them even when none are reported."""
        return logprobs if logprobs is not None or self.best_of is None else 0

    def engine_prompt_logprobs(self, logprobs: int | None) -> int | None:
        candidates = [k for k in (self.prompt_logprobs, logprobs if self.echo else None) if k is not None]
        return max(candidates) if candidates else None
