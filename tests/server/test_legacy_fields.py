"""OpenAI's retired `functions` and `function_call` are 400s that name their replacements."""

from __future__ import annotations

import openai
import pytest

WEATHER = {"name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def test_functions_is_refused_with_a_pointer_to_tools(openai_client, server):
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.chat.completions.create(
            model=server.model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, functions=[WEATHER]
        )
    error = caught.value.body
    assert error["param"] == "functions" and "use `tools` instead" in error["message"], error


def test_function_call_is_refused_with_a_pointer_to_tool_choice(openai_client, server):
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.chat.completions.create(
            model=server.model,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=4,
            extra_body={"function_call": {"name": "weather"}},
        )
    assert "use `tool_choice` instead" in caught.value.body["message"], caught.value.body
