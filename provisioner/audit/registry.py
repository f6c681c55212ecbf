"""The audit's checks: plain functions registered with `@check` (once per host) or `@each(items_of, ids)`
(once per item of the host's expectations), and the `Audit` a check compares with.

A check takes any of `case` (the host, its expectations and the item), `facts` (what the host has, read in
one round trip: provisioner/audit/engine.py) and `audit`, and calls `audit.expect(row, expected, actual)`:
a difference raises `Drift` (the row fails); `audit.not_applicable(row, expected, reason)` makes it n/a;
`audit.unknown(row, expected, why)` an error (what it compares could not be read).
Its docstring is its entry in docs/audit-checks.md: a first line "`ROW NAME TEMPLATE` — what it compares."
and a line "Modes: spec, profile." (or one of them).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

NOT_APPLICABLE = "not applicable:"
UNSET = "(unset)"
ABSENT = "(absent)"
REPORTED = {"expected": "(reported)", "pattern": ""}  # a value shown for people, not compared
CHECKS_PACKAGE = "provisioner.audit.checks"
MODES = ("spec", "profile")
FIRST_LINE = re.compile(r"^(?P<rows>`[^`]+`(?: or `[^`]+`)*) — (?P<compares>\S.*\.)$")
MODES_LINE = re.compile(r"^Modes: (?P<modes>[a-z]+(?:, [a-z]+)*)\.$")
FORM = '"`ROW NAME TEMPLATE` — what it compares." then a line "Modes: spec, profile." (or one of them)'


class Drift(AssertionError):
    """A host differs from what it should have."""

    def __init__(self, check: str, expected: str, actual: str):
        self.check, self.expected, self.actual = check, expected, actual
        super().__init__(f"{check}: expected {expected}, actual {actual}")


class NotApplicable(Exception):
    """The check does not apply on this host (a live kernel parameter in a container…)."""


class Unknown(RuntimeError):
    """What the check compares could not be read on the host (a file not readable): its row is an error that
    says so, never a pass nor a claim that the thing is absent."""


@dataclass(frozen=True)
class Case:
    """One check's subject on one host: the host's name, its expectations and the item (a unit, a key…)."""

    host: str
    target: dict[str, Any]
    item: Any = None


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
    """What one check run recorded: its row's name, expected and actual."""

    def __init__(self):
        self.row: dict[str, str] = {}

    def _record(self, check: str, expected: Any, actual: Any) -> None:
        self.row = {"check": check, "expected": shown(expected), "actual": shown(actual)}

    def expect(self, check: str, expected: Any, actual: Any, passed: bool | None = None) -> None:
        """Pass when `actual` matches `expected` (or when `passed`, if given); raise Drift otherwise."""
        actual = shown(actual)
        self._record(check, expected, actual)
        if not (matches(expected, actual) if passed is None else passed):
            raise Drift(check, shown(expected), actual)

    def not_applicable(self, check: str, expected: Any, reason: str) -> None:
        self._record(check, expected, f"n/a: {reason}")
        raise NotApplicable(reason)

    def unknown(self, check: str, expected: Any, why: str) -> None:
        """The row's actual value could not be read: `unknown: WHY`, an error."""
        self._record(check, expected, f"unknown: {why}")
        raise Unknown(f"{check}: unknown: {why}")


def once_per_host(expected: dict[str, Any]) -> list[None]:
    return [None]


@dataclass(frozen=True)
class Check:
    """A registered check: its function, the items it runs on, and what its docstring says."""

    concern: str  # the module's name in provisioner/audit/checks: sysctl
    name: str  # the function's: at_boot
    function: Callable[..., None]
    items_of: Callable[[dict[str, Any]], Iterable[Any]]
    ids: Callable[[Any], str] | None  # None: once per host
    arguments: tuple[str, ...]  # which of case, facts, audit it takes
    doc: str
    rows: tuple[str, ...] = ()  # the row name templates
    compares: str = ""
    modes: tuple[str, ...] = ()
    problem: str | None = None  # why the docstring does not have the form

    def cases(self, host: str, expected: dict[str, Any]) -> list[tuple[Case, str]]:
        """(case, id) of each run of the check on this host."""
        return [(Case(host, expected, item), self.ids(item) if self.ids else "") for item in self.items_of(expected)]

    def run(self, case: Case, facts: Any, audit: Audit) -> None:
        given = {"case": case, "facts": facts, "audit": audit}
        self.function(**{name: given[name] for name in self.arguments})


REGISTERED: dict[tuple[str, str], Check] = {}  # (concern, name) → check, in the order registered


def check(function: Callable | None = None, *, items_of: Callable | None = None, ids: Callable[[Any], str] = str):
    """Register a check: `@check` runs once per host, `@check(items_of=…, ids=…)` once per item."""

    def register(function: Callable) -> Callable:
        found = make_check(function, items_of, ids)
        REGISTERED[found.concern, found.name] = found
        return function

    return register(function) if function is not None else register


def make_check(function: Callable, items_of: Callable | None = None, ids: Callable[[Any], str] = str) -> Check:
    """The check of `function` (once per host without `items_of`), described by its docstring; not registered."""
    return described(Check(function.__module__.rpartition(".")[2], function.__name__, function, items_of or once_per_host,
                           ids if items_of else None, tuple(inspect.signature(function).parameters),
                           inspect.getdoc(function) or ""))


def each(items_of: Callable[[dict[str, Any]], Iterable[Any]], ids: Callable[[Any], str] = str):
    """The check runs once per item that `items_of(host's expectations)` lists."""
    return check(items_of=items_of, ids=ids)


def described(found: Check) -> Check:
    """The check with its rows, what it compares and its modes from its docstring (or the problem with it)."""
    if not found.doc:
        return replace(found, problem=f"no docstring; its first lines must be {FORM}")
    lines = [line.strip() for line in found.doc.splitlines()]
    first = FIRST_LINE.match(lines[0])
    if first is None:
        return replace(found, problem=f"the docstring's first line is not {FORM}: {lines[0]!r}")
    modes_lines = [match for match in map(MODES_LINE.match, lines[1:]) if match]
    if len(modes_lines) != 1:
        return replace(found, problem=f"{'no' if not modes_lines else 'more than one'} 'Modes: …' line; the form is {FORM}")
    modes = modes_lines[0]["modes"].split(", ")
    if any(mode not in MODES for mode in modes) or len(set(modes)) != len(modes):
        return replace(found, problem=f"'Modes: {modes_lines[0]['modes']}.' names modes other than {', '.join(MODES)} (each once)")
    return replace(found, rows=tuple(re.findall(r"`([^`]+)`", first["rows"])), compares=first["compares"],
                   modes=tuple(mode for mode in MODES if mode in modes))


def replace(found: Check, **changes: Any) -> Check:
    return dataclasses.replace(found, **changes)


def concerns() -> list[ModuleType]:
    """The modules of provisioner/audit/checks, one per concern, in name order (the order the audit runs them)."""
    package = importlib.import_module(CHECKS_PACKAGE)
    return [importlib.import_module(f"{CHECKS_PACKAGE}.{module.name}")
            for module in sorted(pkgutil.iter_modules(package.__path__), key=lambda module: module.name)]


def all_checks() -> list[Check]:
    """Every registered check: concern by concern, each concern's in the order its module defines them."""
    order = {module.__name__.rpartition(".")[2]: index for index, module in enumerate(concerns())}
    return sorted(REGISTERED.values(), key=lambda found: order[found.concern])
