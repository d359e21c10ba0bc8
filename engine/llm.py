"""LLM: the offline API (vLLM-compatible names)."""

from __future__ import annotations

import itertools
from typing import Any, Sequence

from pagedinfer.engine.config import EngineConfig
from pagedinfer.engine.llm_engine import LLMEngine
from pagedinfer.engine.outputs import EngineStats, RequestOutput
from pagedinfer.engine.sampling_params import SamplingParams


class LLM:
    """Generate completions for a batch of prompts with continuous batching.

        llm = LLM(model="path/to/hf_model_dir", block_size=16)
        outs = llm.generate(["Hello"], SamplingParams(temperature=0.0, max_tokens=32))
    """

    def __init__(self, model: str, **kwargs: Any) -> None:
        self.llm_engine = LLMEngine(EngineConfig(model=str(model), **kwargs))
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def generate(self, prompts: str | Sequence[str] | Sequence[Sequence[int]],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in prompt order.

        All prompts are validated before any is queued, so a bad one raises
        ValueError and leaves the engine untouched.
        """
        engine = self.llm_engine
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # one prompt (text or token ids)
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"sampling_params: got {len(params)} for {len(prompts)} prompts")
        tokenized = []
        for prompt, p in zip(prompts, params):
            ids = engine.tokenize(prompt)
            engine.check_request(ids, p)
            tokenized.append(ids)
        request_ids = []
        for prompt, ids, p in zip(prompts, tokenized, params):
            rid = f"llm-{next(self._ids)}"
            engine.add_request(rid, prompt, p, prompt_token_ids=ids)
            request_ids.append(rid)
        finished: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(prompts), desc="generate", unit="req")
        try:
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished:
                        finished[out.request_id] = out
                        if bar:
                            bar.update(1)
        except BaseException:
            engine.abort_request(request_ids)
            raise
        finally:
            if bar:
                bar.close()
        return [finished[rid] for rid in request_ids]

    def get_stats(self) -> EngineStats:
        return self.llm_engine.get_stats()
