"""Runners of the throughput benchmark: transformers (one request at a time, static batches, continuous
batching) and pagedinfer.

Each runner sets the torch threads, loads the model, warms up on two short
requests (start-up, timed apart), then times the whole workload and returns a
`RunResult` with every request's generated ids, greedy, EOS ignored, the CPU
time of its process in each timed span and the process's peak RSS.
throughput.py runs each in a fresh process, so that the RSS peak and the
start-up are that system's alone.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass

from breakdown import Breakdown
from proc_stats import peak_rss_bytes, tree_cpu_seconds
from workload import RunResult, TokenIdsRequest

PAGEDINFER_COMPILED = "pagedinfer+compile"  # the system name of the engine run with --compile
OVERLAP_SUFFIX = "+overlap-"  # + the mode: added to the system name of the engine run with --overlap thread|process
ASYNC_SUFFIX = "+async"  # added to the system name of the engine run with --async-scheduling
_WARMUP = [TokenIdsRequest((10, 11, 12, 13), 4), TokenIdsRequest(tuple(range(20, 60)), 8)]


class Span:
    """Wall seconds and CPU seconds (this process and its live children) of a `with` block."""

    def __enter__(self) -> Span:
        self._cpu = tree_cpu_seconds(os.getpid())
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.wall_seconds = time.perf_counter() - self._start
        self.cpu_seconds = tree_cpu_seconds(os.getpid()) - self._cpu


def _load_hf_model(model_dir: str, num_threads: int, attn_implementation: str = "sdpa"):
    import torch
    import transformers

    torch.set_num_threads(num_threads)

    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation=attn_implementation
    )
    return model.eval()


# ----- (a) transformers generate, padded static batches --------------------------------------
def _generate_static_batch(model, batch: list[TokenIdsRequest], pad_token_id: int) -> list[tuple[int, ...]]:
    import torch
    from transformers import GenerationConfig

    width = max(len(r.prompt_token_ids) for r in batch)
    num_new = max(r.max_tokens for r in batch)
    ids = torch.full((len(batch), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, r in enumerate(batch):
        n = len(r.prompt_token_ids)
        ids[i, width - n :] = torch.tensor(r.prompt_token_ids)
        mask[i, width - n :] = 1
    # eos_token_id=-1 (no such token): None would fall back to the model's EOS and stop rows early
    config = GenerationConfig(do_sample=False, max_new_tokens=num_new, eos_token_id=-1, pad_token_id=pad_token_id)
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    if out.shape[1] != width + num_new:
        raise RuntimeError(f"generate stopped after {out.shape[1] - width} of {num_new} tokens")
    return [tuple(out[i, width : width + r.max_tokens].tolist()) for i, r in enumerate(batch)]


def run_hf_static(
    model_dir: str,
    requests: list[TokenIdsRequest],
    batch_size: int,
    num_threads: int,
    pad_token_id: int,
    repeats: int = 1,
    system: str = "hf-static",
) -> RunResult:
    """Batches of batch_size in arrival order, left-padded; a batch runs until its longest output.

    With batch_size 1 nothing is padded: transformers' own greedy tokens, the exactness reference.
    """
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # else every batch warns that eos_token_id=-1 never stops generation
    with Span() as startup:
        model = _load_hf_model(model_dir, num_threads)
        _generate_static_batch(model, _WARMUP, pad_token_id)
    batches = [requests[i : i + batch_size] for i in range(0, len(requests), batch_size)]
    runs = []
    for _ in range(repeats):
        with Span() as span:
            outputs = [o for batch in batches for o in _generate_static_batch(model, batch, pad_token_id)]
        runs.append((span, outputs))
    allocated_slots = sum(
        len(b) * (max(len(r.prompt_token_ids) for r in b) + max(r.max_tokens for r in b)) for b in batches
    )
    waste = 1 - sum(len(r.prompt_token_ids) + r.max_tokens for r in requests) / allocated_slots
    return _result(
        system, runs, num_threads, f"batch_size={batch_size}; padded KV waste {waste:.1%}", startup.wall_seconds
    )


def _result(
    system: str,
    runs: list[tuple[Span, list[tuple[int, ...]]]],
    num_threads: int,
    notes: str,
    startup_seconds: float,
    dtype: str = "float32",
) -> RunResult:
    outputs = runs[0][1]
    return RunResult(
        system,
        len(outputs),
        sum(len(o) for o in outputs),
        tuple(s.wall_seconds for s, _ in runs),
        num_threads,
        tuple(outputs),
        notes,
        dtype=dtype,
        all_cpu_seconds=tuple(s.cpu_seconds for s, _ in runs),
        startup_seconds=startup_seconds,
        peak_rss_bytes=peak_rss_bytes(os.getpid()),
    )


# ----- (b) transformers continuous batching ----------------------------------------------------
def _cb_config_kwargs(config_class: type, **wanted: int) -> dict[str, int]:
    """`wanted` in the spelling of the installed transformers' ContinuousBatchingConfig: its page size was
    `block_size` before 5.20, and `max_requests_per_batch` came in 5.11 (left out before: its default)."""
    fields = set(getattr(config_class, "__dataclass_fields__", ())) or set(wanted)
    if "page_size" not in fields and "block_size" in fields:
        wanted["block_size"] = wanted.pop("page_size")
    return {name: value for name, value in wanted.items() if name in fields}


def run_hf_continuous(
    model_dir: str,
    requests: list[TokenIdsRequest],
    budget_tokens: int,
    page_size: int,
    max_batch_tokens: int,
    max_requests_per_batch: int,
    num_threads: int,
    pad_token_id: int,
    repeats: int = 1,
) -> RunResult:
    """transformers' ContinuousBatchingManager (sdpa on CPU, float32), same KV token budget as ours.

    A fresh manager (so an empty prefix cache) for every repeat.
    """
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    load_start = time.perf_counter()
    startup_seconds = 0.0
    model = _load_hf_model(model_dir, num_threads)
    gen = GenerationConfig(do_sample=False, max_new_tokens=16, eos_token_id=-1, pad_token_id=pad_token_id)
    cb = ContinuousBatchingConfig(
        **_cb_config_kwargs(
            ContinuousBatchingConfig,
            page_size=page_size,
            num_blocks=budget_tokens // page_size,
            max_batch_tokens=max_batch_tokens,
            max_requests_per_batch=max_requests_per_batch,
        )
    )
    runs = []
    for repeat in range(repeats):
        manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
        manager.start()
        try:
            _collect_hf(manager, _WARMUP, "warmup")
            if not repeat:  # start-up: the load and the first manager's warm-up
                startup_seconds = time.perf_counter() - load_start
            with Span() as span:
                outputs = _collect_hf(manager, requests, "req")
            runs.append((span, outputs))
        finally:
            manager.stop(block=True)
    return _result(
        "hf-continuous",
        runs,
        num_threads,
        f"page_size={page_size}; num_blocks={budget_tokens // page_size}",
        startup_seconds,
    )


def _collect_hf(manager, requests: list[TokenIdsRequest], prefix: str) -> list[tuple[int, ...]]:
    ids = [f"{prefix}-{i}" for i in range(len(requests))]
    for rid, r in zip(ids, requests):
        manager.add_request(list(r.prompt_token_ids), request_id=rid, max_new_tokens=r.max_tokens, eos_token_id=-1)
    done: dict[str, tuple[int, ...]] = {}
    while len(done) < len(ids):
        result = manager.get_result(timeout=1)
        if result is None:
            if not manager.is_running():
                raise RuntimeError("transformers' continuous batching thread stopped")
            continue
        if result.error is not None:
            raise RuntimeError(f"transformers' continuous batching: {result.error}")
        if result.is_finished():
            done[result.request_id] = tuple(result.generated_tokens)
    return [done[rid] for rid in ids]


# ----- (d) pagedinfer ----------------------------------------------------------------------------
@dataclass(frozen=True)
class KVSnapshot:
    """KV occupancy after one step: slots of allocated blocks vs slots holding a computed token."""

    num_allocated_slots: int
    num_held_slots: int
    num_running_seqs: int

    @property
    def waste(self) -> float:
        return 1 - self.num_held_slots / self.num_allocated_slots if self.num_allocated_slots else 0.0


def kv_snapshot(engine) -> KVSnapshot:
    """Count each allocated block once (shared prefix/forked blocks too); a slot is held if any
    sequence using the block has computed the token at that offset."""
    kv = engine.kv
    block_size = kv.block_size
    filled: dict[int, int] = {}
    for seq in engine.scheduler.running:
        for j, block in enumerate(kv.tables.get(seq.seq_id, ())):
            n = min(block_size, max(0, seq.num_computed_tokens - j * block_size))
            if n > filled.get(block.block_id, -1):
                filled[block.block_id] = n
    if len(filled) != kv.pool.num_used_blocks:
        raise RuntimeError(f"{kv.pool.num_used_blocks} blocks in use but {len(filled)} in running tables")
    return KVSnapshot(len(filled) * block_size, sum(filled.values()), len(engine.scheduler.running))


@dataclass(frozen=True)
class PagedRun:
    result: RunResult
    peak: KVSnapshot  # the step with the most allocated slots
    mean_waste: float  # slot-weighted over all steps: sum(allocated - held) / sum(allocated)
    max_running_seqs: int
    num_gpu_blocks: int
    block_size: int
    max_model_len: int
    num_preemptions: dict[str, int]
    breakdown: Breakdown | None  # of a separate, untimed run (--breakdown)


def run_pagedinfer(
    model_dir: str,
    requests: list[TokenIdsRequest],
    block_size: int,
    num_gpu_blocks: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    max_model_len: int,
    num_threads: int,
    repeats: int = 1,
    profile_path: str | None = None,
    dtype: str = "float32",
    breakdown_every: int = 0,
    compile: bool = False,
    overlap: str = "off",
    async_scheduling: bool = False,
) -> PagedRun:
    """Step LLMEngine by hand; KV accounting after every step is kept out of the timed span.

    The prefix cache is emptied before every repeat (a repeat must not hit the
    previous one's prompts); KV figures are those of the first repeat, the
    cProfile that of the last. With breakdown_every N > 0, one more run after
    the timed ones profiles every Nth step (torch.profiler, see breakdown.py).
    With `compile` the engine runs its compiled forward (--compile; its
    compile counted in start-up) and the system is named "pagedinfer+compile"; with `overlap` thread or process
    its outputs are made beside the forward (--overlap) and "+overlap-<mode>" ends the name (process: the
    crossing's cost per batch is printed); with `async_scheduling` the engine runs --async-scheduling and
    "+async" ends the name: its KV accounting (done on the engine thread between steps, which that option
    overlaps with the forward, so its time cannot be taken out of the span) comes from one more, untimed run.
    """
    import torch

    torch.set_num_threads(num_threads)
    from pagedinfer.contracts.config.engine_config import EngineConfig
    from pagedinfer.engine import LLMEngine

    with Span() as startup:
        engine = LLMEngine(
            EngineConfig(
                model=model_dir,
                block_size=block_size,
                num_gpu_blocks_override=num_gpu_blocks,
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
                max_model_len=max_model_len,
                dtype=dtype,
                device="cpu",
                compile=compile,
                overlap=overlap,
                async_scheduling=async_scheduling,
            )
        )
        _drain(engine, _WARMUP, "warmup", None)
    runs = []
    snapshots: list[KVSnapshot] = []
    for repeat in range(repeats):
        engine.kv.pool.reset_prefix_cache()
        profiler = None
        if profile_path and repeat == repeats - 1:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        with Span() as span:
            outputs, accounting_seconds = _drain(
                engine, requests, f"req{repeat}", snapshots if not repeat and not async_scheduling else None
            )
        span.wall_seconds -= accounting_seconds
        span.cpu_seconds -= accounting_seconds  # one thread, busy while it counts
        runs.append((span, outputs))
        if profiler:
            profiler.disable()
            profiler.dump_stats(profile_path)
        stats = engine.get_stats()
        if stats.num_used_blocks or engine.has_unfinished_requests():
            raise RuntimeError(f"pagedinfer leaked KV blocks after the run: {stats}")
    if async_scheduling:
        engine.kv.pool.reset_prefix_cache()
        _drain(engine, requests, "kv", snapshots)
    linears = _linears(engine.runner)
    system = (
        (PAGEDINFER_COMPILED if compile else "pagedinfer")
        + (OVERLAP_SUFFIX + overlap if overlap != "off" else "")
        + (ASYNC_SUFFIX if async_scheduling else "")
    )
    crossing = getattr(engine.output_side.worker, "crossing", None)
    if crossing is not None and crossing.num_batches:
        n = crossing.num_batches
        print(
            f"{system} {dtype}: crossing per batch ({n} batches, all repeats and the warm-up): engine side"
            f" {crossing.engine_seconds / n * 1e6:.0f} us, child {crossing.child_seconds / n * 1e6:.0f} us,"
            f" {crossing.bytes_sent / n:.0f} B sent, {crossing.bytes_received / n:.0f} B back",
            flush=True,
        )
    # the pool is allocated untouched on CPU (engine/runner/model_runner.py): its pages count in the
    # peak RSS only once written, so a longer run reads higher, up to the whole pool
    pool_mib = engine.runner.kv_cache.nbytes / 2**20
    result = _result(
        system,
        runs,
        num_threads,
        f"block_size={block_size}; num_gpu_blocks={num_gpu_blocks}; "
        f"KV pool {pool_mib:.0f} MiB (RSS counts its written pages); linears: {linears}",
        startup.wall_seconds,
        dtype,
    )
    steps = _profile_steps(engine, requests, breakdown_every) if breakdown_every else None
    engine.shutdown()
    peak = max(snapshots, key=lambda s: s.num_allocated_slots)
    allocated = sum(s.num_allocated_slots for s in snapshots)
    mean_waste = 1 - sum(s.num_held_slots for s in snapshots) / allocated
    return PagedRun(
        result,
        peak,
        mean_waste,
        max(s.num_running_seqs for s in snapshots),
        engine.num_gpu_blocks,
        block_size,
        engine.max_model_len,
        dict(stats.num_preemptions),
        steps,
    )


def _linears(runner) -> str:
    """How the engine runs its linear layers, if it says (a `linear_packing` report: backend, packed count)."""
    report = getattr(runner, "linear_packing", None)
    if report is None:
        return "F.linear (the engine reports no packing)"
    packed = getattr(report, "packed", ())
    compiled = " in a compiled forward" if getattr(runner, "compiled", None) is not None else ""
    return f"{getattr(report, 'backend', report)}, {len(packed)} layers packed{compiled}"


def _profile_steps(engine, requests: list[TokenIdsRequest], every: int) -> Breakdown:
    """One more run of the workload with every `every`-th step under torch.profiler (one warm-up step before)."""
    import torch
    from breakdown import Labels

    engine.kv.pool.reset_prefix_cache()
    found = Breakdown()
    labels = Labels(engine)
    try:
        schedule = torch.profiler.schedule(wait=max(0, every - 2), warmup=min(1, every - 1), active=1)
        with _without_kineto_log(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
            with torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU],
                schedule=schedule,
                on_trace_ready=lambda prof: found.add_events(prof.events()),
            ) as prof:
                _drain(engine, requests, "breakdown", None, prof.step)
    finally:
        labels.restore()
    return found


@contextlib.contextmanager
def _without_kineto_log():
    """Kineto writes two lines to fd 2 per profiler cycle (no setting turns them off): drop those, keep the rest."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile("w+b") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            log.seek(0)
            for line in log.read().decode(errors="replace").splitlines(keepends=True):
                if not line.startswith(("USDT:", "STAGE:")):
                    sys.stderr.write(line)


def _drain(
    engine, requests: list[TokenIdsRequest], prefix: str, snapshots: list[KVSnapshot] | None, after_step=None
) -> tuple[list[tuple[int, ...]], float]:
    import torch
    from breakdown import label

    from pagedinfer.engine import SamplingParams

    ids = [f"{prefix}-{i}" for i in range(len(requests))]
    for rid, r in zip(ids, requests):
        engine.add_request(
            rid, list(r.prompt_token_ids), SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True)
        )
    done: dict[str, tuple[int, ...]] = {}
    tokens: dict[str, list[int]] = {rid: [] for rid in ids}
    accounting_seconds = 0.0
    step_label = label("step")
    while engine.has_unfinished_requests():
        if after_step is None:
            deltas = engine.step_deltas()
        else:
            with torch.profiler.record_function(step_label):
                deltas = engine.step_deltas()
            after_step()
        for delta in deltas:  # only the new tokens cross, as the server gets them
            tokens[delta.request_id].extend(delta.outputs[0].new_token_ids)
            if delta.finished:
                done[delta.request_id] = tuple(tokens.pop(delta.request_id))
        if snapshots is not None:
            t = time.perf_counter()
            snapshots.append(kv_snapshot(engine))
            accounting_seconds += time.perf_counter() - t
    return [done[rid] for rid in ids], accounting_seconds
