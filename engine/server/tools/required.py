"""The calls in a "required" output as it grows: `[{"name":"f","parameters":{...}},...]`, compact JSON.

The grammar engine writes the list compactly and each item's keys in the
schema's order (name, then parameters), so a call's name is known as soon
as its string closes and its arguments are the raw text of the
`parameters` value from its first character on. `scan` finds them in a
prefix of the output, for streaming each call's arguments as they are
generated; on the finished output it gives the same argument text, so a
streamed call accumulates exactly to the non-streamed one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

_ITEM_HEAD = re.compile(r'\{"name":("(?:[^"\\]|\\.)*"),"parameters":')


@dataclass(frozen=True)
class RequiredCall:
    name: str
    arguments: str  # the parameters' raw text so far


def scan(text: str) -> list[RequiredCall]:
    """The calls visible in a prefix of a required-mode output (an item shows once its name is written)."""
    calls: list[RequiredCall] = []
    position = 1 if text.startswith("[") else len(text)
    while position < len(text):
        head = _ITEM_HEAD.match(text, position)
        if head is None:
            break
        start = head.end()
        end = _value_end(text, start)
        calls.append(RequiredCall(json.loads(head.group(1)), text[start:end]))
        if end >= len(text):
            break
        position = end + 1  # the item's "}"
        if text.startswith(",", position):
            position += 1
    return calls


def _value_end(text: str, start: int) -> int:
    """The index just after the JSON value starting at start, or len(text) while it is still open."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)
