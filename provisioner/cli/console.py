"""The one way the CLI makes a Rich console (`make_console`).

In a terminal, Rich fits the output to the terminal. Anywhere else (a pipe, a file, a test's captured
output) nothing is wrapped or cut: Rich would lay every table out for 80 columns (or for the width of
whichever terminal stdin or stderr is) and fold or cut the cells; there it lays them out as wide as
their cells are. A rule (`console.rule`) is drawn 80 columns wide there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO

from rich.cells import cell_len
from rich.console import Console, ConsoleDimensions
from rich.markup import escape
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

NOT_A_TERMINAL_WIDTH = 100_000  # wider than any table we print: laid out at their natural width
RULE_WIDTH = 80


class _Console(Console):
    """A Console whose width, when it does not write to a terminal, is unbounded (see the module)."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self._width is None and not self.is_terminal:
            return ConsoleDimensions(NOT_A_TERMINAL_WIDTH, size.height)
        return size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)

    def rule(self, title="", *, characters: str = "─", style="rule.line", align="center") -> None:
        self.print(Rule(title=title, characters=characters, style=style, align=align),
                   width=min(self.width, RULE_WIDTH) if not self.is_terminal else None)


def make_console(*, stderr: bool = False, file: IO[str] | None = None) -> Console:
    """A console on stdout (stderr=True: on stderr; or on `file`, a log say), markup on, no automatic
    highlighting, long lines of text not wrapped. On stdout/stderr it looks up the current stream at each
    write (tests capture them)."""
    return _Console(stderr=stderr, file=file, highlight=False, soft_wrap=True)


def print_table(console: Console, columns: Sequence[str], rows: Sequence[Sequence[str]], title: str = "") -> None:
    """A table of plain cells: in a terminal, Rich fits it to the terminal; anywhere else it is written as
    Rich writes it there (table_text), without Rich's layout engine: a 200-host plan prints 800 tables."""
    if console.is_terminal:
        table = Table(*columns, title=Text(title) if title else None)
        for row in rows:
            table.add_row(*(Text(cell) for cell in row))
        console.print(table)
    else:
        console.file.write(table_text(columns, rows, title))


def table_text(columns: Sequence[str], rows: Sequence[Sequence[str]], title: str = "") -> str:
    """The text make_console prints off a terminal for Table(*columns, title=title) of these rows of plain
    cells (Rich's default box, unbounded width, no styles; tests/unit/test_cli_output.py holds them equal)."""
    cells = [[str(cell).split("\n") for cell in row] for row in rows]
    widths = [max([cell_len(column), *(cell_len(line) for row in cells for line in row[index])])
              for index, column in enumerate(columns)]

    def line(left: str, fill: str, middle: str, right: str) -> str:
        return left + middle.join(fill * (width + 2) for width in widths) + right + "\n"

    def row_lines(row: list[list[str]], edge: str) -> str:
        height = max(len(cell) for cell in row)
        return "".join(edge + edge.join(f" {part}{' ' * (width - cell_len(part))} " for part, width in zip(
            (cell[number] if number < len(cell) else "" for cell in row), widths)) + edge + "\n"
            for number in range(height))

    text = f"{title}\n" if title else ""
    text += line("┏", "━", "┳", "┓") + row_lines([[column] for column in columns], "┃") + line("┡", "━", "╇", "┩")
    text += "".join(row_lines(row, "│") for row in cells)
    return text + line("└", "─", "┴", "┘")


def print_rule(console: Console, title: str) -> None:
    """console.rule(title) for a plain title; off a terminal a title that fits is drawn without Rich (rule_text)."""
    if console.is_terminal or cell_len(title) > RULE_WIDTH - 4:  # Rich cuts a longer title
        console.rule(escape(title))
    else:
        console.file.write(rule_text(title))


def rule_text(title: str) -> str:
    """The line console.rule(title) draws off a terminal (RULE_WIDTH wide) for a plain title of at most
    RULE_WIDTH - 4 cells."""
    left = (RULE_WIDTH - cell_len(title) - 2) // 2
    return f"{'─' * left} {title} {'─' * (RULE_WIDTH - cell_len(title) - 2 - left)}\n"


def print_spec_problems(console: Console, error, after: str) -> None:
    """A SpecError's problems, a line each (`field: message`, escaped and redacted), then `after`: what was not
    done."""
    from rich.markup import escape

    from provisioner.base.secrets import redact
    from provisioner.spec.wording import printable

    for problem in error.problems:
        console.print(f"[bold red]{escape(printable(problem.path))}:[/] {escape(printable(redact(problem.message)))}")
    console.print(after)
