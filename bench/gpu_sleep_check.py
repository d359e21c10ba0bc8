"""GPU check of sleep and wake (engine/sleep/): memory released, the same greedy output after, and their times.

Run from the repository root on a machine with one CUDA GPU (nothing downloaded: a random-weight Llama is
built with make_tiny_model, ~1B parameters unless --small):

    python bench/gpu_sleep_check.py            # bfloat16, ~1B Llama
    python bench/gpu_sleep_check.py --small    # the tiny model (seconds)

Prints, and writes to `$OUT/gpu_sleep_check.json` when `$OUT` is set: torch's allocated and the device's used
memory awake, asleep and woken; the seconds of sleep, of wake, and of a cold `LLMEngine` build of the same
model; whether greedy output after a sleep and a wake equals the output before (it must).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch

from pagedinfer.engine.llm import LLM
from pagedinfer.engine.sampling_params import SamplingParams
from pagedinfer.engine.sleep.sleeper import EngineSleep
from pagedinfer.engine.tiny_model import make_tiny_model

MODEL_1B = dict(
    hidden_size=2048,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    intermediate_size=8192,
    max_position_embeddings=4096,
    vocab_size=32000,
)
PROMPTS = [[7 + (i * 37 + j * 11) % 300 for j in range(24 + 8 * i)] for i in range(4)]


def greedy(llm: LLM) -> list[list[int]]:
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    return [list(out.outputs[0].token_ids) for out in outputs]


def memory() -> dict:
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return {"allocated_bytes": torch.cuda.memory_allocated(), "device_used_bytes": total - free}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", help="the tiny model instead of ~1B parameters")
    p.add_argument("--dtype", default="bfloat16")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_sleep_check: no CUDA device")
    model = make_tiny_model(
        os.path.join(tempfile.gettempdir(), "pagedinfer-sleep-check-" + ("small" if args.small else "1b")),
        arch="llama",
        **({} if args.small else MODEL_1B),
    )
    start = time.perf_counter()
    llm = LLM(str(model), device="cuda", dtype=args.dtype, max_model_len=1024, gpu_memory_utilization=0.5)
    result = {"cold_build_seconds": time.perf_counter() - start}
    before = greedy(llm)
    sleeper = EngineSleep(llm.llm_engine)
    result["awake"] = memory()
    report = sleeper.sleep()
    result["asleep"] = memory()
    result["sleep"] = vars(report)
    report = sleeper.wake()
    result["woken"] = memory()
    result["wake"] = vars(report)
    result["greedy_equal_after_wake"] = greedy(llm) == before
    print(json.dumps(result, indent=2))
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu_sleep_check.json"), "w") as f:
            json.dump(result, f, indent=2)
    if not result["greedy_equal_after_wake"]:
        raise SystemExit("greedy output changed across sleep and wake")


if __name__ == "__main__":
    main()
