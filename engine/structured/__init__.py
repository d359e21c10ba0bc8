"""Structured outputs: JSON schema, regex, choice and Lark grammars as token masks (llguidance).

`params.py` says what a request asks for (`StructuredOutputsParams`, vLLM's
options); `compiler.py` turns it into a matcher template, validated and
cached per spec, off the engine loop where a server is in front;
`bitmask.py` masks a whole step's constrained rows inside the batched
sampler. Why llguidance rather than xgrammar: it has no dependencies (no
second torch, no triton pin, no JIT), it needs no per-schema precomputation
over the vocabulary (masks are computed lazily, in tens of microseconds per
token), and it takes JSON schema, regex and Lark grammars through one
interface, the last of which is vLLM's `guided_grammar`.
"""
