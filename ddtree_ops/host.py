"""The one interface through which the tool touches a host.

Everything that decides is a pure function over observations; everything that observes or
changes a host goes through `Host`. The SSH implementation lives in `ssh.py`, the local one (the
tool on the GPU host itself, `host.transport: local`) in `local.py`; `transport.connect` picks one
by profile. This module names neither: the interface sits below its implementations. Unit tests
inject fakes, integration tests use the lab hosts over real SSH.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable

from ddtree_ops.errors import OpsError

Argv = Sequence[str]


@dataclass(frozen=True)
class Result:
    """What one remote command did."""

    argv: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def check(self, what: str | None = None) -> Result:
        if self.rc != 0:
            detail = (self.stderr or self.stdout).strip().splitlines()
            tail = detail[-1] if detail else f"exit status {self.rc}"
            raise RemoteCommandError(f"{what or shlex.join(self.argv)} failed: {tail}", result=self)
        return self


@dataclass(frozen=True)
class HttpResponse:
    status: int
    body: bytes
    elapsed_s: float
    headers: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.body.decode("utf-8", "replace"))

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class HostError(OpsError):
    """The host could not be reached or refused us (exit 3 before any change)."""

    exit_code = 3


class HostUnreachable(HostError):
    pass


class HostKeyError(HostError):
    pass


class SudoPasswordRequired(HostError):
    pass


class RemoteCommandError(OpsError):
    def __init__(self, message: str, *, result: Result) -> None:
        super().__init__(message)
        self.result = result


class HttpUnavailable(OpsError):
    """Nothing answered on the service port (connection refused, reset, or timed out)."""


class RemoteTimeout(OpsError):
    """A command or a stream on the host gave nothing back in time (exit 3 before any change)."""

    exit_code = 3


@runtime_checkable
class Host(Protocol):
    """A machine we deploy to. `argv` lists are quoted by the implementation, never by callers."""

    name: str

    def run(self, argv: Argv, *, stdin: bytes | None = None, timeout: float = 60.0,
            sudo: bool = False) -> Result:
        """Run one command; never raises for a non-zero exit (see Result.check)."""
        ...

    def put(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        """Write bytes to exactly `path` (callers stage beside the target and rename)."""
        ...

    def get(self, path: str) -> bytes | None:
        """Read a file; None when it does not exist."""
        ...

    def http(self, method: str, port: int, path: str, *, body: Any = None,
             timeout: float = 10.0, host: str = "127.0.0.1") -> HttpResponse:
        """HTTP to a port on the host's own loopback (through the SSH connection)."""
        ...

    def stream(self, argv: Argv, *, timeout: float = 30.0) -> LineStream:
        """Start a long-running command and read its output line by line as it comes (a context
        manager; leaving it stops the command)."""
        ...

    def close(self) -> None:
        ...


class LineStream(Protocol):
    def readline(self, timeout: float) -> str | None:
        """The next line without its newline; None at the end of the output. Raises
        RemoteTimeout (an OpsError) when nothing arrives in time."""
        ...

    def __enter__(self) -> LineStream:
        ...

    def __exit__(self, *exc: object) -> None:
        ...
