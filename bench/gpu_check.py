"""GPU check of pagedinfer: kernel correctness, decode bandwidth, end-to-end throughput.

Run from the repository root on a machine with one CUDA GPU (no network, no
install needed: torch, triton and transformers of the machine's image):

    python bench/gpu_check.py               # every section (--sections picks some)
    python bench/gpu_check.py --skip-e2e    # kernels only
    python bench/gpu_check.py --smoke       # tiny shapes on CPU under TRITON_INTERPRET=1 (no GPU)

Sections, each guarded (a failure prints its traceback, the next still runs):

1. correctness of every Triton kernel against its torch reference in bf16 at
   Llama-3-8B-like shapes (32 query heads, 8 KV heads, head_dim 128, block 16);
   our decoder's layer kernels and its greedy output (`gpu_decoder_check.py`:
   fp32 equal to `generate`, bf16 first tokens >= 95% equal to the module path's,
   tokens/s of both forwards);
2. decode bandwidth: bytes of K/V read per second (`triton.testing.do_bench`,
   median; and under a CUDA graph, which removes launch overhead) at batch
   1/16/64/256 x context 512/2k/8k/32k, as a percentage of a device-to-device
   copy measured in the same run (copy bandwidth counts bytes read + written);
   a short tile/warp sweep; prefill against torch's SDPA on dense K/V;
3. output tokens/s of `pagedinfer.engine.LLM` against transformers `generate`
   (one static left-padded batch) on a random-weight ~1B Llama in bf16, 256
   requests of mixed prompt and output lengths;
4. engine (`bench/gpu_engine_check.py`): decode step time against batch with
   the decode graphs off and on, launches per step, the GPU's busy fraction,
   no host sync in a graph step, float32 exactness with the graphs, and
   `pagedinfer serve` under `pagedinfer bench serve`, each against issue 29's
   targets (`--sections engine` runs it alone).

Results print as they come; with `$OUT` set they are also written to
`$OUT/gpu_check.json` after every section.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


SECTIONS = ("correctness", "layer kernels", "decoder", "bandwidth", "prefill", "e2e", "engine")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on CPU under the Triton interpreter")
    parser.add_argument("--skip-e2e", action="store_true", help="skip section 3 (engine vs transformers)")
    parser.add_argument("--budget-seconds", type=float, default=360.0, help="stop starting new work after this")
    parser.add_argument("--num-requests", type=int, default=256, help="requests of section 3")
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help="comma-separated sections to run (default all: " + ", ".join(SECTIONS) + ")",
    )
    parser.add_argument("--skip-serve", action="store_true", help="the engine section without its serve run")
    parser.add_argument(
        "--serve-site",
        default=None,
        help="a folder of the server's packages (fastapi, uvicorn, ...) for the engine section's"
        " `pagedinfer serve`, where the machine's image lacks them",
    )
    return parser.parse_args()


def sibling_module(name: str):
    """bench/<name>.py as a module (bench/ is no package, and `-P` keeps the script's folder off sys.path).

    The sibling imports this module's helpers as `gpu_check` (this module is registered under that name
    also when it runs as the script)."""
    import importlib.util

    sys.modules.setdefault("gpu_check", sys.modules[__name__])
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def generate_reference(model_dir: Path, prompts: list[list[int]], output_len: int, device) -> list[list[int]]:
    """transformers' own float32 greedy `generate`, one prompt at a time on `device`, exactly `output_len`
    tokens each (EOS ignored): the tokens the engine's float32 greedy output must equal."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device).eval()
    with torch.no_grad():
        outs = [
            model.generate(
                torch.tensor([ids], device=device),
                max_new_tokens=output_len,
                min_new_tokens=output_len,
                do_sample=False,
                pad_token_id=0,
            )[0, len(ids) :].tolist()
            for ids in prompts
        ]
    del model
    return outs


def make_importable() -> None:
    """Import `pagedinfer` from this checkout even when it is not installed.

    The repo root is never put on sys.path (its `operator/` folder would shadow
    the standard library): a temporary `pagedinfer` package of symlinks is.
    """
    try:
        import pagedinfer.kernels  # noqa: F401

        return
    except ImportError:
        for name in [m for m in sys.modules if m == "pagedinfer" or m.startswith("pagedinfer.")]:
            del sys.modules[name]
    root = Path(tempfile.mkdtemp(prefix="pagedinfer_path_"))
    package = root / "pagedinfer"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in ("engine", "kernels", "operator"):
        (package / name).symlink_to(REPO / name, target_is_directory=True)
    sys.path.insert(0, str(root))


class Report:
    """Prints results as they come and keeps them for the JSON file."""

    def __init__(self, budget_seconds: float) -> None:
        self.start = time.monotonic()
        self.budget_seconds = budget_seconds
        self.results: dict = {"sections": {}}
        out = os.environ.get("OUT")
        self.path = Path(out) / "gpu_check.json" if out else None

    def seconds_left(self) -> float:
        return self.budget_seconds - (time.monotonic() - self.start)

    def line(self, text: str) -> None:
        print(text, flush=True)

    def add(self, section: str, record: dict) -> None:
        self.results["sections"].setdefault(section, []).append(record)

    def save(self) -> None:
        self.results["elapsed_seconds"] = round(time.monotonic() - self.start, 1)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.results, indent=2, default=str))

    def run_section(self, name: str, fn, *args) -> None:
        self.line(f"\n=== {name} ({self.seconds_left():.0f} s of budget left) ===")
        began = time.monotonic()
        try:
            fn(self, *args)
        except Exception:  # a failed section must not hide the others
            text = traceback.format_exc()
            self.line(text)
            self.add(name, {"error": text})
            self.results.setdefault("failed_sections", []).append(name)
        self.line(f"--- {name}: {time.monotonic() - began:.1f} s")
        self.save()


def bench_ms(fn, device, rep_ms: int = 60) -> float:
    """Median milliseconds per call: triton's do_bench on CUDA, wall clock on CPU."""
    if device.type == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median")
    times = []
    for _ in range(3):
        began = time.perf_counter()
        fn()
        times.append((time.perf_counter() - began) * 1e3)
    return sorted(times)[1]


def graph_ms(fn, device) -> float | None:
    """Median milliseconds per call replayed from a CUDA graph (no launch overhead), None off CUDA."""
    if device.type != "cuda":
        return None
    import torch
    import triton.testing

    with torch.cuda.stream(torch.cuda.Stream()):
        return triton.testing.do_bench_cudagraph(fn, rep=40, return_mode="median")


# ----- section 1: correctness ----------------------------------------------------------------------
def check_correctness(report: Report, device, shapes: dict) -> None:
    import torch

    from pagedinfer.kernels import reference
    from pagedinfer.kernels.block_copy import copy_blocks_triton, swap_blocks_triton
    from pagedinfer.kernels.paged_attention import decode_attention, paged_attention_triton
    from pagedinfer.kernels.problems import dense_attention, make_problem
    from pagedinfer.kernels.write_kv import write_kv_triton

    dtype = shapes["dtype"]
    heads, kv_heads, head_dim, block_size = shapes["heads"], shapes["kv_heads"], shapes["head_dim"], 16
    tolerance = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-4}  # absolute and relative

    def record(name: str, got, want, exact: bool = False) -> None:
        error = (got.float() - want.float()).abs().max().item() if got.numel() else 0.0
        within = (got.float() - want.float()).abs() <= tolerance[got.dtype] * (1 + want.float().abs())
        ok = (error == 0.0) if exact else (bool(within.all().item()) and not got.isnan().any().item())
        report.line(f"{'PASS' if ok else 'FAIL'}  {name:<58} max |err| {error:.2e}")
        report.add("correctness", {"case": name, "max_abs_error": error, "ok": bool(ok)})

    num_tokens = shapes["write_tokens"]
    cache = torch.randn(2, 64 + num_tokens // block_size, block_size, kv_heads, head_dim, device=device).to(dtype)
    expected = cache.clone()
    slots = torch.randperm(cache.shape[1] * block_size, device=device)[:num_tokens]
    slots[::17] = -1
    key, value = (torch.randn(num_tokens, kv_heads, head_dim, device=device).to(dtype) for _ in range(2))
    write_kv_triton(key, value, cache[0], cache[1], slots)
    reference.write_kv(key, value, expected[0], expected[1], slots)
    record(f"write_kv {num_tokens} tokens, 1 in 17 padding", cache, expected, exact=True)

    steps = [
        ("decode, lengths mid-block/on boundary", shapes["decode_lens"], [1] * len(shapes["decode_lens"]), None),
        ("mixed decode + prefill with cached prefixes", *shapes["mixed"], None),
        ("mixed step, sliding window", *shapes["mixed"], shapes["window"]),
    ]
    for name, seq_lens, query_lens, window in steps:
        problem = make_problem(seq_lens, query_lens, heads, kv_heads, head_dim, block_size, dtype, device, seed=1)
        want = reference.paged_attention(
            problem.query, problem.key_cache, problem.value_cache, problem.metadata, problem.scale, window
        )
        got = paged_attention_triton(
            problem.query, problem.key_cache, problem.value_cache, problem.metadata, problem.scale, window
        )
        record(f"attention: {name}", got, want)
        record(f"attention vs dense SDPA: {name}", got, dense_attention(problem, window).to(dtype))
        if problem.metadata.num_decode_seqs:
            for splits in (1, 8):
                forced = decode_attention(
                    problem.query,
                    problem.key_cache,
                    problem.value_cache,
                    problem.metadata,
                    problem.scale,
                    window,
                    num_splits=splits,
                )
                n = problem.metadata.num_decode_seqs
                record(f"attention: {name}, decode with {splits} split(s)", forced[:n], want[:n])

    for other_dim, other_dtype in shapes["variants"]:
        problem = make_problem([37, 300, 90], [1, 1, 70], 8, 2, other_dim, block_size, other_dtype, device, seed=2)
        got = paged_attention_triton(
            problem.query, problem.key_cache, problem.value_cache, problem.metadata, problem.scale
        )
        record(
            f"attention head_dim {other_dim} {str(other_dtype)[6:]}, GQA 4",
            got,
            dense_attention(problem).to(other_dtype),
        )

    layers, blocks = shapes["copy_layers"], shapes["copy_blocks"]
    allocation = torch.randn(2, layers, blocks, block_size, kv_heads, head_dim, device=device).to(dtype)
    mapping = torch.randperm(blocks)[: 2 * (blocks // 4)].view(-1, 2)
    expected = allocation.clone()
    reference.copy_blocks(list(expected[0].unbind(0)), list(expected[1].unbind(0)), mapping)
    copy_blocks_triton(list(allocation[0].unbind(0)), list(allocation[1].unbind(0)), mapping.to(device))
    record(f"copy_blocks {mapping.shape[0]} blocks x {layers} layers", allocation, expected, exact=True)

    host = torch.zeros(
        2, layers, blocks // 2, block_size, kv_heads, head_dim, dtype=dtype, pin_memory=device.type == "cuda"
    )
    swap = torch.stack([torch.randperm(blocks)[: blocks // 2], torch.randperm(blocks // 2)], dim=1)
    swap_blocks_triton(allocation, host, swap, block_dim=2)
    record(
        f"swap_blocks out, {swap.shape[0]} blocks, all layers",
        host[:, :, swap[:, 1]],
        allocation[:, :, swap[:, 0].to(device)].cpu(),
        exact=True,
    )
    back = torch.zeros_like(allocation)
    swap_blocks_triton(host, back, swap.flip(1), block_dim=2)
    record("swap_blocks in", back[:, :, swap[:, 0].to(device)], allocation[:, :, swap[:, 0].to(device)], exact=True)


# ----- section 2: bandwidth --------------------------------------------------------------------------
def decode_metadata(block_tables, context_len: int, block_size: int):
    """Metadata of a decode batch in which every sequence has `context_len` tokens (vectorised)."""
    import torch

    from pagedinfer.kernels.metadata import AttentionMetadata

    batch = block_tables.shape[0]
    last = (context_len - 1) // block_size
    device = block_tables.device
    return AttentionMetadata(
        slot_mapping=block_tables[:, last].long() * block_size + (context_len - 1) % block_size,
        block_tables=block_tables,
        seq_lens=torch.full((batch,), context_len, dtype=torch.int32, device=device),
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device=device),
        max_seq_len=context_len,
        max_query_len=1,
        num_decode_seqs=batch,
        seq_lens_cpu=[context_len] * batch,
        query_lens_cpu=[1] * batch,
    )


def check_far_blocks(report: Report, key_cache, value_cache, heads: int, scale: float) -> None:
    """One decode over the pool's highest-numbered blocks against the reference.

    In a pool this large the cache offsets of those blocks pass 2**31 elements, which
    only int64 address arithmetic in the kernel reaches correctly.
    """
    import torch

    from pagedinfer.kernels import reference
    from pagedinfer.kernels.paged_attention import decode_attention

    num_blocks, block_size, _, head_dim = key_cache.shape
    batch, width = 2, 8
    tables = torch.arange(num_blocks - batch * width, num_blocks, device=key_cache.device).view(batch, width).int()
    meta = decode_metadata(tables.flip(1).contiguous(), width * block_size - 3, block_size)
    query = torch.randn(batch, heads, head_dim, device=key_cache.device).to(key_cache.dtype)
    got = decode_attention(query, key_cache, value_cache, meta, scale)
    want = reference.paged_attention(query, key_cache, value_cache, meta, scale)
    error = (got.float() - want.float()).abs().max().item()
    offset = (num_blocks - 1) * key_cache.stride(0)
    ok = error <= 2e-2 * (1 + want.float().abs().max().item()) and not got.isnan().any().item()
    report.line(
        f"{'PASS' if ok else 'FAIL'}  decode over the last blocks (cache offsets up to {offset:.2e} "
        f"elements, 2**31 = {2**31:.2e}) max |err| {error:.2e}"
    )
    report.add(
        "correctness",
        {
            "case": "decode over the last blocks of a large pool",
            "max_offset": offset,
            "max_abs_error": error,
            "ok": bool(ok),
        },
    )


def measure_bandwidth(report: Report, device, shapes: dict) -> None:
    import torch

    from pagedinfer.kernels.paged_attention import _num_sms, choose_num_splits, decode_attention

    dtype, heads, kv_heads, head_dim, block_size = (
        shapes["dtype"],
        shapes["heads"],
        shapes["kv_heads"],
        shapes["head_dim"],
        16,
    )
    copy_bytes = shapes["copy_bytes"]
    src = torch.empty(copy_bytes, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    copy_gbps = 2 * copy_bytes / bench_ms(lambda: dst.copy_(src), device) / 1e6
    report.line(f"device-to-device copy of {copy_bytes / 2**30:.1f} GiB: {copy_gbps:.0f} GB/s (read + written)")
    report.add("bandwidth", {"case": "copy", "bytes": copy_bytes, "gb_per_s": copy_gbps})
    del src, dst

    bytes_per_token = 2 * kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()
    combos = [
        (b, c)
        for b in shapes["batches"]
        for c in shapes["contexts"]
        if b * c * bytes_per_token <= shapes["max_kv_bytes"]
    ]
    pool_blocks = max(b * -(-c // block_size) for b, c in combos) + 1
    key_cache = torch.empty(pool_blocks, block_size, kv_heads, head_dim, dtype=dtype, device=device).normal_()
    value_cache = torch.empty_like(key_cache).normal_()
    scale = head_dim**-0.5
    report.line(
        f"KV pool {2 * key_cache.numel() * key_cache.element_size() / 2**30:.1f} GiB; "
        f"{_num_sms(device)} multiprocessors"
    )
    report.line(
        f"{'batch':>6} {'context':>8} {'KV MB':>9} {'splits':>6} {'ms':>8} {'GB/s':>7} {'% copy':>7} "
        f"{'graph ms':>9} {'graph %':>8}"
    )
    check_far_blocks(report, key_cache, value_cache, heads, scale)
    setups = {}
    for batch, context in combos:
        if report.seconds_left() < shapes["reserve_seconds"]:
            report.line("time budget reached: remaining decode combinations skipped")
            break
        width = -(-context // block_size)
        tables = torch.randperm(pool_blocks, device=device)[: batch * width].view(batch, width).int()
        meta = decode_metadata(tables, context, block_size)
        query = torch.randn(batch, heads, head_dim, device=device).to(dtype)
        out = torch.empty_like(query)
        setups[(batch, context)] = (query, meta, out)
        kv_bytes = batch * context * bytes_per_token
        run = lambda: decode_attention(query, key_cache, value_cache, meta, scale, out=out)  # noqa: E731
        ms = bench_ms(run, device)
        gms = None
        try:
            gms = graph_ms(run, device)
        except Exception as error:  # graph capture is an extra view; its failure is reported, not fatal
            report.line(f"  (CUDA graph timing failed: {error!r})")
        gbps = kv_bytes / ms / 1e6
        gpct = None if gms is None else 100 * kv_bytes / gms / 1e6 / copy_gbps
        splits = choose_num_splits(batch, kv_heads, context, _num_sms(device))
        report.line(
            f"{batch:>6} {context:>8} {kv_bytes / 1e6:>9.1f} {splits:>6} {ms:>8.3f} {gbps:>7.0f} "
            f"{100 * gbps / copy_gbps:>6.1f}% {gms if gms is None else round(gms, 3)!s:>9} "
            f"{'-' if gpct is None else f'{gpct:.1f}%':>8}"
        )
        report.add(
            "bandwidth",
            {
                "case": "decode",
                "batch": batch,
                "context": context,
                "kv_bytes": kv_bytes,
                "num_splits": splits,
                "ms": ms,
                "gb_per_s": gbps,
                "percent_of_copy": 100 * gbps / copy_gbps,
                "graph_ms": gms,
                "graph_percent_of_copy": gpct,
            },
        )

    for batch, context in shapes["no_split_cases"]:
        if (batch, context) in setups:
            query, meta, out = setups[(batch, context)]
            ms = bench_ms(
                lambda: decode_attention(query, key_cache, value_cache, meta, scale, out=out, num_splits=1), device
            )
            gbps = batch * context * bytes_per_token / ms / 1e6
            report.line(f"without split-K, batch {batch} context {context}: {ms:.3f} ms, {gbps:.0f} GB/s")
            report.add(
                "bandwidth", {"case": "decode_no_split", "batch": batch, "context": context, "ms": ms, "gb_per_s": gbps}
            )

    for batch, context in shapes["sweep_cases"]:
        if (batch, context) not in setups or report.seconds_left() < shapes["reserve_seconds"]:
            continue
        query, meta, out = setups[(batch, context)]
        timings = []
        for tile_n, warps, stages in shapes["sweep_configs"]:
            try:
                ms = bench_ms(
                    lambda: decode_attention(
                        query,
                        key_cache,
                        value_cache,
                        meta,
                        scale,
                        out=out,
                        tile_n=tile_n,
                        num_warps=warps,
                        num_stages=stages,
                    ),
                    device,
                )
            except Exception as error:  # a config the compiler rejects (e.g. out of shared memory) is reported
                timings.append(f"tile {tile_n}/warps {warps}/stages {stages}: failed ({type(error).__name__})")
                continue
            timings.append(f"tile {tile_n}/warps {warps}/stages {stages}: {ms:.3f}")
            report.add(
                "decode_sweep",
                {
                    "batch": batch,
                    "context": context,
                    "tile_n": tile_n,
                    "num_warps": warps,
                    "num_stages": stages,
                    "ms": ms,
                },
            )
        report.line(f"sweep batch {batch} context {context} (ms): " + "; ".join(timings))
    del key_cache, value_cache, setups


def compare_prefill(report: Report, device, shapes: dict) -> None:
    """Fresh causal prefill: the paged prefill kernel against torch SDPA on the same K/V laid out densely."""
    import torch
    import torch.nn.functional as F

    from pagedinfer.kernels.metadata import build_attention_metadata
    from pagedinfer.kernels.paged_attention import prefill_attention

    dtype, heads, kv_heads, head_dim, block_size = (
        shapes["dtype"],
        shapes["heads"],
        shapes["kv_heads"],
        shapes["head_dim"],
        16,
    )
    for batch, length in shapes["prefill_cases"]:
        width = -(-length // block_size)
        tables = torch.randperm(batch * width).view(batch, width).tolist()
        meta = build_attention_metadata([length] * batch, [length] * batch, tables, block_size, device)
        key_cache = torch.randn(batch * width, block_size, kv_heads, head_dim, device=device).to(dtype)
        value_cache = torch.randn_like(key_cache)
        query = torch.randn(batch * length, heads, head_dim, device=device).to(dtype)
        index = torch.tensor(tables, device=device).long()
        dense_k = key_cache[index].view(batch, -1, kv_heads, head_dim)[:, :length].transpose(1, 2).contiguous()
        dense_v = value_cache[index].view(batch, -1, kv_heads, head_dim)[:, :length].transpose(1, 2).contiguous()
        dense_q = query.view(batch, length, heads, head_dim).transpose(1, 2).contiguous()
        ms = bench_ms(lambda: prefill_attention(query, key_cache, value_cache, meta, head_dim**-0.5), device)
        sdpa_ms = bench_ms(
            lambda: F.scaled_dot_product_attention(dense_q, dense_k, dense_v, is_causal=True, enable_gqa=True), device
        )
        flops = 2 * 2 * batch * heads * head_dim * length * length / 2
        report.line(
            f"prefill batch {batch} x {length} tokens: paged kernel {ms:.3f} ms "
            f"({flops / ms / 1e9:.0f} TFLOP/s), torch SDPA dense {sdpa_ms:.3f} ms "
            f"({flops / sdpa_ms / 1e9:.0f} TFLOP/s), ratio {sdpa_ms / ms:.2f}"
        )
        report.add(
            "prefill",
            {
                "batch": batch,
                "length": length,
                "ms": ms,
                "sdpa_ms": sdpa_ms,
                "tflops": flops / ms / 1e9,
                "sdpa_tflops": flops / sdpa_ms / 1e9,
            },
        )


# ----- section 3: end to end ------------------------------------------------------------------------
def end_to_end(report: Report, device, shapes: dict, num_requests: int) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.empty_cache()
    if report.seconds_left() < shapes["e2e_seconds"]:
        report.line(f"skipped: {report.seconds_left():.0f} s left, section 3 needs about {shapes['e2e_seconds']}")
        return
    model_dir = Path(tempfile.mkdtemp(prefix="pagedinfer_e2e_"))
    try:
        compare_engine_with_generate(report, device, shapes, num_requests, model_dir)
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)


def compare_engine_with_generate(report: Report, device, shapes: dict, num_requests: int, model_dir: Path) -> None:
    import gc

    import torch
    import transformers

    from pagedinfer.engine import LLM, SamplingParams
    from pagedinfer.engine.tiny_model import train_tokenizer

    tokenizer = train_tokenizer(model_dir)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
        **shapes["e2e_model"],
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config).to(shapes["e2e_dtype"])
    num_params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(str(model_dir))
    del model
    report.line(
        f"random Llama: {num_params / 1e9:.2f} B parameters, {config.num_hidden_layers} layers, "
        f"{str(shapes['e2e_dtype'])[6:]}"
    )

    rng = random.Random(0)
    lo_prompt, hi_prompt = shapes["e2e_prompt_lens"]
    lo_out, hi_out = shapes["e2e_output_lens"]
    prompts = [
        [rng.randrange(8, len(tokenizer)) for _ in range(rng.randint(lo_prompt, hi_prompt))]
        for _ in range(num_requests)
    ]
    output_lens = [rng.randint(lo_out, hi_out) for _ in range(num_requests)]
    useful_tokens = sum(output_lens)

    llm = LLM(
        model=str(model_dir),
        dtype=str(shapes["e2e_dtype"])[6:],
        gpu_memory_utilization=0.5,
        max_model_len=hi_prompt + hi_out + 16,
        forward=shapes["e2e_forward"],
    )
    report.line(
        f"forward {shapes['e2e_forward']!r}: the Triton decoder "
        f"{'runs' if llm.llm_engine.runner.triton_decoder is not None else 'does not run'}"
    )
    # Untimed: the same length mix at a sixteenth of the requests compiles every kernel variant the
    # timed run meets (decode with and without split-K, prefill, merge) before the clock starts.
    warm_up = prompts[: max(4, num_requests // 16)] + [(prompts[1] * hi_prompt)[: hi_prompt + hi_out // 2]]
    llm.generate(warm_up, SamplingParams(temperature=0.0, max_tokens=hi_out // 4, ignore_eos=True))
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in output_lens]
    began = time.perf_counter()
    outputs = llm.generate(prompts, params)
    engine_seconds = time.perf_counter() - began
    produced = sum(len(o.outputs[0].token_ids) for o in outputs)
    engine_tokens = [o.outputs[0].token_ids for o in outputs]
    report.line(
        f"pagedinfer LLM: {produced} output tokens in {engine_seconds:.2f} s = {produced / engine_seconds:.0f} tokens/s"
    )
    report.add(
        "e2e",
        {
            "system": "pagedinfer",
            "num_params": num_params,
            "num_requests": num_requests,
            "output_tokens": produced,
            "requested_tokens": useful_tokens,
            "seconds": engine_seconds,
            "tokens_per_s": produced / engine_seconds,
        },
    )
    del llm, outputs
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()

    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=shapes["e2e_dtype"])
    model.to(device).eval()
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    attention_mask = (
        torch.arange(width, device=device)[None, :]
        >= torch.tensor([width - len(p) for p in prompts], device=device)[:, None]
    ).long()
    max_new = max(output_lens)
    with torch.no_grad():
        model.generate(
            input_ids[:4], attention_mask=attention_mask[:4], max_new_tokens=4, do_sample=False, pad_token_id=pad
        )
        if device.type == "cuda":
            torch.cuda.synchronize()
        began = time.perf_counter()
        generated = model.generate(
            input_ids,
            attention_mask=attention_mask,
            max_new_tokens=max_new,
            min_new_tokens=max_new,
            do_sample=False,
            pad_token_id=pad,
        )
        if device.type == "cuda":
            torch.cuda.synchronize()
    hf_seconds = time.perf_counter() - began
    hf_tokens = [generated[i, width : width + n].tolist() for i, n in enumerate(output_lens)]
    same = sum(a == b for a, b in zip(engine_tokens, hf_tokens))
    report.line(
        f"transformers generate (one static batch of {num_requests}, {max_new} new tokens each): "
        f"{hf_seconds:.2f} s = {useful_tokens / hf_seconds:.0f} requested tokens/s "
        f"({num_requests * max_new / hf_seconds:.0f} incl. padding)"
    )
    speedup = (produced / engine_seconds) / (useful_tokens / hf_seconds)
    report.line(
        f"speed-up pagedinfer / transformers: {speedup:.2f}; "
        f"greedy outputs identical for {same}/{num_requests} requests"
    )
    report.add(
        "e2e",
        {
            "system": "transformers",
            "num_requests": num_requests,
            "requested_tokens": useful_tokens,
            "seconds": hf_seconds,
            "tokens_per_s": useful_tokens / hf_seconds,
            "identical_outputs": same,
            "speedup": speedup,
        },
    )


def shapes_for(smoke: bool) -> dict:
    import torch

    if smoke:
        return dict(
            dtype=torch.float16,
            heads=4,
            kv_heads=2,
            head_dim=32,
            write_tokens=40,
            window=24,
            decode_lens=[1, 16, 17, 90],
            mixed=([5, 33, 60], [1, 20, 60]),
            variants=[(80, torch.float32)],
            copy_layers=2,
            copy_blocks=8,
            copy_bytes=1 << 20,
            batches=[1, 2],
            contexts=[64, 256],
            max_kv_bytes=40e9,
            reserve_seconds=0,
            no_split_cases=[(1, 256)],
            sweep_cases=[(2, 64)],
            sweep_configs=[(64, 4, 2), (32, 4, 2)],
            prefill_cases=[(1, 48)],
            layer_tokens=20,
            layer_hidden=72,
            layer_inter=40,
            rotary_cases=[(4, 2, 16, False), (3, 1, 24, True)],
            decoder_requests=1,
            decoder_generate_requests=1,
            decoder_prompt_lens=(3, 5),
            decoder_output_len=2,
            decoder_model={},
            e2e_forward="auto",
            e2e_seconds=0,
            e2e_dtype=torch.float32,
            e2e_prompt_lens=(3, 40),
            e2e_output_lens=(1, 6),
            e2e_model=dict(
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=256,
            ),
        )
    return dict(
        dtype=torch.bfloat16,
        heads=32,
        kv_heads=8,
        head_dim=128,
        write_tokens=4096,
        window=256,
        decode_lens=[1, 15, 16, 17, 255, 1000, 2048, 4097, 8191],
        mixed=([300, 17, 1536, 700, 64], [1, 1, 512, 700, 33]),
        variants=[
            (64, torch.bfloat16),
            (80, torch.bfloat16),
            (96, torch.bfloat16),
            (256, torch.bfloat16),
            (128, torch.float16),
            (128, torch.float32),
        ],
        copy_layers=32,
        copy_blocks=256,
        copy_bytes=2 << 30,
        batches=[1, 16, 64, 256],
        contexts=[512, 2048, 8192, 32768],
        max_kv_bytes=40e9,
        reserve_seconds=200,
        no_split_cases=[(1, 32768), (16, 2048)],
        sweep_cases=[(16, 8192), (1, 32768)],
        sweep_configs=[(64, 4, 2), (32, 4, 2), (64, 4, 3), (128, 4, 2), (64, 8, 2), (128, 8, 3), (32, 2, 3)],
        prefill_cases=[(1, 4096), (8, 1024)],
        layer_tokens=4096,
        layer_hidden=4096,
        layer_inter=14336,
        rotary_cases=[(32, 8, 128, False), (40, 8, 128, True), (12, 4, 80, False)],
        decoder_requests=64,
        decoder_generate_requests=16,
        decoder_prompt_lens=(16, 400),
        decoder_output_len=32,
        decoder_model=dict(
            llama=dict(
                vocab_size=32000,
                hidden_size=1024,
                intermediate_size=2816,
                num_hidden_layers=4,
                num_attention_heads=16,
                num_key_value_heads=4,
                max_position_embeddings=2048,
            ),
            qwen3=dict(
                vocab_size=32000,
                hidden_size=1024,
                intermediate_size=2816,
                num_hidden_layers=4,
                num_attention_heads=16,
                num_key_value_heads=4,
                head_dim=128,
                max_position_embeddings=2048,
            ),
        ),
        e2e_forward="auto",
        e2e_seconds=150,
        e2e_dtype=torch.bfloat16,
        e2e_prompt_lens=(16, 512),
        e2e_output_lens=(16, 256),
        e2e_model=dict(
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=2048,
        ),
    )


def main() -> int:
    args = parse_args()
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ["PAGEDINFER_ATTENTION"] = "triton"
    make_importable()
    import torch
    import transformers
    import triton

    device = torch.device("cpu" if args.smoke else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --smoke for the CPU interpreter check", flush=True)
        return 2
    report = Report(args.budget_seconds)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (Triton interpreter)"
    report.results.update(
        command=" ".join([Path(sys.executable).name, *sys.argv]),
        gpu=gpu,
        date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        python=platform.python_version(),
        torch=torch.__version__,
        triton=triton.__version__,
        transformers=transformers.__version__,
    )
    report.line(" | ".join(f"{k}: {report.results[k]}" for k in ("gpu", "date", "torch", "triton", "transformers")))
    shapes = shapes_for(args.smoke)
    sections = set(args.sections.split(","))
    if "correctness" in sections:
        report.run_section("correctness", check_correctness, device, shapes)
    if sections & {"layer kernels", "decoder"}:
        gpu_decoder_check = sibling_module("gpu_decoder_check")  # our decoder's kernels and greedy output
        if "layer kernels" in sections:
            report.run_section("layer kernels", gpu_decoder_check.check_layer_kernels, device, shapes)
        if "decoder" in sections:
            report.run_section("decoder", gpu_decoder_check.check_decoder, device, shapes)
    if "bandwidth" in sections:
        report.run_section("bandwidth", measure_bandwidth, device, shapes)
    if "prefill" in sections:
        report.run_section("prefill", compare_prefill, device, shapes)
    if args.skip_e2e or "e2e" not in sections:
        report.line("\nsection 3 skipped (--skip-e2e)")
    else:
        num_requests = min(args.num_requests, 6) if args.smoke else args.num_requests
        report.run_section("e2e", end_to_end, device, shapes, num_requests)
    if "engine" in sections:
        report.run_section(
            "engine",
            sibling_module("gpu_engine_check").engine_section,
            device,
            args.smoke,
            args.serve_site,
            not args.skip_serve,
        )
    failed = [r["case"] for r in report.results["sections"].get("correctness", []) if not r.get("ok", True)]
    crashed = report.results.get("failed_sections", [])
    report.line(
        f"\ndone in {time.monotonic() - report.start:.0f} s; correctness failures: {failed or 'none'}; "
        f"sections that raised: {crashed or 'none'}"
    )
    report.save()
    return 1 if failed or crashed else 0


if __name__ == "__main__":
    sys.exit(main())
