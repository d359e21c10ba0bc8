"""Train the embedded default model shipped in contracts/default_model/.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/train_default_model.py

What it builds: a small Llama (`LlamaForCausalLM`, a standard transformers
architecture, so the engine loads it like any downloaded model) and its own
byte-level BPE tokenizer with a chat template, trained on text that every
Python installation carries offline: the docstrings of the standard library.

Corpus (deterministic order; depends only on the interpreter's version):
- every public module, class, function and method docstring of the stdlib
  modules importable here, sorted by qualified name, duplicates dropped;
- chat pairs built from the same docstrings, rendered with the chat template:
  user "What does json.dumps do?" -> assistant: the docstring's first
  paragraph. This is what makes /v1/chat/completions answer with sentences.

Reproducibility: fixed seeds, `torch.use_deterministic_algorithms(True)`, one
torch thread, one tokenizers thread, a fixed number of optimizer steps and a
data order drawn from a seeded generator. The same Python and torch versions
give byte-identical weights (`training.json` records the versions and the
weights' sha256). The run takes about ten minutes on one CPU core.

Size budget: everything in the output folder stays under 5 MB (checked at
the end); weights are float32 so the engine runs them as they were trained.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
import math
import os
import random
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "contracts" / "default_model"
MAX_OUTPUT_BYTES = 5 * 1000 * 1000

# Modules with import-time side effects (opening a browser, printing, GUI,
# spawning) or that only exist for the interpreter's own tests.
SKIPPED_MODULES = frozenset(
    {
        "antigravity",
        "this",
        "idlelib",
        "tkinter",
        "turtle",
        "turtledemo",
        "test",
        "lib2to3",
        "ensurepip",
        "venv",
        "pydoc_data",
        "__main__",
        "__phello__",
        "_pydev_bundle",
        "xxsubtype",
        "xxlimited",
        "xxlimited_35",
        "_testcapi",
        "_testinternalcapi",
        "_testbuffer",
        "_testimportmultiple",
        "_testmultiphase",
        "_xxtestfuzz",
        "_ctypes_test",
        "msilib",
        "winreg",
        "winsound",
        "_winapi",
        "_msi",
        "msvcrt",
        "nt",
        "_overlapped",
        "_tkinter",
        "curses",
        "_curses",
        "_curses_panel",
        "readline",
        "_scproxy",
        "sre_compile",
        "sre_parse",
        "sre_constants",
        "asyncio.__main__",
    }
)

MIN_DOC_CHARS = 40
MAX_DOC_CHARS = 2000


def stdlib_docstrings() -> list[tuple[str, str]]:
    """(qualified name, docstring) of public stdlib objects, sorted by name, docstrings unique."""
    warnings.simplefilter("ignore")
    seen_docs: set[str] = set()
    found: dict[str, str] = {}
    for module_name in sorted(sys.stdlib_module_names):
        if module_name.startswith("_") or module_name in SKIPPED_MODULES:
            continue
        try:
            module = importlib.import_module(module_name)
        except Exception:  # noqa: BLE001 - platform-specific modules are simply absent
            continue
        _collect(module_name, module, found, depth=0)
    pairs = []
    for name in sorted(found):
        doc = found[name]
        if doc not in seen_docs:
            seen_docs.add(doc)
            pairs.append((name, doc))
    return pairs


def _collect(name: str, obj: object, found: dict[str, str], depth: int) -> None:
    doc = inspect.getdoc(obj)
    if doc and MIN_DOC_CHARS <= len(doc) <= MAX_DOC_CHARS and doc.isascii():
        found.setdefault(name, doc.strip())
    if depth >= 2:
        return
    try:
        members = sorted(vars(obj).items()) if inspect.ismodule(obj) or inspect.isclass(obj) else []
    except TypeError:
        return
    for attr, value in members:
        if attr.startswith("_"):
            continue
        if inspect.ismodule(obj) and getattr(value, "__module__", None) not in (obj.__name__, None):
            continue
        if inspect.isclass(value) or inspect.isroutine(value):
            _collect(f"{name}.{attr}", value, found, depth + 1)


def first_paragraph(doc: str) -> str:
    return " ".join(doc.split("\n\n", 1)[0].split())


def chat_examples(pairs: list[tuple[str, str]], rng: random.Random) -> list[str]:
    """Chat-formatted question/answer texts (the tokenizer's template, filled in by hand)."""
    questions = ("What does {} do?", "Explain {}.", "What is {}?", "Tell me about {}.", "Describe {}.")
    texts = []
    for name, doc in pairs:
        answer = first_paragraph(doc)
        if len(answer) < MIN_DOC_CHARS or ">>>" in answer:
            continue
        question = rng.choice(questions).format(name)
        texts.append(f"<|user|>{question}</s><|assistant|>{answer}</s>")
    return texts


def build_corpus(seed: int) -> tuple[list[str], list[str]]:
    """(plain docstring texts, chat texts), both in a deterministic order."""
    pairs = stdlib_docstrings()
    rng = random.Random(seed)
    return [doc for _, doc in pairs], chat_examples(pairs, rng)


def train_tokenizer(texts: list[str], out_dir: Path, vocab_size: int, max_length_tokens: int):
    from pagedinfer.engine.tiny_model import train_tokenizer as train_bpe

    return train_bpe(out_dir, vocab_size=vocab_size, corpus=texts, model_max_length=max_length_tokens)


def pack(token_streams: list[list[int]], seq_len_tokens: int) -> torch.Tensor:  # noqa: F821 (torch is imported inside: the script starts without it)
    """Concatenate documents (each already ends with eos) and cut into rows of seq_len_tokens + 1."""
    import torch

    flat = [t for stream in token_streams for t in stream]
    num_rows = (len(flat) - 1) // seq_len_tokens
    rows = [flat[i * seq_len_tokens : i * seq_len_tokens + seq_len_tokens + 1] for i in range(num_rows)]
    return torch.tensor(rows, dtype=torch.long)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=2400)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len-tokens", type=int, default=256)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-layers", type=int, default=4)
    args = parser.parse_args()

    docs, chats = build_corpus(args.seed)  # before torch: its imports must not change what the stdlib shows

    import torch
    import transformers
    from safetensors.torch import load_file

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    random.seed(args.seed)
    started = time.monotonic()
    print(
        f"corpus: {len(docs)} docstrings, {len(chats)} chat pairs, {sum(map(len, docs)) + sum(map(len, chats))} chars",
        flush=True,
    )
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.iterdir():
        stale.unlink()
    max_position_tokens = 2048
    tokenizer = train_tokenizer(docs + chats, out, args.vocab_size, max_position_tokens)

    eos = tokenizer.eos_token_id
    streams = [tokenizer(doc, add_special_tokens=False)["input_ids"] + [eos] for doc in docs]
    streams += [tokenizer(chat, add_special_tokens=False)["input_ids"] for chat in chats]
    random.Random(args.seed).shuffle(streams)
    data = pack(streams, args.seq_len_tokens)
    print(f"tokens: {data.numel()} in {len(data)} rows of {args.seq_len_tokens + 1}", flush=True)

    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden_size,
        intermediate_size=3 * args.hidden_size,
        num_hidden_layers=args.num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_tokens,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = transformers.LlamaForCausalLM(config)
    num_params = sum(p.numel() for p in model.parameters())
    print(f"model: {num_params} parameters", flush=True)

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, betas=(0.9, 0.95), weight_decay=0.1)
    warmup_steps = max(1, args.steps // 20)

    def lr_factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, args.steps - warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    order = torch.Generator().manual_seed(args.seed)
    permutation = torch.randperm(len(data), generator=order)
    cursor = 0
    model.train()
    for step in range(args.steps):
        if cursor + args.batch_size > len(permutation):
            permutation = torch.randperm(len(data), generator=order)
            cursor = 0
        batch = data[permutation[cursor : cursor + args.batch_size]]
        cursor += args.batch_size
        logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step:5d}  loss {loss.item():.3f}  {time.monotonic() - started:.0f}s", flush=True)

    model.eval()
    model.generation_config.do_sample = False
    model.save_pretrained(str(out), safe_serialization=True)
    weights = out / "model.safetensors"
    load_file(str(weights))
    total_bytes = sum(p.stat().st_size for p in out.iterdir())
    record = {
        "command": "OMP_NUM_THREADS=1 .venv/bin/python scripts/train_default_model.py",
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "out"},
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "num_parameters": num_params,
        "num_training_tokens": args.steps * args.batch_size * args.seq_len_tokens,
        "final_loss": round(loss.item(), 4),
        "weights_sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
    }
    (out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    total_bytes = sum(p.stat().st_size for p in out.iterdir())
    print(f"saved {out} ({total_bytes} bytes) in {time.monotonic() - started:.0f}s", flush=True)
    if total_bytes > MAX_OUTPUT_BYTES:
        raise SystemExit(f"output is {total_bytes} bytes, over the {MAX_OUTPUT_BYTES}-byte budget")
    return 0


if __name__ == "__main__":
    sys.exit(main())
