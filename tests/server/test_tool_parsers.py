"""Each family's parser reads its format back into calls, leaves other text as content, and never raises."""

from __future__ import annotations

import json

import pytest

from pagedinfer.engine.server.tools.calls import stream_finish, streamable_chars
from pagedinfer.engine.server.tools.choice import ToolPlan
from pagedinfer.engine.server.tools.parsers import HERMES, LLAMA3_JSON, MISTRAL, ParsedCall, parser_for_template


def args(**kwargs):
    return json.dumps(kwargs)


@pytest.mark.parametrize(
    "parser, text, content, calls",
    [
        (
            HERMES,
            'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
            "Let me check.",
            [ParsedCall("get_weather", args(city="Paris"))],
        ),
        (
            HERMES,
            '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", "arguments": '
            '{"x": 1}}</tool_call>',
            "",
            [ParsedCall("a", "{}"), ParsedCall("b", args(x=1))],
        ),
        (HERMES, "no calls here", "no calls here", []),
        (HERMES, '<tool_call>{"name": "a", "arguments": {</tool_call>', None, []),  # broken JSON stays content
        (
            LLAMA3_JSON,
            '{"name": "get_weather", "parameters": {"city": "Lima"}}',
            "",
            [ParsedCall("get_weather", args(city="Lima"))],
        ),
        (
            LLAMA3_JSON,
            '<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"y": 2}}',
            "",
            [ParsedCall("a", "{}"), ParsedCall("b", args(y=2))],
        ),
        (LLAMA3_JSON, "The weather is fine.", "The weather is fine.", []),
        (MISTRAL, '[TOOL_CALLS][{"name": "a", "arguments": {"z": true}}]', "", [ParsedCall("a", args(z=True))]),
        (MISTRAL, "[TOOL_CALLS] not json", None, []),
    ],
)
def test_parsers_read_their_family_format(parser, text, content, calls):
    got_content, got_calls = parser.parse(text)
    assert got_calls == calls
    assert got_content == (text if content is None else content)


def test_the_parser_is_chosen_from_the_chat_template():
    assert parser_for_template("{% if tools %}...<tool_call>...{% endif %}") is HERMES
    assert parser_for_template("{% if tools %}[TOOL_CALLS]{% endif %}") is MISTRAL
    assert parser_for_template('{% if tools %}{"name": ..., "parameters": ...}{% endif %}') is LLAMA3_JSON
    assert parser_for_template("{% for message in messages %}{{ message.content }}{% endfor %}") is None
    assert parser_for_template(None) is None


def test_streaming_holds_back_what_may_become_a_call():
    plan = ToolPlan("auto", parser=HERMES)
    assert streamable_chars(plan, "Sure, ") == len("Sure, ")
    assert streamable_chars(plan, "Sure, <tool") == len("Sure, ")
    assert streamable_chars(plan, 'Sure, <tool_call>{"na') == len("Sure, ")
    text = 'Sure, <tool_call>{"name": "a", "arguments": {}}</tool_call>'
    rest, deltas = stream_finish(plan, text, len("Sure, "))
    assert rest == "" and [d["function"]["name"] for d in deltas] == ["a"] and deltas[0]["index"] == 0
    rest, deltas = stream_finish(plan, "Sure, <tool", len("Sure, "))
    assert rest == "<tool" and deltas == []


def test_required_calls_are_found_in_every_prefix_of_the_output():
    from pagedinfer.engine.server.tools.required import scan

    text = '[{"name":"a","parameters":{"s":"x}]\\"y","n":[1,{"k":2}]}},{"name":"b","parameters":{}}]'
    final = [(c.name, c.arguments) for c in scan(text)]
    assert final == [("a", '{"s":"x}]\\"y","n":[1,{"k":2}]}'), ("b", "{}")]
    assert [json.loads(arguments) for _, arguments in final] == [{"s": 'x}]"y', "n": [1, {"k": 2}]}, {}]
    for cut in range(len(text) + 1):
        seen = scan(text[:cut])
        assert len(seen) <= 2
        for got, (name, arguments) in zip(seen, final):
            assert got.name == name and arguments.startswith(got.arguments)
