"""The sampler's device path (`Sampler.sample_device`): token ids as a device tensor, no host sync, one
host-to-device transfer of the drawn rows' options, the same tokens as the per-row path; the rows it cannot
draw (seeds, logprobs, penalties, logit bias, min_tokens, grammars) go to `sample`'s general path."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pagedinfer.engine.sampler import Sampler
from pagedinfer.engine.sampling_params import SamplingParams
from pagedinfer.engine.sequence import Sequence


def seq(**params):
    return Sequence(request_id="r", prompt_token_ids=[5, 6], params=SamplingParams(**params), arrival_time=0.0)


class _HostTraffic(TorchDispatchMode):
    """Counts tensor -> Python scalar reads (a device sync each on a GPU) and tensors made from host data."""

    def __init__(self) -> None:
        super().__init__()
        self.scalar_reads = 0
        self.host_tensors = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.scalar_reads += 1
        if func is torch.ops.aten.lift_fresh.default:
            self.host_tensors += 1
        return func(*args, **(kwargs or {}))


MIXED = [
    dict(temperature=0.0),
    dict(temperature=0.7, top_k=5),
    dict(temperature=1.0, top_p=0.8),
    dict(temperature=0.0),
    dict(temperature=1.3, top_k=20, top_p=0.9, min_p=0.05),
    dict(temperature=1.0),
]


def test_a_mixed_batch_is_drawn_on_the_device_without_a_sync():
    logits = torch.randn(len(MIXED), 64, generator=torch.Generator().manual_seed(0))
    sampler = Sampler(seed=3, eos_token_ids={0}, device=torch.device("cpu"))
    with _HostTraffic() as traffic:
        tokens = sampler.sample_device(logits, [seq(**p) for p in MIXED])
    assert isinstance(tokens, torch.Tensor) and tokens.shape == (len(MIXED),) and tokens.dtype == torch.int64
    assert traffic.scalar_reads == 0 and traffic.host_tensors == 1  # the drawn rows' options, packed
    assert tokens[0] == logits[0].argmax() and tokens[3] == logits[3].argmax()


def test_the_device_path_draws_what_the_per_row_path_draws():
    """The same generator state gives the same tokens: greedy rows the argmax, drawn rows `_draw`'s."""
    seqs = [seq(**p) for p in MIXED]
    drawn = [row for row, s in enumerate(seqs) if not s.params.greedy]
    device, per_row = (Sampler(seed=11, eos_token_ids={0}, device=torch.device("cpu")) for _ in range(2))
    for step in range(30):
        logits = torch.randn(len(MIXED), 64, generator=torch.Generator().manual_seed(step))
        want = logits.argmax(dim=-1)
        want[torch.tensor(drawn)] = per_row._draw(logits[drawn].float(), [seqs[r] for r in drawn])
        assert torch.equal(device.sample_device(logits, seqs), want)


@pytest.mark.parametrize(
    "params",
    [
        dict(seed=1),
        dict(logprobs=2),
        dict(repetition_penalty=1.2),
        dict(logit_bias={3: 1.0}),
        dict(min_tokens=2),
        dict(presence_penalty=0.5),
    ],
)
def test_rows_with_per_row_work_go_to_the_general_path(params):
    sampler = Sampler(seed=0, eos_token_ids={0}, device=torch.device("cpu"))
    logits = torch.randn(2, 16, generator=torch.Generator().manual_seed(1))
    batch = [seq(temperature=0.0), seq(temperature=1.0, **params)]
    assert sampler.sample_device(logits, batch) is None
    assert len(sampler.sample(logits, batch)) == 2
