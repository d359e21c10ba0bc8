"""Where pagedinfer's step time goes: torch.profiler over every Nth step, each op and label classified.

The bench labels the engine's public step phases with
`torch.profiler.record_function`, wrapping on the engine instance whichever
of these exist (so it works whatever the engine does inside them):

    step        LLMEngine.step, called by the bench
    schedule    engine.scheduler.schedule / after_step
    execute     engine.runner.execute (input preparation, block moves, forward, logits)
    model       engine.runner._forward (eager or compiled), else engine.runner.model.forward
    attention   the attention function registered with transformers under the model's attn_implementation
                (eager forward only: in a compiled forward, `engine.runner.compiled`, attention is
                recognised by its op's name, which must contain "attention")
    sample      engine.sampler.sample

Every profiler event inside a step gets one category from the names on its
chain of enclosing events (`classify`), and its self CPU time goes to that
category; a label's self time is the Python time between its ops. Shares are
of the profiled steps' total. Profiling slows small ops more than big ones,
so Python-heavy categories read somewhat high; the figures are for where the
time goes, not for throughput (the timed runs are never profiled).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

LABEL_PREFIX = "pagedinfer.bench."
CATEGORIES = ("matmul", "attention", "model other", "bookkeeping", "sampling", "output")
# labels -> the category of the time inside them that no inner rule claims
LABEL_CATEGORIES = {
    "step": "output",
    "schedule": "bookkeeping",
    "execute": "bookkeeping",
    "model": "model other",
    "attention": "attention",
    "sample": "sampling",
}
MATMUL_OPS = frozenset(
    {
        "aten::linear",
        "aten::addmm",
        "aten::mm",
        "aten::matmul",
        "aten::bmm",
        "aten::baddbmm",
        "aten::_addmm_activation",
        "aten::mkldnn_linear",
        "aten::_mkl_linear",
        "aten::_weight_int8pack_mm",
        "aten::mkldnn_rnn_layer",
    }
)
MATMUL_PREFIXES = ("mkldnn::", "onednn::", "torch_ipex::")  # oneDNN linear ops (_linear_pointwise etc.)


def label(phase: str) -> str:
    return LABEL_PREFIX + phase


def is_matmul_op(name: str) -> bool:
    return name in MATMUL_OPS or name.startswith(MATMUL_PREFIXES)


def is_attention(name: str) -> bool:
    return name == label("attention") or ("attention" in name.lower() and not name.startswith(LABEL_PREFIX))


def classify(chain: Sequence[str]) -> str | None:
    """Category of an event, given the names from the outermost enclosing event down to it.

    None outside a step. Attention wins over everything inside it (its SDPA
    may run bmm); then a matmul op claims what runs inside it; else the
    innermost bench label decides.
    """
    if label("step") not in chain:
        return None
    if any(is_attention(n) for n in chain):
        return "attention"
    if any(is_matmul_op(n) for n in chain):
        return "matmul"
    for name in reversed(chain):
        if name.startswith(LABEL_PREFIX) and name[len(LABEL_PREFIX) :] in LABEL_CATEGORIES:
            return LABEL_CATEGORIES[name[len(LABEL_PREFIX) :]]
    return "output"


@dataclass
class Breakdown:
    """CPU microseconds per category over the profiled steps, and the matmul ops' own time by name."""

    microseconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    matmul_op_microseconds: dict[str, float] = field(default_factory=dict)
    num_steps: int = 0

    def add_events(self, events) -> None:
        """Add torch.profiler FunctionEvents (with cpu_parent links) of some profiled steps."""
        for evt in events:
            chain = [evt.name]
            parent = evt.cpu_parent
            while parent is not None:
                chain.append(parent.name)
                parent = parent.cpu_parent
            chain.reverse()
            category = classify(chain)
            if category is None:
                continue
            self.microseconds[category] += evt.self_cpu_time_total
            if evt.name == label("step"):
                self.num_steps += 1
            if category == "matmul" and is_matmul_op(evt.name):
                self.matmul_op_microseconds[evt.name] = (
                    self.matmul_op_microseconds.get(evt.name, 0.0) + evt.self_cpu_time_total
                )

    def shares(self) -> dict[str, float]:
        total = sum(self.microseconds.values())
        return {c: (t / total if total else 0.0) for c, t in self.microseconds.items()}

    def to_dict(self) -> dict:
        return {
            "microseconds": self.microseconds,
            "matmul_op_microseconds": self.matmul_op_microseconds,
            "num_steps": self.num_steps,
        }

    @classmethod
    def from_dict(cls, data: dict) -> Breakdown:
        return cls(dict(data["microseconds"]), dict(data["matmul_op_microseconds"]), int(data["num_steps"]))

    def __str__(self) -> str:
        parts = ", ".join(f"{c} {s:.1%}" for c, s in self.shares().items())
        ops = sorted(self.matmul_op_microseconds.items(), key=lambda kv: -kv[1])[:3]
        total_ms = sum(self.microseconds.values()) / 1e3
        return f"{parts} ({self.num_steps} profiled steps, {total_ms:.0f} ms); matmul time by op: " + (
            ", ".join(f"{n} {t / 1e3:.0f} ms" for n, t in ops) or "none"
        )


class Labels:
    """Wrap the engine's phases in record_function labels (those that exist); `restore()` undoes it."""

    def __init__(self, engine) -> None:
        import torch

        self._undo: list = []
        runner = getattr(engine, "runner", None)
        # the forward's own wrapper, outside any compiled region (a compiled graph must not see our wrapper)
        forward = (
            (runner, "_forward")
            if callable(getattr(runner, "_forward", None))
            else (getattr(runner, "model", None), "forward")
        )
        targets = [
            (getattr(engine, "scheduler", None), "schedule", "schedule"),
            (getattr(engine, "scheduler", None), "after_step", "schedule"),
            (runner, "execute", "execute"),
            (*forward, "model"),
            (getattr(engine, "sampler", None), "sample", "sample"),
        ]
        for obj, attr, phase in targets:
            original = getattr(obj, attr, None) if obj is not None else None
            if callable(original):
                own = attr in getattr(obj, "__dict__", {})  # else a method of its class: deleting ours restores it
                setattr(obj, attr, _labelled(original, label(phase), torch))
                self._undo.append(
                    lambda obj=obj, attr=attr, original=original, own=own: (
                        setattr(obj, attr, original) if own else delattr(obj, attr)
                    )
                )
        if getattr(runner, "compiled", None) is None:
            self._wrap_attention(getattr(getattr(runner, "model", None), "config", None), torch)

    def _wrap_attention(self, config, torch) -> None:
        name = getattr(config, "_attn_implementation", None)
        if not name:
            return
        from transformers import AttentionInterface
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        try:  # the models look the function up in this registry at every forward
            original = ALL_ATTENTION_FUNCTIONS[name]
        except KeyError:
            return  # a built-in implementation (sdpa, eager): nothing of ours to label
        wrapper = _labelled(original, label("attention"), torch)
        if callable(getattr(original, "packed", None)):  # the form the fused CPU decoder calls, labelled too
            wrapper.packed = _labelled(original.packed, label("attention"), torch)
        AttentionInterface.register(name, wrapper)
        self._undo.append(lambda: AttentionInterface.register(name, original))

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()


def _labelled(fn, name: str, torch):
    def wrapper(*args, **kwargs):
        with torch.profiler.record_function(name):
            return fn(*args, **kwargs)

    return wrapper
