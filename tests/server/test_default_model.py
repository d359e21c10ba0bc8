"""The embedded default model: within its size budget, the training script's output, and it speaks English."""

from __future__ import annotations

import hashlib
import json
import re

import pytest
from serving_harness import start_server, stop_server

from pagedinfer.contracts.embedded_model import default_model_dir
from pagedinfer.engine.server.launcher import DEFAULT_MODEL_NAME, served_name

MAX_BYTES = 5 * 1000 * 1000


def test_default_model_fits_the_five_megabyte_budget():
    files = list(default_model_dir().iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json", "training.json"} <= {f.name for f in files}
    assert sum(f.stat().st_size for f in files) <= MAX_BYTES


def test_shipped_weights_are_the_recorded_training_output():
    record = json.loads((default_model_dir() / "training.json").read_text())
    weights = (default_model_dir() / "model.safetensors").read_bytes()
    assert hashlib.sha256(weights).hexdigest() == record["weights_sha256"]
    assert record["command"].endswith("scripts/train_default_model.py")
    config = json.loads((default_model_dir() / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]


def test_embedded_model_is_served_under_its_default_name():
    assert served_name(str(default_model_dir()), None) == DEFAULT_MODEL_NAME
    assert served_name("/models/qwen-7b", None) == "qwen-7b"
    assert served_name("/models/qwen-7b", "chat") == "chat"


@pytest.fixture(scope="module")
def default_server():
    running = start_server(
        default_model_dir(), served_model_name=DEFAULT_MODEL_NAME, max_model_len=512, num_gpu_blocks_override=64
    )
    yield running
    stop_server(running)


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z']+|[^\sA-Za-z']+", text)


@pytest.mark.parametrize("question", ["What does json.dumps do?", "Explain os.path.join.", "What is a list?"])
def test_chat_answers_are_mostly_english_words(default_server, question):
    import openai

    client = openai.OpenAI(base_url=default_server.url + "/v1", api_key="unused", max_retries=0)
    answer = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME, max_tokens=30, temperature=0, messages=[{"role": "user", "content": question}]
    )
    text = answer.choices[0].message.content
    tokens = _words(text)
    alphabetic = [t for t in tokens if t.isalpha() and t.isascii()]
    assert len(alphabetic) >= 4, text
    assert len(alphabetic) >= 0.6 * len(tokens), text
    assert answer.choices[0].finish_reason in ("stop", "length")
