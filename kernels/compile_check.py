"""Compile every kernel variant the launchers use for a GPU target, without a GPU.

Triton can lower a kernel to PTX and a cubin ahead of time for a named target
(`GPUTarget("cuda", 90, 32)` is Hopper) with its bundled `ptxas`, no driver
needed. That catches what the CPU interpreter cannot: constructs the GPU
compiler rejects, and shared memory beyond the chip's per-block limit (232448
bytes on sm_90). The variants are the launchers' own tile shapes at
Llama-3-8B-like shapes plus the odd cases (fp32, head_dim 80 and 256, GQA 3).

    cd /tmp && python -m pagedinfer.kernels.compile_check [--arch 90]    # one JSON line per variant

Run it without `TRITON_INTERPRET` (under the interpreter kernels are not compiled), and not from
the repository root (`python -m` puts the working directory on sys.path, and `operator/` there
would shadow the standard library).
"""

from __future__ import annotations

import argparse
import json
import sys

HOPPER_MAX_SHARED_BYTES = 232448
STRIDE_ARGS = ("stride_qt", "stride_qh", "stride_ot", "stride_oh", "stride_cb", "stride_cs", "stride_ch")
TRITON_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def _compile(
    fn,
    pointer_types: dict,
    constants: dict,
    arch: int,
    num_warps: int = 4,
    num_stages: int = 2,
    aligned_ints: tuple = (),
) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, attrs = {}, {}
    for index, name in enumerate(fn.arg_names):
        signature[name] = "constexpr" if name in constants else pointer_types.get(name, "i32")
        if signature[name].startswith("*") or name in aligned_ints:
            attrs[(index,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn, signature, constexprs=constants, attrs=attrs)
    compiled = triton.compile(
        source, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=num_warps, num_stages=num_stages)
    )
    return {"shared_bytes": compiled.metadata.shared}


def attention_variants() -> list[tuple[str, dict]]:
    """(name, arguments) of the attention kernel as the launchers configure it."""
    import torch

    from pagedinfer.kernels.paged_attention import decode_tile_shape, prefill_tile_shape, prefill_warps_stages

    variants = []
    for dtype, heads, kv_heads, head_dim, block_size in [
        (torch.bfloat16, 32, 8, 128, 16),
        (torch.float32, 32, 8, 128, 16),
        (torch.bfloat16, 16, 4, 256, 16),
        (torch.float16, 12, 4, 80, 8),
    ]:
        prefill_launch = prefill_warps_stages(head_dim, dtype)
        for phase, tiles, window, splits, (warps, stages) in [
            ("decode", decode_tile_shape(heads, kv_heads, head_dim), False, False, (4, 2)),
            ("decode split-K", decode_tile_shape(heads, kv_heads, head_dim), True, True, (4, 2)),
            ("prefill", prefill_tile_shape(heads, kv_heads, head_dim), True, False, prefill_launch),
            ("prefill no window", prefill_tile_shape(heads, kv_heads, head_dim), False, False, prefill_launch),
        ]:
            name = f"{phase} {str(dtype)[6:]} heads {heads}/{kv_heads} head_dim {head_dim} block {block_size}"
            variants.append(
                (
                    name,
                    dict(
                        dtype=dtype,
                        heads=heads,
                        kv_heads=kv_heads,
                        head_dim=head_dim,
                        block_size=block_size,
                        tiles=tiles,
                        window=window,
                        splits=splits,
                        num_warps=warps,
                        num_stages=stages,
                    ),
                )
            )
    return variants


def layer_kernel_jobs() -> list[tuple]:
    """The Triton decoder's layer kernels (`engine/gpu_forward/`) at Llama-3-8B-like and Qwen3-like shapes."""
    from triton import next_power_of_2 as pow2

    from pagedinfer.kernels.rms_norm import rms_norm_kernel
    from pagedinfer.kernels.rotary_kv import rotary_write_kv_kernel
    from pagedinfer.kernels.silu_mul import silu_mul_kernel

    jobs = []
    for dtype in ("bf16", "fp32"):
        for residual in (False, True):
            jobs.append(
                (
                    f"rms_norm {dtype} hidden 4096 residual {residual}",
                    rms_norm_kernel,
                    dict(
                        x_ptr=f"*{dtype}",
                        residual_ptr=f"*{dtype}",
                        weight_ptr=f"*{dtype}",
                        out_ptr=f"*{dtype}",
                        eps="fp32",
                    ),
                    dict(HIDDEN=4096, BLOCK_N=4096, HAS_RESIDUAL=residual),
                    (),
                )
            )
        jobs.append(
            (
                f"silu_mul {dtype} inter 14336",
                silu_mul_kernel,
                dict(x_ptr=f"*{dtype}", out_ptr=f"*{dtype}"),
                dict(INTER=14336, BLOCK_N=1024),
                (),
            )
        )
        for heads, kv_heads, head_dim, qk_norm in ((32, 8, 128, False), (40, 8, 128, True), (12, 4, 80, False)):
            jobs.append(
                (
                    f"rotary_write_kv {dtype} heads {heads}/{kv_heads} head_dim {head_dim} qk_norm {qk_norm}",
                    rotary_write_kv_kernel,
                    dict(
                        qkv_ptr=f"*{dtype}",
                        positions_ptr="*i64",
                        cos_sin_ptr="*fp32",
                        q_norm_ptr=f"*{dtype}",
                        k_norm_ptr=f"*{dtype}",
                        key_cache_ptr=f"*{dtype}",
                        value_cache_ptr=f"*{dtype}",
                        slot_mapping_ptr="*i64",
                        eps="fp32",
                    ),
                    dict(
                        NUM_Q_HEADS=heads,
                        NUM_KV_HEADS=kv_heads,
                        HEAD_DIM=head_dim,
                        HALF=head_dim // 2,
                        BLOCK_HQ=pow2(heads),
                        BLOCK_HK=pow2(kv_heads),
                        BLOCK_HALF=pow2(head_dim // 2),
                        BLOCK_D=pow2(head_dim),
                        BLOCK_SIZE=16,
                        HAS_QK_NORM=qk_norm,
                    ),
                    ("stride_t", "stride_cb", "stride_cs", "stride_ch"),
                )
            )
    return jobs


def check(arch: int) -> list[dict]:
    from pagedinfer.kernels.attention_kernels import merge_splits_kernel, paged_attention_kernel
    from pagedinfer.kernels.block_copy import CHUNK, copy_blocks_kernel
    from pagedinfer.kernels.paged_attention import kernel_constants
    from pagedinfer.kernels.write_kv import write_kv_kernel

    jobs = []
    for name, v in attention_variants():
        element = TRITON_DTYPES[str(v["dtype"])[6:]]
        scratch = "fp32" if v["splits"] else element
        pointers = dict(
            out_ptr=f"*{element}",
            partial_out_ptr=f"*{scratch}",
            partial_max_ptr=f"*{scratch}",
            partial_sum_ptr=f"*{scratch}",
            query_ptr=f"*{element}",
            key_cache_ptr=f"*{element}",
            value_cache_ptr=f"*{element}",
            block_tables_ptr="*i32",
            seq_lens_ptr="*i32",
            query_start_loc_ptr="*i32",
            scale_log2="fp32",
        )
        constants = kernel_constants(
            v["heads"], v["kv_heads"], v["head_dim"], v["block_size"], v["dtype"], v["tiles"], v["window"], v["splits"]
        )
        jobs.append(
            (
                f"attention {name}",
                paged_attention_kernel,
                pointers,
                constants,
                STRIDE_ARGS,
                (v["num_warps"], v["num_stages"]),
            )
        )
    jobs.append(
        (
            "merge_splits bfloat16 head_dim 128 x 64 splits",
            merge_splits_kernel,
            dict(out_ptr="*bf16", partial_out_ptr="*fp32", partial_max_ptr="*fp32", partial_sum_ptr="*fp32"),
            dict(HEAD_DIM=128, BLOCK_D=128, BLOCK_S=64),
            (),
        )
    )
    jobs.append(
        (
            "write_kv bfloat16 8 x 128",
            write_kv_kernel,
            dict(
                key_ptr="*bf16",
                value_ptr="*bf16",
                key_cache_ptr="*bf16",
                value_cache_ptr="*bf16",
                slot_mapping_ptr="*i64",
            ),
            dict(NUM_KV_HEADS=8, HEAD_DIM=128, BLOCK_SIZE=16, BLOCK_H=8, BLOCK_D=128),
            (),
        )
    )
    jobs.append(
        (
            "copy_blocks bfloat16",
            copy_blocks_kernel,
            dict(
                src_ptr="*bf16",
                dst_ptr="*bf16",
                src_ids_ptr="*i64",
                dst_ids_ptr="*i64",
                src_cache_stride="i64",
                dst_cache_stride="i64",
                src_block_stride="i64",
                dst_block_stride="i64",
            ),
            dict(CHUNK=CHUNK),
            (),
        )
    )
    jobs.extend(layer_kernel_jobs())
    results = []
    for name, fn, pointers, constants, aligned, *launch in jobs:
        warps, stages = launch[0] if launch else (4, 2)
        try:
            result = {"kernel": name, **_compile(fn, pointers, constants, arch, warps, stages, aligned_ints=aligned)}
            result["ok"] = result["shared_bytes"] <= HOPPER_MAX_SHARED_BYTES
        except Exception as error:  # reported per variant: one failure must not hide the others
            result = {"kernel": name, "ok": False, "error": f"{type(error).__name__}: {error}"}
        results.append(result)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description="compile pagedinfer's Triton kernels for a GPU target")
    parser.add_argument("--arch", type=int, default=90, help="compute capability as an integer (90 = Hopper)")
    args = parser.parse_args()
    results = check(args.arch)
    for result in results:
        print(json.dumps(result), flush=True)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
