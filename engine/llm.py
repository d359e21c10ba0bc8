"""LLM: the offline API (vLLM-compatible names)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from pagedinfer.contracts.config.engine_config import EngineConfig
from pagedinfer.engine.beam.params import BeamSearchOutput, BeamSearchParams, BeamSearchSequence
from pagedinfer.engine.llm_engine import LLMEngine
from pagedinfer.engine.outputs import EngineStats, OutputAccumulator, RequestOutput
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

    def generate(
        self,
        prompts: str | Sequence[str] | Sequence[Sequence[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in prompt order.

        All prompts are validated before any is queued, so a bad one raises
        ValueError and leaves the engine untouched.
        """
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # one prompt (text or token ids)
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, (SamplingParams, BeamSearchParams)):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"sampling_params: got {len(params)} for {len(prompts)} prompts")
        return self._run(prompts, params, use_tqdm)

    def beam_search(
        self, prompts: str | Sequence[str] | Sequence[Sequence[int]], params: BeamSearchParams, use_tqdm: bool = False
    ) -> list[BeamSearchOutput]:
        """Per prompt, its params.beam_width best sequences, best first (docs/beam-search.md).

        All beams of all prompts run in the engine's ordinary packed steps,
        beside any other request, sharing their KV blocks copy-on-write.
        """
        if not isinstance(params, BeamSearchParams):
            raise ValueError(f"params: expected BeamSearchParams, got {type(params).__name__}")
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        outs = self._run(prompts, [params] * len(prompts), use_tqdm)
        return [
            BeamSearchOutput(
                [
                    BeamSearchSequence(
                        tokens=out.prompt_token_ids + c.token_ids,
                        text=c.text,
                        cum_logprob=c.cumulative_logprob,
                        score=c.cumulative_logprob / len(c.token_ids) ** params.length_penalty,
                        finish_reason=c.finish_reason,
                        stop_reason=c.stop_reason,
                    )
                    for c in out.outputs
                ]
            )
            for out in outs
        ]

    def _run(self, prompts: list, params: list, use_tqdm: bool) -> list[RequestOutput]:
        engine = self.llm_engine
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
        accumulator = OutputAccumulator()  # only deltas cross per step; each output is assembled once
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(prompts), desc="generate", unit="req")
        try:
            while engine.has_unfinished_requests():
                for delta in engine.step_deltas():
                    out = accumulator.add(delta)
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

    def shutdown(self) -> None:
        """Stop the child processes of a tensor-parallel engine (also done at exit)."""
        self.llm_engine.shutdown()
