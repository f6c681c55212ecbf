"""docs/audit-checks.md, generated from the audit suite itself: every check it has, and nothing else.

Each suite file (`provisioner/audit/suite/test_*.py`) is a section, named after the file (test_sysctl.py:
"sysctl") and introduced by its module docstring's first paragraph, in the order the audit runs them.
Each check (a `test_*` function) is a row, from its docstring:

    \"\"\"`ROW NAME TEMPLATE` — what it compares.

    Modes: spec, profile.
    ...\"\"\"

The first line names the rows the check reports (upper-case words are placeholders: UNIT, KEY, PATH…;
several templates joined by " or " where the row's name depends on the case) and what it compares;
the `Modes:` line says where it runs: spec mode, profile mode or both (tests/unit/test_audit_check_docs.py
checks that claim against the expectations each mode builds). The suite is read with `ast`, not imported:
no pytest or testinfra at import, and a check without the docstring is a problem to report, not a crash.
Regenerate the page after adding or changing a check:

    .venv/bin/python -m provisioner.audit.check_docs        # writes docs/audit-checks.md
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

SUITE_DIR = Path(__file__).resolve().parent / "suite"
REPO = Path(__file__).resolve().parents[2]  # a checkout's top level: docs/ is there
DOCS_PAGE = REPO / "docs" / "audit-checks.md"
REGENERATE = ".venv/bin/python -m provisioner.audit.check_docs"
MODES = ("spec", "profile")
FIRST_LINE = re.compile(r"^(?P<rows>`[^`]+`(?: or `[^`]+`)*) — (?P<compares>\S.*\.)$")
MODES_LINE = re.compile(r"^Modes: (?P<modes>[a-z]+(?:, [a-z]+)*)\.$")
FORM = '"`ROW NAME TEMPLATE` — what it compares." then a line "Modes: spec, profile." (or one of them)'


@dataclass(frozen=True)
class CheckDoc:
    """One check function of the suite, as its docstring describes it."""

    module: str  # the suite file's stem: test_sysctl
    function: str
    rows: tuple[str, ...]  # the row name templates
    compares: str
    modes: tuple[str, ...]


@dataclass(frozen=True)
class Section:
    """One suite file: its summary (the module docstring's first paragraph) and its checks, in file order."""

    module: str
    summary: str
    checks: tuple[CheckDoc, ...]

    @property
    def title(self) -> str:
        return self.module.removeprefix("test_").replace("_", " ")


def suite_files(suite_dir: Path = SUITE_DIR) -> list[Path]:
    """The suite's files in the order pytest collects (and the audit runs and reports) them."""
    return sorted(suite_dir.glob("test_*.py"))


def read_suite(suite_dir: Path = SUITE_DIR) -> tuple[list[Section], list[str]]:
    """Every suite file's section, and every problem found (`file:line function: what is wrong`)."""
    sections, problems = [], []
    for path in suite_files(suite_dir):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        where = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)
        module_doc = ast.get_docstring(tree)
        if not module_doc:
            problems.append(f"{where}: no module docstring (its first paragraph introduces the section)")
        checks = []
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                check, problem = check_doc(path.stem, node)
                if problem:
                    problems.append(f"{where}:{node.lineno} {node.name}: {problem}")
                else:
                    checks.append(check)
        summary = " ".join((module_doc or "").split("\n\n")[0].split())
        sections.append(Section(path.stem, summary, tuple(checks)))
    return sections, problems


def check_doc(module: str, function: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[CheckDoc | None, str | None]:
    """The check's description from its docstring, or why its docstring does not have the form."""
    docstring = ast.get_docstring(function)
    if not docstring:
        return None, f"no docstring; its first lines must be {FORM}"
    lines = [line.strip() for line in docstring.splitlines()]
    first = FIRST_LINE.match(lines[0])
    if first is None:
        return None, f"the docstring's first line is not {FORM}: {lines[0]!r}"
    found = [match for match in map(MODES_LINE.match, lines[1:]) if match]
    if len(found) != 1:
        return None, f"{'no' if not found else 'more than one'} 'Modes: …' line; the form is {FORM}"
    modes = tuple(found[0]["modes"].split(", "))
    if not modes or any(mode not in MODES for mode in modes) or len(set(modes)) != len(modes):
        return None, f"'Modes: {found[0]['modes']}.' names modes other than {', '.join(MODES)} (each once)"
    rows = tuple(re.findall(r"`([^`]+)`", first["rows"]))
    return CheckDoc(module, function.name, rows, first["compares"], tuple(mode for mode in MODES if mode in modes)), None


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
        f"<!-- Generated from the audit suite (provisioner/audit/suite/test_*.py) by `{REGENERATE}`; do not edit: "
        "tests/unit/test_audit_check_docs.py fails when this file and the suite differ. -->",
        "",
        f"Every check `provision audit` runs, in the order it runs them: {total} checks in {len(sections)} files, "
        "each reporting one row per "
        "item it checks (a unit, a key, a GPU…). The row's name is the template with its placeholders "
        "(upper-case words: UNIT, KEY, PATH, N…) filled in; each row has an expected and an actual value and a "
        "status (passed, failed, n/a, error). **mode**: where the check runs — `spec` (hosts of the spec, "
        "expecting exactly what apply sets), `profile` (`audit host`, a server we did not build, against a profile's "
        "rules) or `both`. How the modes and the reports work: [audit.md](audit.md).",
    ]
    for section in sections:
        lines += ["", f"## {section.title}", "", f"{section.summary} (`provisioner/audit/suite/{section.module}.py`)",
                  "", "| row | what it compares | mode |", "|---|---|---|"]
        for check in section.checks:
            rows = " or ".join(f"`{_cell(row)}`" for row in check.rows)
            lines.append(f"| {rows} | {_cell(check.compares)} | {mode_text(check.modes)} |")
    return "\n".join(lines) + "\n"


def generated_page(suite_dir: Path = SUITE_DIR) -> tuple[str, list[str]]:
    """What docs/audit-checks.md must hold, and the problems that keep it from being complete."""
    sections, problems = read_suite(suite_dir)
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
