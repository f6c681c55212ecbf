"""The one gate every command that reads a spec passes before it writes a file or touches a host (plan,
inventory, apply, audit spec, monitoring export, tune, bench): the spec found, read and validated
(provisioner.spec), the HOST and GROUP names chosen (provisioner.fleet.selection), then the preflight on the hosts the
command works on (provisioner.validation.preflight: each GPU's memory, the drivers the spec names). What one command refuses,
all refuse.

A refusal is a `GateRefused`: every problem with its field, message and fix, as lines or as JSON data (the CLI
prints one or the other), control characters shown escaped and every secret redacted in both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from provisioner.base.secrets import redact
from provisioner.fleet.selection import SelectionError, find_spec, select_hosts
from provisioner.spec import Host, Problem, Spec, SpecError, load_spec
from provisioner.spec.wording import printable
from provisioner.validation.preflight import GateProblem, preflight_problems

USAGE, INVALID, REFUSED = "usage", "invalid", "refused"  # what kind of refusal: a GateRefused's `kind`
FIX_SEPARATOR = " — "


@dataclass(frozen=True)
class Refusal:
    """One problem the gate found: the field it is about, what is wrong, and the fix where the message has one.
    `label` starts its line: the field, or the preflight's kind (memory, driver); none for a usage error."""

    field: str
    message: str
    fix: str | None = None
    label: str | None = None

    @classmethod
    def of(cls, field: str, text: str, label: str | None = None) -> Refusal:
        """From a `message — fix` line (control characters escaped)."""
        message, _, fix = printable(redact(text)).partition(FIX_SEPARATOR)
        return cls(printable(field), message, fix or None, label)

    @property
    def text(self) -> str:
        """`message — fix`."""
        return self.message + (f"{FIX_SEPARATOR}{self.fix}" if self.fix else "")

    @property
    def line(self) -> str:
        """`label: message — fix`."""
        return f"{self.label}: {self.text}" if self.label else self.text

    def as_json(self) -> dict[str, str]:
        return {"field": self.field, "message": self.message, **({"fix": self.fix} if self.fix else {})}


def spec_refusal(problem: Problem) -> Refusal:
    return Refusal.of(problem.path, problem.message, label=printable(problem.path))


def preflight_refusal(problem: GateProblem) -> Refusal:
    return Refusal.of(problem.field, problem.message, label=problem.kind)


class GateRefused(Exception):
    """The command may not go on: `kind` (USAGE: no spec, an unknown HOST name; INVALID: the spec's problems;
    REFUSED: the preflight's), a `heading` line where there is one, and the `refusals`."""

    def __init__(self, kind: str, refusals: list[Refusal], heading: str | None = None):
        self.kind, self.refusals, self.heading = kind, refusals, heading
        super().__init__("\n".join(self.lines))

    @property
    def lines(self) -> list[str]:
        return ([self.heading] if self.heading else []) + [refusal.line for refusal in self.refusals]

    def as_json(self) -> dict:
        """{"error": what it is, "problems": [{"field", "message", "fix"}, ...]}."""
        error = self.heading or (self.refusals[0].line if len(self.refusals) == 1 else
                                 f"{len(self.refusals)} problems")
        return {"error": error, "problems": [refusal.as_json() for refusal in self.refusals]}


@dataclass(frozen=True)
class Gated:
    """What passed the gate: the spec file, the spec, and the hosts the command works on."""

    path: Path
    spec: Spec
    hosts: list[Host]


def read_spec(option: str | Path | None, names: Sequence[str] = ()) -> Gated:
    """The spec (--spec `option`, $PROVISION_SPEC, ./provision.yml) read and validated, and the hosts `names`
    stand for (none: every host); else GateRefused (USAGE or INVALID). No preflight: see `pass_gate`."""
    try:
        path = find_spec(option)
    except SelectionError as error:
        raise GateRefused(USAGE, [Refusal.of("--spec", str(error))]) from None
    try:
        spec = load_spec(path)
    except SpecError as error:
        count = len(error.problems)
        raise GateRefused(INVALID, [spec_refusal(problem) for problem in error.problems],
                          printable(f"{path}: {count} problem{'s' if count != 1 else ''}")) from None
    try:
        hosts = select_hosts(spec, list(names))
    except SelectionError as error:
        raise GateRefused(USAGE, [Refusal.of("HOST|GROUP", str(error))]) from None
    return Gated(path, spec, hosts)


def preflight_refusals(gated: Gated) -> list[Refusal]:
    """What the preflight finds on the gated hosts: an instance that would not fit its GPU, a driver too old."""
    return [preflight_refusal(problem) for problem in preflight_problems(gated.spec, gated.hosts)]


def preflight_gate(gated: Gated) -> None:
    """GateRefused (REFUSED) when the preflight finds a problem on the gated hosts."""
    refusals = preflight_refusals(gated)
    if refusals:
        raise GateRefused(REFUSED, refusals)


def pass_gate(option: str | Path | None, names: Sequence[str] = ()) -> Gated:
    """The whole gate: `read_spec`, then `preflight_gate` on its hosts."""
    gated = read_spec(option, names)
    preflight_gate(gated)
    return gated
