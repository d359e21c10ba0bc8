"""Beam search KV sharing: peak blocks of a beam group vs one sequence of the same length.

    OMP_NUM_THREADS=1 .venv/bin/python bench/beam_sharing.py [--prompt-tokens 200] [--max-tokens 64]
        [--beam-width 4] [--block-size 16] [--model-dir DIR]

A beam search's live beams are sequences of one group that fork their parent's
block table (reference counts, copy-on-write of a shared last block only), and
pruned beams free their blocks at once. This runs one greedy sequence of
prompt + max_tokens tokens, then a beam search over the same prompt, on the
tiny random-weight Llama (built in --model-dir), prefix caching off so neither
run borrows the other's blocks, and prints the pool's high-water mark
(`BlockPool.peak_num_used_blocks`) of each, their ratio, and what beam_width
unshared copies would hold. It exits 1 if any block is still held afterwards.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--beam-width", type=int, default=4)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--model-dir", default=None, help="where to build the tiny model (default: a temp dir)")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    from pagedinfer.engine import LLM, SamplingParams
    from pagedinfer.engine.beam.params import BeamSearchParams
    from pagedinfer.engine.tiny_model import make_tiny_model

    tmp = tempfile.TemporaryDirectory() if args.model_dir is None else None
    model = make_tiny_model(Path(args.model_dir or tmp.name) / "tiny-llama", arch="llama")
    rng = random.Random(0)
    prompt = [rng.randrange(8, 384) for _ in range(args.prompt_tokens)]
    llm = LLM(
        model=str(model),
        dtype="float32",
        block_size=args.block_size,
        enable_prefix_caching=False,
        max_model_len=args.prompt_tokens + args.max_tokens + args.block_size,
        device="cpu",
    )
    pool = llm.llm_engine.kv.pool
    pool.reset_peak()
    llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True))
    one = pool.peak_num_used_blocks
    pool.reset_peak()
    (out,) = llm.beam_search(
        [prompt], BeamSearchParams(beam_width=args.beam_width, max_tokens=args.max_tokens, ignore_eos=True)
    )
    beams = pool.peak_num_used_blocks
    print(f"prompt {args.prompt_tokens} tokens, {args.max_tokens} generated, blocks of {args.block_size} tokens")
    print(f"one sequence:          peak {one} blocks")
    print(f"beam width {args.beam_width}:          peak {beams} blocks ({beams / one:.2f}x one sequence)")
    print(f"{args.beam_width} unshared sequences: {args.beam_width * one} blocks ({args.beam_width:.2f}x)")
    print(f"beams returned: {len(out.sequences)}; blocks held after the request: {pool.num_used_blocks}")
    if tmp:
        tmp.cleanup()
    return 0 if pool.num_used_blocks == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
