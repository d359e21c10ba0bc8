"""`pagedinfer generate`: run prompts through the engine and print the completions."""

from __future__ import annotations

import argparse
import json
import sys
import time

from pagedinfer.engine.engine_args import add_engine_args, engine_config_from_args
from pagedinfer.engine.model_source import default_model_dir


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate completions for prompts (offline, no server)",
                       description="Generate completions with the paged engine. Without --model it uses the"
                                   " small model embedded in the package, as `serve` does.")
    add_engine_args(p, model_required=False)
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens to generate per prompt (default 32)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default 0)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--n", type=int, default=1, help="completions per prompt")
    p.add_argument("--json", action="store_true", help="print one JSON object per completion")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pagedinfer.engine import LLM, SamplingParams

    prompts = args.prompt or ["The quick brown fox", "A paged KV cache stores"]
    if any(not p for p in prompts):
        raise ValueError("--prompt: must not be empty")
    model = args.model or str(default_model_dir())  # the embedded model, as `serve` defaults to
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_tokens, n=args.n)
    llm = LLM(**engine_config_from_args(args, model=model).__dict__)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    num_tokens = 0
    for out in outputs:
        for c in out.outputs:
            num_tokens += len(c.token_ids)
            if args.json:
                print(json.dumps({"prompt": out.prompt, "index": c.index, "text": c.text,
                                  "token_ids": c.token_ids, "finish_reason": c.finish_reason,
                                  "num_cached_tokens": out.num_cached_tokens}))
            else:
                print(f"{out.prompt!r} -> {c.text!r} ({c.finish_reason})")
    stats = llm.get_stats()
    print(f"{num_tokens} tokens in {elapsed:.2f} s; KV pool {stats.num_total_blocks} blocks,"
          f" prefix-cache hits {stats.prefix_cache_hit_tokens}/{stats.prefix_cache_query_tokens} tokens",
          file=sys.stderr)
    return 0
