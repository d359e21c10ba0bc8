"""Tiny random-weight Hugging Face models with an offline-trained tokenizer.

There is no model hub here: tests, benchmarks and `pagedinfer generate
--tiny` build models with these helpers. Each model is a real `transformers`
architecture, randomly initialised from a seed, saved with `save_pretrained`
(config.json + safetensors), next to a byte-level BPE tokenizer trained on a
fixed offline corpus, so the engine loads it exactly like a downloaded model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A paged KV cache stores keys and values in fixed-size blocks.",
    "Continuous batching schedules requests at every iteration.",
    "Prefix caching reuses the blocks of a shared system prompt.",
    "Kubernetes operators reconcile custom resources into pods.",
    "def add(a, b):\n    return a + b\n",
    "Hello, world! How are you today? I am fine, thank you.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000.",
    "Unicode text: café, naïve, 東京, Привет, 😀 and ∑ symbols.",
]

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral", "phi3")


def train_tokenizer(
    out_dir: str | Path, vocab_size: int = 384, corpus: list[str] | None = None, model_max_length: int = 2048
) -> Any:
    """Train a byte-level BPE tokenizer offline and save it as a transformers tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((corpus or _CORPUS) * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=model_max_length,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))
    return fast


def tiny_config(arch: str = "llama", vocab_size: int = 384, **overrides: Any) -> Any:
    """A small but structurally faithful config of a transformers architecture."""
    import transformers

    base: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
    )
    classes = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "mistral": transformers.MistralConfig,
        "phi3": transformers.Phi3Config,
    }
    if arch not in classes:
        raise ValueError(f"arch: unknown tiny architecture {arch!r}; expected one of {ARCHITECTURES}")
    if arch == "mistral":
        base["sliding_window"] = 24  # small, so tests cross it
    if arch == "qwen3":
        base["head_dim"] = 24  # head_dim != hidden / heads
    if arch == "phi3":
        base["pad_token_id"] = 3
    base.update(overrides)
    return classes[arch](**base)


def make_tiny_model(
    out_dir: str | Path,
    arch: str = "llama",
    seed: int = 0,
    dtype: str = "float32",
    tokenizer_dir: str | Path | None = None,
    **config_overrides: Any,
) -> Path:
    """Create (or reuse) a random-weight model directory and return its path.

    `vocab_size` in the overrides sets the model's vocabulary (embeddings and
    LM head) beyond the tokenizer's, for realistic shapes (e.g. 32000); it must
    be at least the tokenizer's size. Ids past the tokenizer decode to nothing.
    """
    import torch
    import transformers

    out = Path(out_dir)
    marker = out / "pagedinfer_tiny.json"
    spec = {"arch": arch, "seed": seed, "dtype": dtype, "overrides": config_overrides}
    if marker.is_file() and json.loads(marker.read_text()) == spec:
        return out
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer_dir is None:
        tokenizer = train_tokenizer(out)
    else:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
        tokenizer.save_pretrained(str(out))
    shape = dict(config_overrides)  # the marker's spec keeps vocab_size
    vocab_size = shape.pop("vocab_size", len(tokenizer))
    if vocab_size < len(tokenizer):
        raise ValueError(f"vocab_size: must be >= the tokenizer's {len(tokenizer)} tokens, got {vocab_size}")
    config = tiny_config(arch, vocab_size=vocab_size, **shape)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    # Random init with the default std (0.02) gives near-uniform logits; a
    # larger std makes greedy argmax decisive, so token-for-token comparisons
    # are not decided by float noise.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.15)
    model.save_pretrained(str(out))
    marker.write_text(json.dumps(spec))
    return out
