"""How values read inside the problem messages: as they are written in YAML, or rounded."""

from __future__ import annotations

import re
from typing import Any


def literal(value: Any) -> str:
    """A scalar as it reads in YAML: 'text', true, null, 450."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"'{value}'"
    return str(value)


def show(value: Any) -> str:
    """A value for a type error: 'text', true, null, a list, 0.25 (float)."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value} ({type(value).__name__})"
    return literal(value)


def fmt_number(value: float) -> str:
    """0.9500000001 → '0.95', 1.0 → '1'"""
    return f"{round(value, 4):g}"


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str) -> str:
    """`text` with each control character shown escaped (a line break as \\n, ESC as \\x1b): a value written in
    the spec, echoed in a message, prints on the message's own line and moves no terminal's cursor."""
    return _CONTROL.sub(lambda match: _NAMED_ESCAPES.get(match[0], f"\\x{ord(match[0]):02x}"), text)
