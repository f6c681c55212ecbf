"""The one way the CLI makes a Rich console (`make_console`).

In a terminal, Rich fits the output to the terminal. Anywhere else (a pipe, a file, a test's captured
output) nothing is wrapped or cut: Rich would lay every table out for 80 columns (or for the width of
whichever terminal stdin or stderr is) and fold or cut the cells; there it lays them out as wide as
their cells are. A rule (`console.rule`) is drawn 80 columns wide there.
"""

from __future__ import annotations

from typing import IO

from rich.console import Console, ConsoleDimensions
from rich.rule import Rule

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
