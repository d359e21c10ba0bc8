"""The engine section of bench/gpu_check.py: a decode step bounded by the GPU (issue 29's targets).

Adapted from ../shared/gpu/gpu_profile.py (which measured the 18 ms steps). On
a random ~1B Llama in bfloat16 (smoke: the tiny shape in float32 on a CPU):

1. decode step time at batch 1/16/64/256 with the decode graphs off and on
   (`--max-cudagraph-capture-size`), the batch-256 decode tokens/s, and at
   batch >= 64 from torch.profiler: launches per step (CPU-side
   cudaLaunchKernel/cuLaunchKernel/cudaGraphLaunch calls), kernels per step
   on the device, and the GPU busy fraction (kernel time per step over the
   unprofiled step time); the graphs' capture time and measured memory
   against the sizing's estimate;
2. no host sync inside a graph step: `torch.cuda.set_sync_debug_mode("error")`
   around one `DecodeGraphs.run` (and, for contrast, whether the eager
   step syncs); on a CPU it cannot be checked, and says so;
3. float32 greedy output with the graphs on equals transformers' `generate`
   at batches that use buckets 1..16;
4. `pagedinfer serve` (graphs on) under `pagedinfer bench serve`: 512
   requests of ~735 prompt + 256 output tokens, 256 in flight.

Every figure is printed against its target: batch-1 step <= 1.5 ms;
batch-256 >= 45,000 tok/s; busy >= 85% at batch >= 64; serve >= 3 x 3,941
output tok/s with TTFT p50 < 1 s. The server needs fastapi and uvicorn: on
a machine whose image lacks them, `--serve-site DIR` puts a folder of
unpacked wheels first on the server's path (../shared/gpu/README.md lists them).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from gpu_check import generate_reference

TARGETS = dict(
    batch1_step_ms=1.5,
    batch256_tokens_per_s=45_000,
    busy_fraction=0.85,
    serve_tokens_per_s=3 * 3941,
    serve_ttft_p50_ms=1000.0,
)
PROMPT_TOKENS = 128  # per request of the step-time sweep
SERVE_PORT = 8123


def engine_shapes(smoke: bool) -> dict:
    if smoke:
        return dict(
            dtype="float32",
            batches=(1, 4),
            steps=3,
            profile_batches=(),
            capture_size=4,
            max_num_seqs=8,
            model=dict(
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=1024,
            ),
            exact_model=dict(
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=256,
            ),
            exact_batches=(1, 3),
            exact_tokens=4,
            serve=dict(num_prompts=8, max_concurrency=4, input_words=20, output_tokens=8),
        )
    return dict(
        dtype="bfloat16",
        batches=(1, 16, 64, 256),
        steps=30,
        profile_batches=(64, 256),
        capture_size=256,
        max_num_seqs=256,
        model=dict(
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=2048,
        ),
        exact_model=dict(
            hidden_size=512,
            intermediate_size=1024,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=2,
            max_position_embeddings=512,
        ),
        exact_batches=(1, 3, 5, 9),
        exact_tokens=24,
        serve=dict(num_prompts=512, max_concurrency=256, input_words=200, output_tokens=256),
    )


def verdict(value: float | None, target: float, at_most: bool = False) -> str:
    if value is None:
        return "n/a"
    ok = value <= target if at_most else value >= target
    return f"{'MEETS' if ok else 'MISSES'} target {'<=' if at_most else '>='} {target:g}"


def save_random_llama(model_dir: Path, shape: dict, dtype: str, device, tokenizer_dir: Path | None = None) -> int:
    """A random-weight Llama of `shape` with the offline tokenizer (trained, or tokenizer_dir's), saved; returns
    its parameter count."""
    import torch
    import transformers

    from pagedinfer.engine.tiny_model import train_tokenizer

    if tokenizer_dir is None:
        tokenizer = train_tokenizer(model_dir)
    else:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
        tokenizer.save_pretrained(str(model_dir))
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), bos_token_id=1, eos_token_id=2, pad_token_id=3, tie_word_embeddings=False, **shape
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config).to(getattr(torch, dtype))
    if dtype == "float32":  # decisive greedy choices (engine/tiny_model.py's reason)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() > 1:
                    p.normal_(0.0, 0.15)
    model.save_pretrained(str(model_dir))
    return sum(p.numel() for p in model.parameters())


def engine_section(report, device, smoke: bool, serve_site: str | None, serve: bool = True) -> None:
    """The section (see the module docstring). In smoke mode the engine runs its own CPU kernels, not the Triton
    interpreter the kernel sections force (a step there takes a second)."""
    from pagedinfer.kernels import dispatch

    forced = os.environ.pop(dispatch.ENV_VAR, None) if smoke else None
    try:
        run_engine_checks(report, device, smoke, serve_site, serve)
    finally:
        if forced is not None:
            os.environ[dispatch.ENV_VAR] = forced


def run_engine_checks(report, device, smoke: bool, serve_site: str | None, serve: bool) -> None:
    import torch

    shapes = engine_shapes(smoke)
    model_dir = Path(tempfile.mkdtemp(prefix="pagedinfer_engine_"))
    num_params = save_random_llama(model_dir, shapes["model"], shapes["dtype"], device)
    report.line(f"random Llama: {num_params / 1e9:.2f} B parameters, {shapes['dtype']}")
    for graphs in (False, True):
        step_sweep(report, device, shapes, model_dir, graphs)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    exact_with_graphs(report, device, shapes, model_dir)
    if serve:
        serve_run(report, shapes, model_dir, serve_site)
    else:
        report.line("serve run skipped (--skip-serve)")


def make_llm(model_dir: Path, shapes: dict, graphs: bool, **kwargs):
    from pagedinfer.engine import LLM

    return LLM(
        model=str(model_dir),
        dtype=shapes["dtype"],
        gpu_memory_utilization=0.5,
        max_model_len=1024,
        max_num_seqs=shapes["max_num_seqs"],
        max_cudagraph_capture_size=shapes["capture_size"] if graphs else 0,
        **kwargs,
    )


def fill_decodes(engine, batch: int, tag: str, vocab: int, rng: random.Random) -> None:
    """`batch` running requests, all past their prefill (the next steps are pure decode)."""
    from pagedinfer.engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=600, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"{tag}-{i}", [rng.randrange(8, vocab) for _ in range(PROMPT_TOKENS)], params)
    budget = engine.config.max_num_batched_tokens
    for _ in range(-(-batch * PROMPT_TOKENS // budget) + 3):
        engine.step()


def step_sweep(report, device, shapes: dict, model_dir: Path, graphs: bool) -> None:
    import torch

    label = "graphs on" if graphs else "graphs off"
    began = time.monotonic()
    llm = make_llm(model_dir, shapes, graphs)
    engine = llm.llm_engine
    runner = engine.runner
    start_record = {"case": "start", "graphs": graphs, "seconds": time.monotonic() - began}
    if graphs and runner.decode_graphs is not None:
        g = runner.decode_graphs
        start_record.update(
            buckets=list(g.sizes),
            captured=g.captured,
            capture_seconds=g.capture_seconds,
            captured_bytes=g.captured_bytes,
            planned_bytes=g.planned_bytes,
        )
        measured = f"{g.captured_bytes / 2**20:.1f} MiB" if g.captured_bytes is not None else "not captured (CPU)"
        report.line(
            f"{label}: {len(g.sizes)} buckets up to {g.sizes[-1]}, capture {g.capture_seconds or 0:.1f} s,"
            f" memory {measured} against the sizing's estimate {g.planned_bytes / 2**20:.1f} MiB"
        )
    report.add("engine", start_record)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rng = random.Random(0)
    vocab = runner.vocab_size
    for batch in shapes["batches"]:
        fill_decodes(engine, batch, f"{int(graphs)}-{batch}", min(vocab, 384), rng)
        runs_before = sum(runner.decode_graphs.num_runs.values()) if graphs else 0
        sync()
        t0 = time.perf_counter()
        for _ in range(shapes["steps"]):
            engine.step()
        sync()
        ms = (time.perf_counter() - t0) / shapes["steps"] * 1e3
        record = {
            "case": "decode_step",
            "graphs": graphs,
            "batch": batch,
            "ms_per_step": ms,
            "tokens_per_s": batch / ms * 1e3,
        }
        if graphs:
            record["graph_steps"] = sum(runner.decode_graphs.num_runs.values()) - runs_before
        line = f"{label}: batch {batch:4d}: {ms:7.2f} ms/step, {batch / ms * 1e3:9.0f} tok/s"
        if batch == 1:
            line += f"  ({verdict(ms, TARGETS['batch1_step_ms'], at_most=True)} ms)"
        if batch == 256:
            line += f"  ({verdict(batch / ms * 1e3, TARGETS['batch256_tokens_per_s'])} tok/s)"
        if device.type == "cuda" and batch in shapes["profile_batches"]:
            record.update(profile_steps(engine, ms))
            line += (
                f"; {record['launches_per_step']:.0f} launches/step, {record['device_kernels_per_step']:.0f}"
                f" kernels/step, GPU busy {record['busy_fraction']:.0%}"
                f" ({verdict(record['busy_fraction'], TARGETS['busy_fraction'])})"
            )
        report.line(line)
        report.add("engine", record)
        if graphs and batch == shapes["batches"][-1]:
            report.add("engine", sync_check(report, engine, device))
        engine.abort_request([rid for rid in list(engine.requests)])
        for _ in range(2):
            engine.step()
    engine.shutdown()
    del llm, engine, runner


def profile_steps(engine, step_ms: float, steps: int = 10) -> dict:
    """Launches and kernels per step from torch.profiler, and kernel time over the unprofiled step time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    launches = sum(e.count for e in events if any(k in e.key for k in ("LaunchKernel", "GraphLaunch")))
    device_events = [e for e in events if e.device_type.name == "CUDA"]
    kernels = sum(e.count for e in device_events)
    kernel_ms = sum(e.self_device_time_total for e in device_events) / steps / 1e3
    return {
        "launches_per_step": launches / steps,
        "device_kernels_per_step": kernels / steps,
        "gpu_kernel_ms_per_step": kernel_ms,
        "busy_fraction": kernel_ms / step_ms,
    }


def sync_check(report, engine, device) -> dict:
    """One graph step under set_sync_debug_mode("error"); the eager step under the same mode, for contrast."""

    if device.type != "cuda":
        report.line("no-host-sync check: cannot be checked on a CPU (torch.cuda.set_sync_debug_mode needs CUDA)")
        return {"case": "no_host_sync", "checked": False, "reason": "needs CUDA"}
    runner = engine.runner
    graphs = runner.decode_graphs
    seq_ids = [s for s in runner.batch.row_of][: graphs.sizes[-1]]
    if not seq_ids:
        return {"case": "no_host_sync", "checked": False, "reason": "no running sequence to step"}
    lens = [int(runner.batch.num_blocks[runner.batch.row_of[s]]) * runner.block_size for s in seq_ids]
    # one more decode of each running sequence at its last slot (a throwaway step: the requests are aborted next)
    arrays = runner.batch.gather(seq_ids, lens, [1] * len(seq_ids))
    bucket = graphs.bucket(len(seq_ids), len(seq_ids))
    result = {"case": "no_host_sync", "checked": True, "batch": len(seq_ids), "bucket": bucket}
    error = host_sync_error(lambda: graphs.run(bucket, [5] * len(seq_ids), arrays, list(range(len(seq_ids)))))
    result.update(graph_step_syncs=error is not None, graph_step_error=error)
    from pagedinfer.engine.distributed.step_message import StepInputs

    step = StepInputs([5] * len(seq_ids), seq_ids, lens, [1] * len(seq_ids), list(range(len(seq_ids))))
    saved, runner.decode_graphs = runner.decode_graphs, None
    try:
        error = host_sync_error(lambda: runner.run_step(step))
    finally:
        runner.decode_graphs = saved
    result.update(eager_step_syncs=error is not None, eager_step_error=error)
    report.line(
        f"no-host-sync check (batch {len(seq_ids)}, bucket {bucket}): graph step "
        f"{'SYNCS: ' + result['graph_step_error'] if result['graph_step_syncs'] else 'has no host sync'}"
        f"; eager step {'syncs' if result['eager_step_syncs'] else 'has no host sync'}"
    )
    return result


def host_sync_error(fn) -> str | None:
    """What `fn` raised under torch.cuda.set_sync_debug_mode("error") (a host sync), None when it ran through."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
        return None
    except RuntimeError as exc:
        return str(exc)[:300]
    finally:
        torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()


def exact_with_graphs(report, device, shapes: dict, tokenizer_dir: Path) -> None:
    """float32 greedy with the graphs on equals transformers' generate, at batches using buckets 1..16."""
    import transformers

    from pagedinfer.engine import LLM, SamplingParams

    model_dir = Path(tempfile.mkdtemp(prefix="pagedinfer_exact_"))
    save_random_llama(model_dir, shapes["exact_model"], "float32", device, tokenizer_dir)
    rng = random.Random(1)
    vocab = transformers.AutoConfig.from_pretrained(str(model_dir)).vocab_size
    prompts = [
        [rng.randrange(8, vocab) for _ in range(rng.randint(1, 60))] for _ in range(max(shapes["exact_batches"]))
    ]
    n = shapes["exact_tokens"]
    want = generate_reference(model_dir, prompts, n, device)
    llm = LLM(
        model=str(model_dir),
        dtype="float32",
        max_model_len=256,
        max_num_seqs=16,
        gpu_memory_utilization=0.3,
        max_cudagraph_capture_size=16,
    )
    graphs = llm.llm_engine.runner.decode_graphs
    for batch in shapes["exact_batches"]:
        got = [
            o.outputs[0].token_ids
            for o in llm.generate(prompts[:batch], SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
        ]
        same = sum(a == b for a, b in zip(got, want[:batch]))
        report.add("engine", {"case": "exact_fp32_graphs", "batch": batch, "identical": same, "requests": batch})
        report.line(f"float32, graphs on, batch {batch}: {same}/{batch} requests equal generate")
    report.add(
        "engine",
        {
            "case": "exact_fp32_bucket_runs",
            "runs": dict(graphs.num_runs),
            "leaked_blocks": llm.get_stats().num_used_blocks,
        },
    )
    report.line(f"  bucket runs {graphs.num_runs}; blocks in use after: {llm.get_stats().num_used_blocks}")
    llm.llm_engine.shutdown()


def serve_run(report, shapes: dict, model_dir: Path, serve_site: str | None) -> None:
    """`pagedinfer serve` with the graphs on, under `pagedinfer bench serve` (a second process)."""
    path = [p for p in ([serve_site] if serve_site else []) + sys.path if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), PYTHONUNBUFFERED="1")
    cli = [sys.executable, "-P", "-c", "import sys; from pagedinfer.engine.cli import main; sys.exit(main())"]
    probe = subprocess.run([sys.executable, "-P", "-c", "import fastapi, uvicorn"], env=env, capture_output=True)
    if probe.returncode != 0:
        report.line("serve run skipped: fastapi/uvicorn are not importable here (give --serve-site DIR)")
        report.add("engine", {"case": "serve", "skipped": "server packages missing"})
        return
    out_dir = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="pagedinfer_serve_"))
    out_dir.mkdir(parents=True, exist_ok=True)
    s = shapes["serve"]
    args = [
        "serve",
        "--model",
        str(model_dir),
        "--dtype",
        shapes["dtype"],
        "--host",
        "127.0.0.1",
        "--port",
        str(SERVE_PORT),
        "--max-model-len",
        "1024",
        "--gpu-memory-utilization",
        "0.5",
        "--max-num-seqs",
        str(shapes["max_num_seqs"]),
        "--max-cudagraph-capture-size",
        str(shapes["capture_size"]),
    ]
    with open(out_dir / "serve.log", "w") as log:
        server = subprocess.Popen(cli + args, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            if not wait_healthy(server):
                report.line(f"serve did not become healthy (exit {server.poll()}); see serve.log")
                report.add("engine", {"case": "serve", "error": "not healthy", "exit": server.poll()})
                return
            bench = subprocess.run(
                cli
                + [
                    "bench",
                    "serve",
                    "--url",
                    f"http://127.0.0.1:{SERVE_PORT}",
                    "--num-prompts",
                    str(s["num_prompts"]),
                    "--max-concurrency",
                    str(s["max_concurrency"]),
                    "--input-words",
                    str(s["input_words"]),
                    "--output-tokens",
                    str(s["output_tokens"]),
                    "--no-progress",
                    "--json",
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
    (out_dir / "bench_serve.txt").write_text(bench.stdout + bench.stderr)
    summary = json.loads(bench.stdout.strip().splitlines()[-1]) if bench.returncode == 0 else None
    if summary is None:
        report.line(f"bench serve failed (exit {bench.returncode}): {bench.stderr[-1000:]}")
        report.add("engine", {"case": "serve", "error": bench.stderr[-1000:]})
        return
    tps, ttft = summary["output_token_throughput_per_second"], summary["ttft_ms"]["p50"]
    report.add("engine", {"case": "serve", "graphs": True, **summary})
    report.line(
        f"serve + bench serve ({s['num_prompts']} requests, {summary['mean_prompt_tokens']:.0f} prompt +"
        f" {summary['mean_completion_tokens']:.0f} output tokens, {s['max_concurrency']} in flight):"
        f" {tps:.0f} output tok/s ({verdict(tps, TARGETS['serve_tokens_per_s'])}), TTFT p50 {ttft:.0f} ms"
        f" ({verdict(ttft, TARGETS['serve_ttft_p50_ms'], at_most=True)}), ITL p50"
        f" {summary['itl_ms']['p50']:.1f} ms, failed {summary['num_failed']}"
    )


def wait_healthy(server: subprocess.Popen, seconds: float = 300.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and server.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{SERVE_PORT}/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            time.sleep(0.5)
    return False
