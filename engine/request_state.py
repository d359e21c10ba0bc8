"""A request inside the engine: its sequences, outputs and metrics from `add_request` until its last output.

Written by the engine thread (sequences, metrics) and by the output side (`outputs`, `num_sent`: see
`engine/overlap/text.py` for who owns what when).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedinfer.engine.beam.params import BeamSearchParams
from pagedinfer.engine.beam.search import BeamSearch
from pagedinfer.engine.outputs import CompletionOutput, Logprob, RequestMetrics
from pagedinfer.engine.sampling_params import SamplingParams
from pagedinfer.engine.sequence import Sequence, SequenceGroup


@dataclass
class EngineRequest:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams | BeamSearchParams
    metrics: RequestMetrics
    seqs: list[Sequence] = field(default_factory=list)
    outputs: list[CompletionOutput] = field(default_factory=list)
    beam: BeamSearch | None = None  # beam search: its bookkeeping; its live beams are `group`
    group: SequenceGroup | None = None
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None  # filled as the prompt is computed
    num_sent: dict[int, tuple[int, int]] = field(default_factory=dict)  # output position -> (tokens, chars) sent
    aborted: bool = False  # an output of it still on the output side is dropped

    @property
    def finished(self) -> bool:
        if self.beam is not None:
            return self.beam.done
        return len(self.seqs) == self.params.n and all(s.is_finished for s in self.seqs)

    @property
    def live_seqs(self) -> list[Sequence]:
        return self.group.seqs if self.group is not None else self.seqs
