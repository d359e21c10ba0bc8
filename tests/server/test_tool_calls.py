"""Tool calling through the openai client, end to end, on a tiny model whose chat template renders tools.

The model (random weights, qwen2 architecture) carries a Hermes-style
template like Qwen's: the tools in a system turn, calls as
`<tool_call>{...}</tool_call>`, results as `<tool_response>`; so "auto" is
served by the hermes parser. Its outputs are random, so the calls are
forced with "required" or a named function, which the grammar engine holds
to the tools' schemas.
"""

from __future__ import annotations

import json
import shutil

import httpx
import jsonschema
import pytest
from serving_harness import start_server, stop_server

HERMES_STYLE_TEMPLATE = (
    '{%- if tools %}<|system|>You may call these functions, each as <tool_call>{"name": ..., "arguments": ...}'
    "</tool_call>:\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</s>{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|assistant|>{{ message.content or '' }}"
    '{%- for call in message.tool_calls %}<tool_call>{"name": "{{ call.function.name }}", "arguments": '
    "{{ call.function.arguments | tojson }}}</tool_call>{%- endfor %}</s>"
    "{%- elif message.role == 'tool' %}<|user|><tool_response>{{ message.content }}</tool_response></s>"
    "{%- else %}<|{{ message.role }}|>{{ message.content }}</s>{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|assistant|>{% endif %}"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["city", "unit"],
            "properties": {"city": {"enum": ["Paris", "Tokyo", "Lima"]}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a zone",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["zone"],
            "properties": {"zone": {"type": "string", "maxLength": 8}},
        },
    },
}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, CLOCK)}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
# "required" is a list of calls of any length (vLLM's); this random model ends it only by chance
REQUIRED_MAX_TOKENS = 1000


@pytest.fixture(scope="module")
def tool_server(make_model, tmp_path_factory):
    import transformers

    model_dir = tmp_path_factory.mktemp("tool-model") / "qwen2-tools"
    shutil.copytree(make_model("qwen2", max_position_embeddings=2048), model_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    tokenizer.chat_template = HERMES_STYLE_TEMPLATE
    tokenizer.save_pretrained(str(model_dir))
    running = start_server(model_dir, max_model_len=2048, num_gpu_blocks_override=512)
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def client(tool_server):
    import openai

    return openai.OpenAI(base_url=tool_server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.mark.parametrize("seed", range(3))
def test_a_named_function_returns_a_valid_call_of_it(client, tool_server, seed):
    out = client.chat.completions.create(
        model=tool_server.model,
        messages=QUESTION,
        tools=[WEATHER, CLOCK],
        temperature=1.0,
        seed=seed,
        max_tokens=60,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS["get_weather"])


@pytest.mark.parametrize("seed", range(3))
def test_required_returns_calls_of_the_given_tools(client, tool_server, seed):
    out = client.chat.completions.create(
        model=tool_server.model,
        messages=QUESTION,
        tools=[WEATHER, CLOCK],
        tool_choice="required",
        temperature=1.0,
        seed=seed,
        max_tokens=REQUIRED_MAX_TOKENS,
    )
    calls = out.choices[0].message.tool_calls
    assert calls and out.choices[0].finish_reason == "tool_calls"
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_parallel_tool_calls_false_returns_one_call(client, tool_server):
    for seed in range(3):
        out = client.chat.completions.create(
            model=tool_server.model,
            messages=QUESTION,
            tools=[WEATHER, CLOCK],
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=1.0,
            seed=seed,
            max_tokens=REQUIRED_MAX_TOKENS,
        )
        assert len(out.choices[0].message.tool_calls) == 1


def test_streamed_calls_accumulate_to_the_non_streamed_ones(client, tool_server):
    kwargs = dict(
        model=tool_server.model,
        messages=QUESTION,
        tools=[WEATHER, CLOCK],
        temperature=1.0,
        seed=4,
        max_tokens=REQUIRED_MAX_TOKENS,
    )
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        whole = client.chat.completions.create(tool_choice=choice, **kwargs).choices[0].message.tool_calls
        calls: dict[int, dict] = {}
        finish, num_call_chunks = None, 0
        for chunk in client.chat.completions.create(tool_choice=choice, stream=True, **kwargs):
            for c in chunk.choices:
                finish = c.finish_reason or finish
                num_call_chunks += bool(c.delta.tool_calls)
                for delta in c.delta.tool_calls or []:
                    entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                    entry["name"] += delta.function.name or ""
                    entry["arguments"] += delta.function.arguments or ""
        assert finish == "tool_calls"
        assert num_call_chunks > len(calls)  # arguments stream as they are generated, not whole at the end
        assert [calls[i] for i in sorted(calls)] == [
            {"name": c.function.name, "arguments": c.function.arguments} for c in whole
        ]


def test_a_multi_turn_call_and_answer_renders_through_the_template(client, tool_server):
    first = client.chat.completions.create(
        model=tool_server.model,
        messages=QUESTION,
        tools=[WEATHER],
        temperature=0,
        max_tokens=60,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    call = first.choices[0].message.tool_calls[0]
    history = QUESTION + [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"},
    ]
    answer = client.chat.completions.create(
        model=tool_server.model, messages=history, tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=8
    )
    assert answer.choices[0].message.tool_calls is None
    assert isinstance(answer.choices[0].message.content, str)
    rendered = httpx.post(tool_server.url + "/tokenize", json={"messages": history}, timeout=30).json()["tokens"]
    text = httpx.post(tool_server.url + "/detokenize", json={"tokens": rendered}, timeout=30).json()["prompt"]
    assert "<tool_response>18 degrees and sunny</tool_response>" in text
    assert (
        f'<tool_call>{{"name": "get_weather", "arguments": {json.dumps(json.loads(call.function.arguments))}}}' in text
    )


def test_tools_are_rendered_unless_tool_choice_is_none(client, tool_server):
    def prompt_tokens(**kwargs):
        return client.chat.completions.create(
            model=tool_server.model, messages=QUESTION, max_tokens=1, temperature=0, **kwargs
        ).usage.prompt_tokens

    bare = prompt_tokens()
    assert prompt_tokens(tools=[WEATHER], tool_choice="none") == bare
    assert prompt_tokens(tools=[WEATHER], tool_choice="auto") > bare


def test_auto_returns_content_when_the_model_calls_nothing(client, tool_server):
    out = client.chat.completions.create(
        model=tool_server.model, messages=QUESTION, tools=[WEATHER], temperature=0, max_tokens=8
    )
    message = out.choices[0].message
    if message.tool_calls is None:  # this random model's text is not a call
        assert isinstance(message.content, str) and out.choices[0].finish_reason in ("stop", "length")


def test_auto_on_a_model_without_a_tool_format_is_a_400_saying_so(server):
    r = httpx.post(
        server.url + "/v1/chat/completions",
        json={"model": server.model, "messages": QUESTION, "tools": [WEATHER], "max_tokens": 2},
        timeout=30,
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "tool_choice" and "parser" in error["message"]


BAD = [
    ("tool-message-without-call-id", {"messages": QUESTION + [{"role": "tool", "content": "x"}]}, "messages.1"),
    (
        "tool-calls-on-a-user-message",
        {
            "messages": [
                {
                    "role": "user",
                    "content": "x",
                    "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                }
            ]
        },
        "messages.0",
    ),
    ("required-without-tools", {"tool_choice": "required"}, "tool_choice"),
    (
        "named-and-response-format",
        {
            "tools": [WEATHER],
            "response_format": {"type": "json_object"},
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
        "tool_choice",
    ),
    (
        "tool-with-bad-name",
        {"tools": [{"type": "function", "function": {"name": "no spaces"}}]},
        "tools.0.function.name",
    ),
]


@pytest.mark.parametrize("fields, param", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_tool_requests_are_400s_naming_the_field(tool_server, fields, param):
    body = {"model": tool_server.model, "messages": QUESTION, "max_tokens": 2, **fields}
    r = httpx.post(tool_server.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
    metrics = tool_server.wait_idle()
    assert metrics["pagedinfer_kv_cache_free_blocks"] == metrics["pagedinfer_kv_cache_num_blocks"]


AUTO_CALL = (
    r'Checking\. <tool_call>\{"name": "get_weather", "arguments": '
    r'\{"city": "(Paris|Lima)", "unit": "celsius"\}\}</tool_call>'
)


def test_auto_reads_the_models_own_call_back_whole_and_streamed(client, tool_server):
    # The random model is held by a regex to the Hermes format, so "auto" meets a real call in its text.
    kwargs = dict(
        model=tool_server.model,
        messages=QUESTION,
        tools=[WEATHER, CLOCK],
        tool_choice="auto",
        temperature=1.0,
        seed=2,
        max_tokens=200,
        extra_body={"guided_regex": AUTO_CALL},
    )
    out = client.chat.completions.create(**kwargs)
    message = out.choices[0].message
    assert out.choices[0].finish_reason == "tool_calls"
    assert message.content == "Checking."
    (call,) = message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS["get_weather"])
    content, calls = "", []
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            content += c.delta.content or ""
            calls += c.delta.tool_calls or []
    assert content.strip() == "Checking." and "<tool" not in content
    assert [(c.function.name, c.function.arguments) for c in calls] == [("get_weather", call.function.arguments)]


def test_tokenize_renders_tools_with_the_messages_as_chat_does(client, tool_server):
    counted = httpx.post(
        tool_server.url + "/tokenize", json={"messages": QUESTION, "tools": [WEATHER]}, timeout=30
    ).json()["count"]
    used = client.chat.completions.create(
        model=tool_server.model, messages=QUESTION, tools=[WEATHER], tool_choice="auto", max_tokens=1, temperature=0
    ).usage.prompt_tokens
    assert (
        counted
        == used
        > httpx.post(tool_server.url + "/tokenize", json={"messages": QUESTION}, timeout=30).json()["count"]
    )


def _streamed(client, **kwargs) -> tuple[list[dict], str | None, str]:
    """(the accumulated calls, finish_reason, content) of a streamed chat completion."""
    calls: dict[int, dict] = {}
    finish, content = None, ""
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            finish = c.finish_reason or finish
            content += c.delta.content or ""
            for delta in c.delta.tool_calls or []:
                entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                entry["name"] += delta.function.name or ""
                entry["arguments"] += delta.function.arguments or ""
    return [calls[i] for i in sorted(calls)], finish, content


def test_required_cut_by_max_tokens_gives_the_same_calls_streamed_and_whole(client, tool_server):
    cut_with_a_call = 0
    for max_tokens in (3, 12, 25, 40, 60):
        kwargs = dict(
            model=tool_server.model,
            messages=QUESTION,
            tools=[WEATHER, CLOCK],
            tool_choice="required",
            temperature=1.0,
            seed=7,
            max_tokens=max_tokens,
        )
        whole = client.chat.completions.create(**kwargs).choices[0]
        streamed, finish, content = _streamed(client, **kwargs)
        calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in whole.message.tool_calls or []]
        assert calls == streamed, max_tokens
        assert whole.finish_reason == finish and whole.message.content is None and content == "", max_tokens
        if finish == "length" and calls:
            cut_with_a_call += 1
            for call in calls[:-1]:  # every call before the cut one is complete
                jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])
    assert cut_with_a_call >= 1  # some max_tokens cut the list after a call's name


def test_required_ends_the_list_by_the_cap_at_the_latest(client, tool_server):
    from pagedinfer.engine.server.tools.choice import MAX_REQUIRED_CALLS

    for seed in range(3):
        out = client.chat.completions.create(
            model=tool_server.model,
            messages=QUESTION,
            tools=[WEATHER, CLOCK],
            tool_choice="required",
            temperature=1.0,
            seed=seed,
            max_tokens=REQUIRED_MAX_TOKENS,
        )
        assert out.choices[0].finish_reason == "tool_calls"
        assert 1 <= len(out.choices[0].message.tool_calls) <= MAX_REQUIRED_CALLS
