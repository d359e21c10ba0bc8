"""Which requests async scheduling runs ahead of, and which make the engine step synchronously.

A step can be scheduled before the previous step's tokens are known only if
nothing it decides depends on them beyond "each running sequence gained one
token". That does not hold for (each keeps the engine synchronous while such a
request is in it; `LLMEngine` falls back to its synchronous step):
- beam search: each step's beams (forks, frees, which sequences exist) come
  from the previous step's scores;
- structured outputs: a row's grammar mask is computed from the matcher after
  it consumed the previous token;
- n > 1: the children are forked from the parent when its first token is
  sampled, sharing its blocks at that moment;
- prompt logprobs: their logits rows are scored against the request on the
  engine thread at the step that computes them.
Seeds, penalties, min_tokens, logit bias, logprobs and stop strings run ahead
(the sampler sees no placeholder: `Sequence.num_placeholders`). A
tensor-parallel replica steps synchronously (its ranks' step protocol is
lockstep), as does an engine with `--compile` (the compiled graph is called
from the engine thread).
"""

from __future__ import annotations

from pagedinfer.engine.beam.params import BeamSearchParams
from pagedinfer.engine.sampling_params import SamplingParams


def sync_reason(params: SamplingParams | BeamSearchParams) -> str | None:
    """Why a request with these parameters keeps the engine synchronous (None: it runs ahead)."""
    if isinstance(params, BeamSearchParams):
        return "beam search"
    if params.structured_outputs is not None:
        return "structured outputs"
    if params.n > 1:
        return "n > 1"
    if params.prompt_logprobs is not None:
        return "prompt logprobs"
    return None
