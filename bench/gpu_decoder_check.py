"""`bench/gpu_check.py`'s section for our own decoder (engine/gpu_forward/): its layer kernels and its greedy output.

Imported by gpu_check.py (same folder, after `make_importable`); each function takes its `Report`:

- `check_layer_kernels`: add + RMSNorm, rotary + paged KV write (Llama's heads and
  Qwen3's q/k norms; 1 token in 17 a padding row) and SiLU-and-multiply against their
  torch references in the run's dtype at Llama-3-8B-like shapes;
- `check_decoder`: the engine with `forward="triton"` against `forward="module"` and
  transformers' `generate` on random Llama and Qwen3 models: in float32 every greedy
  token equals `generate`'s; in bfloat16 at least 95% of first tokens equal the module
  path's (the issue's bar); tokens/s of both forwards on the same requests, ratio printed.
"""

from __future__ import annotations

import gc
import random
import shutil
import tempfile
import time
from pathlib import Path

from gpu_check import generate_reference

TOLERANCE = {"bfloat16": 2e-2, "float16": 4e-3, "float32": 1e-4}  # absolute and relative, as section 1


def _record(report, name: str, got, want) -> bool:
    diff = (got.float() - want.float()).abs()
    error = diff.max().item() if got.numel() else 0.0
    ok = (
        bool((diff <= TOLERANCE[str(got.dtype)[6:]] * (1 + want.float().abs())).all().item())
        and not got.isnan().any().item()
    )
    report.line(f"{'PASS' if ok else 'FAIL'}  {name:<58} max |err| {error:.2e}")
    report.add("correctness", {"case": name, "max_abs_error": error, "ok": ok})
    return ok


def check_layer_kernels(report, device, shapes: dict) -> None:
    import torch

    from pagedinfer.kernels.rms_norm import rms_norm, rms_norm_reference
    from pagedinfer.kernels.rotary_kv import rotary_write_kv, rotary_write_kv_reference
    from pagedinfer.kernels.silu_mul import silu_mul, silu_mul_reference

    dtype, tokens, hidden, inter = (
        shapes["dtype"],
        shapes["layer_tokens"],
        shapes["layer_hidden"],
        shapes["layer_inter"],
    )
    gen = torch.Generator(device=device).manual_seed(0)
    randn = lambda *shape: torch.randn(*shape, generator=gen, device=device).to(dtype)  # noqa: E731
    x, residual, weight = randn(tokens, hidden), randn(tokens, hidden), randn(hidden)
    for with_residual in (False, True):
        res = residual.clone() if with_residual else None
        want_out, want_res = rms_norm_reference(x, weight, 1e-5, res)
        got_out, got_res = rms_norm(x, weight, 1e-5, res)
        _record(report, f"rms_norm {tokens} x {hidden}, residual {with_residual}", got_out, want_out)
        _record(report, f"rms_norm {tokens} x {hidden}, its residual {with_residual}", got_res, want_res)
    gate_up = randn(tokens, 2 * inter)
    _record(report, f"silu_mul {tokens} x {inter}", silu_mul(gate_up), silu_mul_reference(gate_up))
    block_size = 16
    for heads, kv_heads, head_dim, qk_norm in shapes["rotary_cases"]:
        width = (heads + 2 * kv_heads) * head_dim
        qkv = randn(tokens, width)
        positions = torch.randint(0, 4096, (tokens,), generator=gen, device=device)
        angles = torch.arange(4096, device=device).float()[:, None] * (
            1.0 / 500000 ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)
        )
        cos_sin = torch.cat((angles.cos(), angles.sin()), -1)
        num_blocks = tokens // block_size + 8
        slots = torch.randperm(num_blocks * block_size, generator=gen, device=device)[:tokens]
        slots[::17] = -1
        norms = (randn(head_dim), randn(head_dim), 1e-6) if qk_norm else None
        caches = [torch.zeros(num_blocks, block_size, kv_heads, head_dim, dtype=dtype, device=device) for _ in range(4)]
        want, got = qkv.clone(), qkv.clone()
        rotary_write_kv_reference(
            want, positions, cos_sin, caches[2], caches[3], slots, heads, kv_heads, head_dim, norms
        )
        rotary_write_kv(got, positions, cos_sin, caches[0], caches[1], slots, heads, kv_heads, head_dim, norms)
        name = f"rotary+write_kv {heads}/{kv_heads} heads x {head_dim}, qk_norm {qk_norm}, 1 in 17 padding"
        _record(report, name + ": q/k", got, want)
        _record(report, name + ": caches", torch.stack(caches[:2]), torch.stack(caches[2:]))


def _engine_tokens(model_dir: Path, dtype: str, forward: str, prompts, output_len: int, device) -> tuple[list, float]:
    import torch

    from pagedinfer.engine import LLM, SamplingParams

    llm = LLM(
        model=str(model_dir),
        dtype=dtype,
        forward=forward,
        gpu_memory_utilization=0.3,
        max_model_len=max(map(len, prompts)) + output_len + 8,
    )
    runner = llm.llm_engine.runner
    if (runner.triton_decoder is not None) != (forward == "triton"):
        raise RuntimeError(f"forward {forward!r} did not select the expected decoder")
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    if device.type == "cuda":  # every kernel variant compiled before the clock starts
        llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    began = time.perf_counter()
    tokens = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    seconds = time.perf_counter() - began
    del llm, runner
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return tokens, sum(map(len, tokens)) / seconds


def check_decoder(report, device, shapes: dict) -> None:
    from pagedinfer.engine.tiny_model import make_tiny_model

    if not shapes["decoder_model"]:  # --smoke: tests/engine/test_gpu_forward.py runs the same on the interpreter
        report.line("no decoder models in smoke mode (tests/engine/test_gpu_forward.py checks the decoder on a CPU)")
        return
    root = Path(tempfile.mkdtemp(prefix="pagedinfer_decoder_"))
    try:
        for arch in shapes["decoder_model"]:
            model_dir = make_tiny_model(root / arch, arch=arch, **shapes["decoder_model"][arch])
            rng = random.Random(1)
            lo, hi = shapes["decoder_prompt_lens"]
            prompts = [
                [rng.randrange(8, 380) for _ in range(rng.randint(lo, hi))] for _ in range(shapes["decoder_requests"])
            ]
            output_len = shapes["decoder_output_len"]
            fp32, fp32_tps = _engine_tokens(model_dir, "float32", "triton", prompts, output_len, device)
            want = generate_reference(model_dir, prompts[: shapes["decoder_generate_requests"]], output_len, device)
            same = sum(a == b for a, b in zip(fp32, want))
            ok = same == len(want)
            report.line(
                f"{'PASS' if ok else 'FAIL'}  {arch} fp32 Triton decoder greedy == generate: {same}/{len(want)}"
            )
            report.add(
                "correctness",
                {"case": f"{arch} fp32 Triton decoder == generate", "identical": same, "requests": len(want), "ok": ok},
            )
            if device.type != "cuda":
                continue  # bf16 and the speed comparison are the GPU's
            triton_bf16, triton_tps = _engine_tokens(model_dir, "bfloat16", "triton", prompts, output_len, device)
            module_bf16, module_tps = _engine_tokens(model_dir, "bfloat16", "module", prompts, output_len, device)
            first = sum(a[0] == b[0] for a, b in zip(triton_bf16, module_bf16)) / len(prompts)
            whole = sum(a == b for a, b in zip(triton_bf16, module_bf16))
            ok = first >= 0.95
            report.line(
                f"{'PASS' if ok else 'FAIL'}  {arch} bf16 first tokens Triton == module: {100 * first:.1f}%"
                f" (whole outputs {whole}/{len(prompts)})"
            )
            report.line(
                f"      {arch} bf16 tokens/s: Triton decoder {triton_tps:.0f}, module path {module_tps:.0f},"
                f" ratio {triton_tps / module_tps:.2f} ({len(prompts)} requests x {output_len} tokens;"
                f" fp32 Triton {fp32_tps:.0f})"
            )
            report.add(
                "correctness",
                {
                    "case": f"{arch} bf16 first tokens Triton == module",
                    "fraction": first,
                    "identical_outputs": whole,
                    "ok": ok,
                },
            )
            report.add(
                "decoder",
                {
                    "arch": arch,
                    "triton_tokens_per_s": triton_tps,
                    "module_tokens_per_s": module_tps,
                    "ratio": triton_tps / module_tps,
                    "requests": len(prompts),
                    "output_len": output_len,
                },
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
