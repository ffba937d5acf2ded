"""stdout carries data, stderr carries people.

One rich Console on stderr for humans (colour only on a TTY; rich honours NO_COLOR),
and plain writes on stdout for data: unit text, JSON documents, Nagios lines.
"""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

SCHEMA_VERSION = 1


@lru_cache(maxsize=1)
def err() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def say(message: str, *, style: str | None = None) -> None:
    """A line for the operator, on stderr."""
    err().print(message, style=style)


def warn(message: str) -> None:
    err().print(f"[yellow]warning:[/] {message}")


def fail(message: str) -> None:
    err().print(f"[bold red]error:[/] {message}")


def data(text: str) -> None:
    """Data on stdout, exactly as given (no markup, no wrapping)."""
    sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
    sys.stdout.flush()


def emit_json(doc: dict[str, Any]) -> None:
    """One JSON document on stdout, always carrying schema_version."""
    body = {"schema_version": SCHEMA_VERSION, **doc}
    sys.stdout.write(json.dumps(body, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()
