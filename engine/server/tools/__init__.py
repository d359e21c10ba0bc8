"""Tool calling on /v1/chat/completions: the request's tools, the model's calls, OpenAI's `tool_calls`.

`choice.py` turns `tools` + `tool_choice` into what the engine runs: for
"required" or a named function, a JSON schema the grammar engine holds the
output to (vLLM's semantics: a named call's output is its arguments, a
required one's a JSON list of {"name", "parameters"}); for "auto", the
model's own format, read back by the parser of its family (`parsers.py`).
`calls.py` builds OpenAI's `message.tool_calls` and their stream deltas.
"""
