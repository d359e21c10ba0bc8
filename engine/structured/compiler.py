"""Specs to llguidance matchers: compiled once per spec, validated, cached; one copy per sequence.

`StructuredOutputs.compile(spec)` builds the grammar, checks it (the
backend's own validation, then that the grammar admits some first token:
a regex that matches nothing is refused here, not discovered mid-request),
and caches the initial-state matcher under the spec's canonical key (LRU,
`MAX_CACHED_GRAMMARS`). It is thread-safe: the server calls it on its
tokenizer thread before a request reaches the engine, so the engine thread
only finds it in the cache and copies it (`matcher_for`). Errors are
ValueErrors naming the request field.

`warm_up()` does the one-time set-up (llguidance's imports, its view of
the tokenizer: seconds for a large vocabulary, and a first grammar) at
once; the server calls it while loading, so no request pays for it.

The backend's tokenizer is told one EOS id, the others being aliases the
engine maps onto it (`eos.py`): llguidance 1.0.0 takes a single int there.

JSON is generated compact (no free whitespace): a model that could emit
whitespace between tokens forever could otherwise never finish a valid
document. A schema may override this with llguidance's `x-guidance` key.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from typing import Any

from pagedinfer.engine.structured.eos import GrammarEos
from pagedinfer.engine.structured.params import StructuredOutputsParams

logger = logging.getLogger(__name__)

MAX_CACHED_GRAMMARS = 256
JSON_OPTIONS = {"whitespace_flexible": False}
_GBNF = re.compile(r"::=")


class StructuredOutputs:
    """The grammar backend of one engine: its tokenizer view and the compile cache."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: set[int]) -> None:
        self._hf_tokenizer = tokenizer
        self._vocab_size = vocab_size
        self.eos = GrammarEos.of(eos_token_ids)
        self._lock = threading.Lock()
        self._tokenizer: Any = None
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()

    def _ll_tokenizer(self) -> Any:
        if self._tokenizer is None:
            import llguidance.hf

            self._tokenizer = llguidance.hf.from_tokenizer(
                self._hf_tokenizer, n_vocab=self._vocab_size, eos_token=self.eos.primary
            )
        return self._tokenizer

    def warm_up(self) -> None:
        """Load the backend and build its tokenizer now, and compile one grammar (JSON objects, cached)."""
        import llguidance.gbnf_to_lark  # noqa: F401 - the GBNF converter, imported here rather than by a request

        try:
            self.compile(StructuredOutputsParams(json_object=True, field="response_format"))
        except ValueError as exc:
            # A model the backend cannot serve (a tokenizer with more tokens than the model's vocabulary) still
            # serves everything else: each structured request is refused with this error, as it was before.
            logger.warning("structured outputs are not available for this model: %s", exc)

    def compile(self, spec: StructuredOutputsParams) -> Any:
        """The spec's initial matcher (cached); ValueError naming spec.field when it cannot be served."""
        key = spec.key()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            tokenizer = self._ll_tokenizer()
        matcher = _build(spec, tokenizer)
        with self._lock:
            self._cache[key] = matcher
            while len(self._cache) > MAX_CACHED_GRAMMARS:
                self._cache.popitem(last=False)
        return matcher

    def matcher_for(self, spec: StructuredOutputsParams) -> Any:
        """A fresh matcher of its own for one sequence."""
        return self.compile(spec).deep_copy()


def grammar_of(spec: StructuredOutputsParams) -> str:
    """The llguidance grammar text of a spec (not yet validated)."""
    from llguidance import LLMatcher

    if spec.json is not None or spec.json_object:
        schema = spec.json if spec.json is not None else {"type": "object"}
        return LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    if spec.regex is not None:
        return LLMatcher.grammar_from_regex(spec.regex)
    if spec.choice is not None:
        return LLMatcher.grammar_from_regex("|".join(re.escape(c) for c in spec.choice))
    grammar = spec.grammar or ""
    if _GBNF.search(grammar):  # llama.cpp's GBNF (EBNF) rather than Lark
        from llguidance.gbnf_to_lark import gbnf_to_lark

        grammar = gbnf_to_lark(grammar)
    return LLMatcher.grammar_from_lark(grammar)


def _build(spec: StructuredOutputsParams, tokenizer: Any) -> Any:
    from llguidance import LLMatcher

    try:
        grammar = grammar_of(spec)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{spec.field}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the GBNF converter raises its own types
        raise ValueError(f"{spec.field}: cannot read the grammar: {exc}") from None
    error = LLMatcher.validate_grammar(grammar, tokenizer)
    if error:
        raise ValueError(f"{spec.field}: the grammar backend cannot compile it: {_first_lines(error)}")
    matcher = LLMatcher(tokenizer, grammar, log_level=0)
    probe = matcher.deep_copy()
    probe.compute_bitmask()  # the first step's mask: an empty language shows here
    if matcher.is_error() or probe.is_error() or (probe.is_stopped() and not probe.is_accepting()):
        reason = matcher.get_error() or probe.get_error()
        raise ValueError(f"{spec.field}: matches no output ({_first_lines(reason) or 'empty language'})")
    return matcher


def _first_lines(message: str, count: int = 6, max_chars: int = 400) -> str:
    """The backend's message on one line (it draws carets under the grammar over several)."""
    return " ".join(line.strip() for line in message.strip().splitlines()[:count] if line.strip())[:max_chars]
