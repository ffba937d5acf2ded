"""`Host` on the machine the tool runs on (profile `host.transport: local`).

For the GPU host's own cron smoke check or `diagnose` (no SSH to itself), and for the real-SGLang
runs on a GPU machine that has no sshd. Same contract as `ssh.SSHHost`: argv lists are quoted by
nobody (they go to exec directly), `run` never raises for a non-zero exit, `put` writes exactly
the path it is given, `http` talks to the host's loopback.
"""

from __future__ import annotations

import http.client
import json
import os
import select
import socket
import subprocess
import time
from typing import Any, Sequence

from ddtree_ops.errors import OpsError
from ddtree_ops.host import HttpResponse, HttpUnavailable, RemoteTimeout, Result


class LocalHost:
    """Commands through subprocess, HTTP through a plain socket: no connection to lose."""

    def __init__(self, name: str, *, use_sudo: bool = False) -> None:
        self.name = name
        # sudo only when asked for and not root already: `sudo -n` never prompts
        self.use_sudo = use_sudo and os.geteuid() != 0

    def _argv(self, argv: Sequence[str], sudo: bool) -> list[str]:
        return ["sudo", "-n", "--", *argv] if sudo and self.use_sudo else list(argv)

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float = 60.0,
            sudo: bool = False) -> Result:
        full = self._argv(argv, sudo)
        t0 = time.monotonic()
        try:
            proc = subprocess.run(full, input=stdin if stdin is not None else b"", capture_output=True,
                                  timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise RemoteTimeout(f"{self.name}: command timed out after {timeout:g}s: {' '.join(full)[:120]}") from None
        except FileNotFoundError as exc:
            return Result(tuple(full), 127, "", f"{exc.filename}: command not found", time.monotonic() - t0)
        return Result(tuple(full), proc.returncode, proc.stdout.decode("utf-8", "replace"),
                      proc.stderr.decode("utf-8", "replace"), time.monotonic() - t0)

    def put(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        if self.use_sudo:
            script = 'umask 077 && cat > "$1" && chmod "$2" "$1"'
            self.run(["sh", "-c", script, "sh", path, f"{mode:o}"], stdin=data, sudo=True).check(f"writing {path}")
            return
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)

    def get(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None
        except PermissionError:
            if not self.use_sudo:
                raise OpsError(f"{self.name}: cannot read {path}: permission denied") from None
            res = self.run(["cat", "--", path], sudo=True)
            if res.rc != 0:
                raise OpsError(f"{self.name}: cannot read {path}: {res.stderr.strip()}") from None
            return res.stdout.encode()

    def http(self, method: str, port: int, path: str, *, body: Any = None, timeout: float = 10.0,
             host: str = "127.0.0.1") -> HttpResponse:
        payload = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        headers = {"User-Agent": "ddtree-ops", "Connection": "close"}
        if body is not None and not isinstance(body, bytes):
            headers["Content-Type"] = "application/json"
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        t0 = time.monotonic()
        try:
            conn.request(method, path, body=payload, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            return HttpResponse(resp.status, data, time.monotonic() - t0,
                                {k.lower(): v for k, v in resp.getheaders()})
        except (socket.timeout, TimeoutError):
            raise HttpUnavailable(f"{self.name}: {method} {path} on port {port} timed out after {timeout:g}s") from None
        except (ConnectionError, http.client.HTTPException, OSError) as exc:
            raise HttpUnavailable(f"{self.name}: nothing answers on {host}:{port} ({exc})") from None
        finally:
            conn.close()

    def stream(self, argv: Sequence[str], *, timeout: float = 30.0) -> _ProcessLines:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        return _ProcessLines(self.name, proc)

    def reconnect(self, retries: int = 3) -> None:
        """Nothing to reconnect: the deploy's after-a-drop path is a no-op here."""

    def close(self) -> None:
        pass

    def __enter__(self) -> LocalHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _ProcessLines:
    """Lines from a running local command, each read with its own deadline."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        self._name, self._proc, self._buf = name, proc, b""

    def readline(self, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        out = self._proc.stdout
        assert out is not None
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RemoteTimeout(f"{self._name}: no output from the watcher for {timeout:g}s")
            ready, _, _ = select.select([out], [], [], left)
            if not ready:
                continue
            data = os.read(out.fileno(), 65536)
            if not data:
                rest, self._buf = self._buf, b""
                return rest.decode("utf-8", "replace") if rest else None
            self._buf += data
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode("utf-8", "replace")

    def __enter__(self) -> _ProcessLines:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, 15)
            except ProcessLookupError:
                pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self._proc.pid, 9)
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
