"""The pieces every check of the suite uses: its case, the one comparison helper, "not applicable".

A check compares what a host should have (expected) with what it has (actual) through
`Audit.expect`, which records both on the pytest item (the plugin reports them) and raises
`Drift` when they differ. A check that does not apply on this host (a live kernel parameter in a
container…) calls `Audit.not_applicable`: a skip whose reason starts with "not applicable:",
reported as n/a, never as passed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pytest

NOT_APPLICABLE = "not applicable:"
UNSET = "(unset)"
ABSENT = "(absent)"
REPORTED = {"expected": "(reported)", "pattern": ""}  # a value shown for people, not compared


class Drift(AssertionError):
    """A host differs from what it should have."""

    def __init__(self, check: str, expected: str, actual: str):
        self.check, self.expected, self.actual = check, expected, actual
        super().__init__(f"{check}: expected {expected}, actual {actual}")


@dataclass(frozen=True)
class Case:
    """One check's subject on one host: the host's name, its expectations and the item (a unit, a key…)."""

    host: str
    target: dict[str, Any]
    item: Any = None


def each(items_of: Callable[[dict[str, Any]], Iterable[Any]], ids: Callable[[Any], str] = str):
    """Run the check once per item that `items_of(target's expectations)` lists, on every host."""
    return pytest.mark.audit_each(items_of, ids)


def matches(expected: Any, actual: str) -> bool:
    """A rule ({expected, pattern}) matches by regular expression; any other value by equality."""
    if isinstance(expected, dict):
        return re.search(expected["pattern"], actual) is not None
    return shown(expected) == actual


def shown(value: Any) -> str:
    """A value as a report shows it."""
    if isinstance(value, dict) and "expected" in value:
        return str(value["expected"])
    if isinstance(value, (list, tuple, set)):
        return ", ".join(map(str, value))
    return str(value)


class Audit:
    """Bound to one pytest item: records the check's name, expected and actual there."""

    def __init__(self, item: pytest.Item):
        self.item = item

    def _record(self, check: str, expected: Any, actual: Any) -> None:
        self.item.user_properties[:] = [
            ("check", check), ("expected", shown(expected)), ("actual", shown(actual))
        ]

    def expect(self, check: str, expected: Any, actual: Any, passed: bool | None = None) -> None:
        """Pass when `actual` matches `expected` (or when `passed`, if given); raise Drift otherwise."""
        actual = shown(actual)
        self._record(check, expected, actual)
        if not (matches(expected, actual) if passed is None else passed):
            raise Drift(check, shown(expected), actual)

    def not_applicable(self, check: str, expected: Any, reason: str) -> None:
        self._record(check, expected, f"n/a: {reason}")
        pytest.skip(f"{NOT_APPLICABLE} {reason}")
