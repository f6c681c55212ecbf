"""What a spec problem is: a `Problem` (where and what), and `SpecError`, which carries them all."""

from __future__ import annotations

from typing import NamedTuple


class Problem(NamedTuple):
    """One thing wrong with the spec: where (`instances[2].port`) and what, with the fix."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecError(Exception):
    """The spec is invalid; `.problems` lists every problem found."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(problem) for problem in self.problems))
