"""What a request constrains its output to (vLLM's structured-output options)."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class StructuredOutputsParams:
    """Exactly one of: a JSON schema, any JSON object, a regex, one of a list of strings, or a Lark grammar.

    `json` is the schema as a dict or its JSON text. `field` names the
    request field it came from, so an error (a schema the backend cannot
    compile, a regex that matches nothing) names it.
    """

    json: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | list[str] | None = None
    grammar: str | None = None
    field: str = "structured_outputs"

    def __post_init__(self) -> None:
        given = [name for name in ("json", "regex", "choice", "grammar") if getattr(self, name) is not None]
        if self.json_object:
            given.append("json_object")
        if len(given) != 1:
            raise ValueError(f"{self.field}: exactly one of json, json_object, regex, choice, grammar; got {given}")
        if self.regex is not None and (len(self.regex) - len(self.regex.rstrip("\\"))) % 2:
            # llguidance's regex-to-grammar drops it and serves the rest: refuse what it would not report
            raise ValueError(f"{self.field}: the regex ends in a lone backslash, which escapes nothing")
        if self.choice is not None:
            if not self.choice or not all(isinstance(c, str) and c for c in self.choice):
                raise ValueError(f"{self.field}: choice must be a non-empty list of non-empty strings")
            object.__setattr__(self, "choice", tuple(self.choice))
        if isinstance(self.json, str):
            try:
                schema = json.loads(self.json)
            except ValueError as exc:
                raise ValueError(f"{self.field}: the schema is not valid JSON: {exc}") from None
            if not isinstance(schema, dict):
                raise ValueError(f"{self.field}: the schema must be a JSON object")
        elif self.json is not None and not isinstance(self.json, dict):
            raise ValueError(f"{self.field}: the schema must be a JSON object, got {type(self.json).__name__}")

    def key(self) -> tuple[str, str]:
        """A hashable identity for the compile cache (the schema canonicalised)."""
        if self.json is not None:
            schema = json.loads(self.json) if isinstance(self.json, str) else self.json
            return "json", json.dumps(schema, sort_keys=True, separators=(",", ":"))
        if self.json_object:
            return "json_object", ""
        if self.regex is not None:
            return "regex", self.regex
        if self.choice is not None:
            return "choice", json.dumps(list(self.choice))
        return "grammar", self.grammar or ""
