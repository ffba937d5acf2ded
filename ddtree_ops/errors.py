"""Errors the CLI turns into one clear line and an exit code, never a traceback."""

from __future__ import annotations

import difflib
from typing import Iterable


class OpsError(Exception):
    """An expected failure with a message meant for the operator."""

    exit_code: int = 3

    def __init__(self, message: str, *, exit_code: int | None = None, hint: str | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
        self.hint = hint


class ProfileError(OpsError):
    """A profile (or a --set override) is invalid; carries every problem found."""

    exit_code = 64

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class UsageError(OpsError):
    exit_code = 64


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """` (did you mean 'x'?)` for a word close to a known one, else nothing: the hint a message about
    a typo ends with."""
    close = difflib.get_close_matches(word, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
