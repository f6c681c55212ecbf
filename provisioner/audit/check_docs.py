"""docs/audit-checks.md, generated from the check registry: every check the audit has, and nothing else.

Each concern module (`provisioner/audit/checks/sysctl.py`…) is a section, named after the module ("sysctl")
and introduced by its docstring's first paragraph, in the order the audit runs them. Each check (a
function registered with `@check` or `@each`) is a row, from its docstring:

    \"\"\"`ROW NAME TEMPLATE` — what it compares.

    Modes: spec, profile.
    ...\"\"\"

The first line names the rows the check reports (upper-case words are placeholders: UNIT, KEY, PATH…;
several templates joined by " or " where the row's name depends on the case) and what it compares;
the `Modes:` line says where it runs: spec mode, profile mode or both (tests/unit/test_audit_check_docs.py
checks that claim against the expectations each mode builds; provisioner/audit/registry.py reads the
docstring). A check without the docstring form is a problem to report, not a crash. Regenerate the page
after adding or changing a check:

    .venv/bin/python -m provisioner.audit.check_docs        # writes docs/audit-checks.md
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from pathlib import Path

from provisioner.audit.registry import FORM, MODES, Check, all_checks, concerns

REPO = Path(__file__).resolve().parents[2]  # a checkout's top level: docs/ is there
DOCS_PAGE = REPO / "docs" / "audit-checks.md"
REGENERATE = ".venv/bin/python -m provisioner.audit.check_docs"
__all__ = ["DOCS_PAGE", "FORM", "MODES", "REGENERATE", "Section", "generated_page", "read_checks"]


@dataclass(frozen=True)
class Section:
    """One concern module: its summary (the module docstring's first paragraph) and its checks, in module order."""

    module: str  # the module's name: sysctl
    summary: str
    checks: tuple[Check, ...]

    @property
    def title(self) -> str:
        return self.module.replace("_", " ")


def read_checks() -> tuple[list[Section], list[str]]:
    """Every concern's section, and every problem found (`file:line function: what is wrong`)."""
    checks, sections, problems = all_checks(), [], []
    for module in concerns():
        name = module.__name__.rpartition(".")[2]
        where = f"provisioner/audit/checks/{name}.py"
        if not module.__doc__:
            problems.append(f"{where}: no module docstring (its first paragraph introduces the section)")
        own = [found for found in checks if found.concern == name]
        problems += [f"{where}:{inspect.getsourcelines(found.function)[1]} {found.name}: {found.problem}"
                     for found in own if found.problem]
        summary = " ".join((module.__doc__ or "").strip().split("\n\n")[0].split())
        sections.append(Section(name, summary, tuple(found for found in own if not found.problem)))
    return sections, problems


# --------------------------------------------------------------------------- the page


def mode_text(modes: tuple[str, ...]) -> str:
    return "both" if set(modes) == set(MODES) else modes[0]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def checks_markdown(sections: list[Section]) -> str:
    total = sum(len(section.checks) for section in sections)
    lines = [
        "# Audit checks",
        "",
        f"<!-- Generated from the check registry (provisioner/audit/checks/*.py) by `{REGENERATE}`; do not edit: "
        "tests/unit/test_audit_check_docs.py fails when this file and the checks differ. -->",
        "",
        f"Every check `provision audit` runs, in the order it runs them: {total} checks in {len(sections)} modules, "
        "each reporting one row per "
        "item it checks (a unit, a key, a GPU…). The row's name is the template with its placeholders "
        "(upper-case words: UNIT, KEY, PATH, N…) filled in; each row has an expected and an actual value and a "
        "status (passed, failed, n/a, error). **mode**: where the check runs — `spec` (hosts of the spec, "
        "expecting exactly what apply sets), `profile` (`audit host`, a server we did not build, against a profile's "
        "rules) or `both`. How the modes and the reports work: [audit.md](audit.md).",
    ]
    for section in sections:
        lines += ["", f"## {section.title}", "", f"{section.summary} (`provisioner/audit/checks/{section.module}.py`)",
                  "", "| row | what it compares | mode |", "|---|---|---|"]
        for check in section.checks:
            rows = " or ".join(f"`{_cell(row)}`" for row in check.rows)
            lines.append(f"| {rows} | {_cell(check.compares)} | {mode_text(check.modes)} |")
    return "\n".join(lines) + "\n"


def generated_page() -> tuple[str, list[str]]:
    """What docs/audit-checks.md must hold, and the problems that keep it from being complete."""
    sections, problems = read_checks()
    return checks_markdown(sections), problems


def main() -> int:
    text, problems = generated_page()
    if problems:
        print("checks without the docstring form (nothing written):", *problems, sep="\n  ", file=sys.stderr)
        return 1
    DOCS_PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {DOCS_PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
