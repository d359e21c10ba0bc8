"""What ends a "required" list of calls: the grammar caps it (MAX_REQUIRED_CALLS; 1 without parallel calls)."""

from __future__ import annotations

import pytest

from pagedinfer.engine.server.protocol import ChatCompletionRequest
from pagedinfer.engine.server.tools.choice import MAX_REQUIRED_CALLS, tool_plan

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("parallel, cap", [(None, MAX_REQUIRED_CALLS), (True, MAX_REQUIRED_CALLS), (False, 1)])
def test_required_lists_are_capped(parallel, cap):
    fields = {} if parallel is None else {"parallel_tool_calls": parallel}
    req = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "hi"}], tools=[WEATHER], tool_choice="required", **fields
    )
    plan, schema = tool_plan(req, None)
    assert plan.mode == "required" and schema["minItems"] == 1 and schema["maxItems"] == cap
