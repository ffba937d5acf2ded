"""stdout carries data, stderr carries people.

One rich Console on stderr for humans (colour only on a TTY; rich honours NO_COLOR),
and plain writes on stdout for data: unit text, JSON documents, Nagios lines.
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Iterator, Sequence

if TYPE_CHECKING:
    from rich.console import Console

SCHEMA_VERSION = 1


@lru_cache(maxsize=1)
def err() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


_local = threading.local()


@contextmanager
def captured(host: str, *, echo: bool) -> Iterator[list[str]]:
    """Lines said on this thread are kept (plain text) instead of printed; with `echo` they are
    printed too, led by the host's name. A fleet runs one host per thread: its people-lines stay
    one per host unless asked for (--verbose), and every host's own lines reach its JSON entry."""
    lines: list[str] = []
    _local.capture = (host, echo, lines)
    try:
        yield lines
    finally:
        _local.capture = None


def _print(message: str, style: str | None = None) -> None:
    cap = getattr(_local, "capture", None)
    if cap is not None:
        host, echo, lines = cap
        from rich.text import Text

        try:
            plain = Text.from_markup(message).plain
        except Exception:  # noqa: BLE001 - a line that is not valid markup is kept as it is
            plain = message
        lines.append(plain)
        if not echo:
            return
        if not plain.lstrip().startswith(f"{host}:"):  # most of deploy's lines name their host already
            message = f"[dim]{host} |[/] {message}"
    err().print(message, style=style)


# the latest "where is it now" of each host a fleet runs on its own thread (the gate's phase and
# seconds of its deadline): the fleet shows them while it waits, live on a terminal, else every 10 s
_status: dict[str, str] = {}
_status_lock = threading.Lock()


def status(text: str) -> None:
    """This thread's host is at `text` now (only inside `captured`: a single host prints its own lines)."""
    cap = getattr(_local, "capture", None)
    if cap is not None:
        with _status_lock:
            _status[cap[0]] = text


def statuses(hosts: Sequence[str]) -> dict[str, str]:
    with _status_lock:
        return {h: _status.get(h, "starting") for h in hosts}


def say(message: str, *, style: str | None = None) -> None:
    """A line for the operator, on stderr."""
    _print(message, style)


def escape(text: str) -> str:
    """Text to show as it is inside a markup line (`[Errno 98]`, `[lab:children]` stay visible)."""
    from rich.markup import escape as _escape

    return _escape(text)


def warn(message: str) -> None:
    _print(f"[yellow]warning:[/] {message}")


def fail(message: str) -> None:
    _print(f"[bold red]error:[/] {message}")


def data(text: str) -> None:
    """Data on stdout, exactly as given (no markup, no wrapping)."""
    sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
    sys.stdout.flush()


def emit_json(doc: dict[str, Any]) -> None:
    """One JSON document on stdout, always carrying schema_version."""
    import json  # ~4 ms, only when a document is printed: every command's --help goes through here

    body = {"schema_version": SCHEMA_VERSION, **doc}
    sys.stdout.write(json.dumps(body, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Aligned columns, the last one left ragged."""
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([c.ljust(w) for c, w in zip(r, widths)] + [r[-1]]).rstrip() for r in rows]
