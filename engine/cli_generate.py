"""`pagedinfer generate`: run prompts through the engine and print the completions."""

from __future__ import annotations

import argparse
import json
import sys
import time

from pagedinfer.contracts.embedded_model import default_model_dir
from pagedinfer.engine.engine_args import add_engine_args, engine_config_from_args


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="generate completions for prompts (offline, no server)",
        description="Generate completions with the paged engine. Without --model it uses the"
        " small model embedded in the package, as `serve` does.",
    )
    add_engine_args(p)
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens to generate per prompt (default 32)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default 0)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--n", type=int, default=1, help="completions per prompt")
    p.add_argument(
        "--beam-width",
        type=int,
        default=None,
        help="beam search with this many beams instead of sampling: prints each prompt's"
        " beam-width best sequences, best first (docs/beam-search.md)",
    )
    p.add_argument(
        "--length-penalty",
        type=float,
        default=None,
        help="with --beam-width: score = cumulative logprob / generated length ** this (default 1.0)",
    )
    p.add_argument("--ignore-eos", action="store_true", help="generate max-tokens tokens even past EOS")
    p.add_argument("--json", action="store_true", help="print one JSON object per completion")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pagedinfer.engine import LLM, SamplingParams

    prompts = args.prompt or ["The quick brown fox", "A paged KV cache stores"]
    if any(not p for p in prompts):
        raise ValueError("--prompt: must not be empty")
    model = args.model or str(default_model_dir())  # the embedded model, as `serve` defaults to
    if args.beam_width is not None:
        params = beam_search_params(args)
    elif args.length_penalty is not None:
        raise ValueError("--length-penalty: applies only with --beam-width")
    else:
        params = SamplingParams(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            max_tokens=args.max_tokens,
            n=args.n,
            ignore_eos=args.ignore_eos,
        )
    llm = LLM(**engine_config_from_args(args, model=model).__dict__)
    start = time.perf_counter()
    if args.beam_width is not None:
        num_prompt_tokens = [len(llm.llm_engine.tokenize(p)) for p in prompts]
        num_tokens = print_beams(prompts, num_prompt_tokens, llm.beam_search(prompts, params), args.json)
        outputs = []
    else:
        outputs = llm.generate(prompts, params)
        num_tokens = 0
    elapsed = time.perf_counter() - start
    for out in outputs:
        for c in out.outputs:
            num_tokens += len(c.token_ids)
            if args.json:
                print(
                    json.dumps(
                        {
                            "prompt": out.prompt,
                            "index": c.index,
                            "text": c.text,
                            "token_ids": c.token_ids,
                            "finish_reason": c.finish_reason,
                            "num_cached_tokens": out.num_cached_tokens,
                        }
                    )
                )
            else:
                print(f"{out.prompt!r} -> {c.text!r} ({c.finish_reason})")
    stats = llm.get_stats()
    print(
        f"{num_tokens} tokens in {elapsed:.2f} s; KV pool {stats.num_total_blocks} blocks,"
        f" prefix-cache hits {stats.prefix_cache_hit_tokens}/{stats.prefix_cache_query_tokens} tokens",
        file=sys.stderr,
    )
    compiled = llm.llm_engine.runner.compiled
    if compiled is not None:  # --compile: what start-up spent compiling (serve logs the same line)
        print(
            f"compiled forward: one graph (1 to {compiled.max_num_batched_tokens} tokens) in"
            f" {compiled.startup_seconds:.1f} s",
            file=sys.stderr,
        )
    return 0


def beam_search_params(args: argparse.Namespace):
    """BeamSearchParams from the flags; ValueError naming a sampling flag that does not apply."""
    from pagedinfer.engine.beam.params import BeamSearchParams

    for flag, value, unset in (
        ("--temperature", args.temperature, 0.0),
        ("--top-p", args.top_p, 1.0),
        ("--top-k", args.top_k, None),
    ):
        if value != unset:
            raise ValueError(f"{flag}: does not apply with --beam-width (beam search ranks by log-probabilities)")
    if args.n not in (1, args.beam_width):
        raise ValueError(
            f"--n: {args.n} does not match --beam-width {args.beam_width} (beam search returns"
            f" beam-width sequences; leave --n out)"
        )
    return BeamSearchParams(
        beam_width=args.beam_width,
        max_tokens=args.max_tokens,
        ignore_eos=args.ignore_eos,
        length_penalty=1.0 if args.length_penalty is None else args.length_penalty,
    )


def print_beams(prompts: list[str], num_prompt_tokens: list[int], outputs: list, as_json: bool) -> int:
    """Print every beam, best first; returns the number of generated tokens."""
    num_tokens = 0
    for prompt, prompt_len, out in zip(prompts, num_prompt_tokens, outputs):
        for rank, beam in enumerate(out.sequences):
            num_tokens += len(beam.tokens) - prompt_len
            if as_json:
                print(
                    json.dumps(
                        {
                            "prompt": prompt,
                            "rank": rank,
                            "text": beam.text,
                            "token_ids": beam.tokens[prompt_len:],
                            "cum_logprob": beam.cum_logprob,
                            "score": beam.score,
                            "finish_reason": beam.finish_reason,
                        }
                    )
                )
            else:
                print(f"{prompt!r} beam {rank} (score {beam.score:.4f}) -> {beam.text!r} ({beam.finish_reason})")
    return num_tokens
