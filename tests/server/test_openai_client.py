"""The official openai client (pinned in pyproject) against a real server on 127.0.0.1."""

from __future__ import annotations

import openai
import pytest
from serving_harness import start_server, stop_server


@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def server(request, tiny_llama):
    """Every test runs against one process and against a tensor-parallel replica of two ranks."""
    running = start_server(tiny_llama, tensor_parallel_size=request.param)
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def openai_client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_completion_returns_text_and_usage(openai_client, server):
    out = openai_client.completions.create(
        model=server.model, prompt="The quick brown fox", max_tokens=5, temperature=0
    )
    assert out.object == "text_completion"
    assert len(out.choices) == 1
    choice = out.choices[0]
    assert choice.finish_reason in ("length", "stop")
    assert out.usage.completion_tokens <= 5
    assert out.usage.prompt_tokens > 0
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_greedy_completion_is_deterministic(openai_client, server):
    texts = {
        openai_client.completions.create(model=server.model, prompt="Hello, world!", max_tokens=8, temperature=0)
        .choices[0]
        .text
        for _ in range(2)
    }
    assert len(texts) == 1


def test_chat_completion_uses_the_chat_template(openai_client, server):
    out = openai_client.chat.completions.create(
        model=server.model,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello"}],
        max_tokens=6,
        temperature=0,
    )
    assert out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant"
    assert isinstance(out.choices[0].message.content, str)
    # system + user wrapped by the template: more tokens than the two contents alone
    assert out.usage.prompt_tokens > 6


def test_streaming_chunks_concatenate_to_the_non_streamed_text(openai_client, server):
    prompt = "A paged KV cache stores"
    whole = openai_client.completions.create(model=server.model, prompt=prompt, max_tokens=12, temperature=0)
    stream = openai_client.completions.create(
        model=server.model,
        prompt=prompt,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage, reasons = [], None, []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            pieces.append(c.text)
            if c.finish_reason:
                reasons.append(c.finish_reason)
    assert "".join(pieces) == whole.choices[0].text
    assert reasons == [whole.choices[0].finish_reason]
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


def test_chat_streaming_starts_with_the_role_then_content(openai_client, server):
    stream = openai_client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "Tell me a story"}],
        max_tokens=8,
        temperature=0,
        stream=True,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    whole = openai_client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=8, temperature=0
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed == whole.choices[0].message.content


def test_n_returns_n_choices_with_distinct_indices(openai_client, server):
    out = openai_client.completions.create(
        model=server.model, prompt="Numbers:", max_tokens=6, n=3, temperature=1.0, seed=1
    )
    assert sorted(c.index for c in out.choices) == [0, 1, 2]
    assert 3 <= out.usage.completion_tokens <= 18  # every choice's tokens, counted once each
    chat = openai_client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, n=2, temperature=1.0, seed=2
    )
    assert sorted(c.index for c in chat.choices) == [0, 1]


def test_list_of_prompts_numbers_choices_prompt_major(openai_client, server):
    out = openai_client.completions.create(model=server.model, prompt=["one", "two"], max_tokens=3, n=2, temperature=0)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    single = openai_client.completions.create(model=server.model, prompt="two", max_tokens=3, temperature=0)
    assert out.choices[2].text == single.choices[0].text


def test_token_id_prompt_is_accepted(openai_client, server):
    out = openai_client.completions.create(model=server.model, prompt=[10, 11, 12, 13], max_tokens=3, temperature=0)
    assert out.usage.prompt_tokens == 4


def test_stop_string_ends_the_completion_before_it(openai_client, server):
    free = openai_client.completions.create(
        model=server.model, prompt="Hello", max_tokens=20, temperature=0, extra_body={"ignore_eos": True}
    )
    text = free.choices[0].text
    assert len(text) >= 4
    stop = text[2:4]
    cut = openai_client.completions.create(
        model=server.model, prompt="Hello", max_tokens=20, temperature=0, stop=[stop], extra_body={"ignore_eos": True}
    )
    assert cut.choices[0].finish_reason == "stop"
    assert stop not in cut.choices[0].text
    assert text.startswith(cut.choices[0].text)


def test_completion_logprobs_report_the_sampled_token_and_top_k(openai_client, server):
    out = openai_client.completions.create(model=server.model, prompt="Hello", max_tokens=4, temperature=0, logprobs=3)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == out.usage.completion_tokens
    for token_lp, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert token_lp <= 0
        assert 1 <= len(top) <= 3
        assert max(top.values()) == pytest.approx(token_lp, abs=1e-4)  # greedy: the sampled token is the best


def test_chat_logprobs_follow_the_chat_schema(openai_client, server):
    out = openai_client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    for item in content:
        assert len(item.top_logprobs) == 2
        assert item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob
        if "\ufffd" in item.token:  # part of a character: the token's own byte (test_token_bytes.py)
            assert len(item.bytes) == 1 and item.bytes[0] >= 0x80
        else:
            assert item.bytes == list(item.token.encode("utf-8"))


def test_repeated_prefix_reports_cached_tokens(openai_client, server):
    prefix = "Prefix caching reuses the blocks of a shared system prompt. " * 4
    first = openai_client.completions.create(model=server.model, prompt=prefix + "First?", max_tokens=2)
    second = openai_client.completions.create(model=server.model, prompt=prefix + "Second?", max_tokens=2)
    assert first.usage.prompt_tokens > 32
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > 0
    assert cached % 16 == 0  # whole blocks of the server's block_size
    assert cached <= second.usage.prompt_tokens


def test_models_lists_the_served_model(openai_client, server):
    models = openai_client.models.list()
    assert [m.id for m in models.data] == [server.model]


def test_unknown_model_is_a_404_through_the_client(openai_client):
    with pytest.raises(openai.NotFoundError) as err:
        openai_client.completions.create(model="nope", prompt="hi", max_tokens=1)
    assert err.value.body["code"] == "model_not_found"


@pytest.mark.parametrize("temperature", [1e-45, 1e-300])
def test_a_tiny_temperature_is_greedy(openai_client, server, temperature):
    greedy = openai_client.completions.create(
        model=server.model, prompt="Hello, world!", max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
    )
    tiny = openai_client.completions.create(
        model=server.model,
        prompt="Hello, world!",
        max_tokens=8,
        n=2,
        temperature=temperature,
        extra_body={"ignore_eos": True},
    )
    assert [c.text for c in tiny.choices] == [greedy.choices[0].text] * 2


def test_chat_text_parts_are_joined_with_newlines(openai_client, server):
    def ask(content):
        return openai_client.chat.completions.create(
            model=server.model, max_tokens=4, temperature=0, messages=[{"role": "user", "content": content}]
        )

    parts = ask([{"type": "text", "text": "First line."}, {"type": "text", "text": "Second line."}])
    joined = ask("First line.\nSecond line.")
    assert parts.usage.prompt_tokens == joined.usage.prompt_tokens
    assert parts.choices[0].message.content == joined.choices[0].message.content


def test_models_report_when_the_server_started(openai_client, server):
    import time

    created = openai_client.models.list().data[0].created
    assert time.time() - 3600 < created <= time.time()
    assert openai_client.models.list().data[0].created == created
