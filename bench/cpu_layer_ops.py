"""Microseconds per call of the native CPU layer ops against the transformers torch ops they replace, 125M shapes.

    .venv/bin/python bench/cpu_layer_ops.py --threads 1

Per op and token count M (hidden 768, 12 query and 4 KV heads of 64, MLP 2048, as the 125M bench model):
- rms_norm: `LlamaRMSNorm` (cast, pow, mean, rsqrt, two muls, cast) vs `cpu_rms_norm`;
- add+rms_norm: `residual + x` then `LlamaRMSNorm` vs `cpu_fused_add_rms_norm` (in place);
- rotary: transformers' `apply_rotary_pos_emb` on q and k split from one qkv output (views, transposes,
  rotate_half, muls, adds; the cos/sin of the step given) vs `cpu_rotary_embedding` in place on the qkv rows;
- silu*mul: `F.silu(gate) * up` on one gate_up output vs `cpu_silu_and_mul`.
Each cell is the median of `--repeats` rounds; a round times `--calls` calls of each side, alternating,
on the same inputs (in-place ops rewrite their rows each call: the work is the same). Before timing,
each native op's result is checked against the torch side's (float32 rounding; bfloat16 within 2%).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 768, 12, 4, 64, 2048


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--m", type=int, nargs="+", default=[1, 16, 48, 256], help="token counts")
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--calls", type=int, default=200)
    return p.parse_args(argv)


def cases(m: int, dtype: torch.dtype) -> dict:
    """op -> (torch side, native side): functions of no argument over the same inputs."""
    from transformers.models.llama import modeling_llama

    from pagedinfer.engine.cpu.fused_layers import rotary_cos_sin
    from pagedinfer.engine.tiny_model import tiny_config
    from pagedinfer.kernels.cpu import layer_ops

    torch.manual_seed(m)
    norm = modeling_llama.LlamaRMSNorm(HIDDEN, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x, residual = torch.randn(m, HIDDEN, dtype=dtype), torch.randn(m, HIDDEN, dtype=dtype)
    config = tiny_config(
        "llama",
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=2048,
    )
    rotary = modeling_llama.LlamaRotaryEmbedding(config)
    positions = torch.randint(0, 2048, (m,))
    cos, sin = rotary(torch.zeros(1, dtype=dtype), positions[None])
    table = rotary_cos_sin(rotary, 2048)
    qkv = torch.randn(m, (HEADS + 2 * KV_HEADS) * HEAD_DIM, dtype=dtype)
    sizes = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM)
    gate_up = torch.randn(m, 2 * INTERMEDIATE, dtype=dtype)

    def torch_rotary():
        q, k, _ = qkv.split(sizes, dim=-1)
        q, k = q.view(1, m, -1, HEAD_DIM).transpose(1, 2), k.view(1, m, -1, HEAD_DIM).transpose(1, 2)
        return modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)

    def torch_silu_mul():
        gate, up = gate_up.split(INTERMEDIATE, dim=-1)
        return F.silu(gate) * up

    return {
        "rms_norm": (lambda: norm(x), lambda: layer_ops.rms_norm(x, norm.weight, 1e-6)),
        "add+rms_norm": (
            lambda: norm(residual + x),
            lambda: layer_ops.fused_add_rms_norm(x, residual, norm.weight, 1e-6),
        ),
        "rotary": (torch_rotary, lambda: layer_ops.rotary_embedding(positions, qkv, table, HEADS, KV_HEADS, HEAD_DIM)),
        "silu*mul": (torch_silu_mul, lambda: layer_ops.silu_and_mul(gate_up)),
    }, (x, residual, norm, qkv, positions, table, torch_rotary, gate_up)


def check(m: int, dtype: torch.dtype) -> None:
    """The native results equal the torch side's (before any timing: a wrong kernel is not benchmarked)."""
    from pagedinfer.kernels.cpu import layer_ops

    tol = 1e-5 if dtype == torch.float32 else 2e-2
    _, (x, residual, norm, qkv, positions, table, torch_rotary, gate_up) = cases(m, dtype)
    torch.testing.assert_close(layer_ops.rms_norm(x, norm.weight, 1e-6), norm(x), rtol=tol, atol=tol)
    want = norm(residual + x)
    layer_ops.fused_add_rms_norm(x, residual, norm.weight, 1e-6)
    torch.testing.assert_close(x, want, rtol=tol, atol=tol)
    want_q, want_k = torch_rotary()
    layer_ops.rotary_embedding(positions, qkv, table, HEADS, KV_HEADS, HEAD_DIM)
    torch.testing.assert_close(qkv[:, : HEADS * HEAD_DIM], want_q.transpose(1, 2).reshape(m, -1), rtol=tol, atol=tol)
    gate, up = gate_up.split(INTERMEDIATE, dim=-1)
    torch.testing.assert_close(layer_ops.silu_and_mul(gate_up), F.silu(gate) * up, rtol=tol, atol=tol)


def per_call_us(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from pagedinfer.kernels.cpu import layer_ops, ops

    dtypes = [getattr(torch, d) for d in args.dtypes]
    if not all(layer_ops.available(d) for d in dtypes):
        raise SystemExit("the native CPU layer ops did not build (a C++ compiler and ninja are needed)")
    print(f"threads={args.threads}, ISA {ops.attention_isa()}, medians of {args.repeats} x {args.calls} calls (us)")
    print(f"{'dtype':9} {'op':13} {'M':>5} {'torch us':>9} {'native us':>9} {'speed-up':>8}")
    with torch.inference_mode():
        for dtype in dtypes:
            for m in args.m:
                check(m, dtype)
                for op, (torch_side, native) in cases(m, dtype)[0].items():
                    torch_side(), native()  # warm-up
                    rounds = [
                        (per_call_us(torch_side, args.calls), per_call_us(native, args.calls))
                        for _ in range(args.repeats)
                    ]
                    t, n = (statistics.median(r[i] for r in rounds) for i in (0, 1))
                    print(f"{args.dtypes[dtypes.index(dtype)]:9} {op:13} {m:5d} {t:9.1f} {n:9.1f} {t / n:7.2f}x")


if __name__ == "__main__":
    main()
