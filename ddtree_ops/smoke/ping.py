"""The dead-man ping (healthchecks.io style): `/start` when a run begins, `/<exit code>` when it ends."""

from __future__ import annotations

import threading
import time
import urllib.parse
import urllib.request
import uuid
from typing import Callable


class Pinger:
    """healthchecks.io-style pings: `/start` when a run begins, `/<exit code>` when it ends.

    Each ping runs on a daemon thread and is waited for at most `timeout` seconds, so a dead
    ping endpoint adds at most about two seconds to a run and can never change its exit code.
    A run id pairs the start with its end when runs of the same check overlap elsewhere.
    """

    def __init__(self, url: str, *, timeout: float = 2.0, on_error: Callable[[str], None] | None = None) -> None:
        self.url = url
        self.timeout = timeout
        self.rid = str(uuid.uuid4())
        self.on_error = on_error
        self._start: threading.Thread | None = None
        self._t_start = 0.0

    def _target(self, suffix: str) -> str:
        parts = urllib.parse.urlsplit(self.url)
        path = parts.path.rstrip("/") + "/" + suffix
        query = "&".join(q for q in (parts.query, f"rid={self.rid}") if q)
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, query, ""))

    def _send(self, suffix: str, body: bytes) -> None:
        url = self._target(suffix)
        try:
            req = urllib.request.Request(url, data=body, method="POST",
                                         headers={"User-Agent": "ddtree-ops smoke", "Content-Type": "text/plain"})
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 - operator-given URL
                resp.read(1024)
        except Exception as exc:  # noqa: BLE001 - any failure of a ping is only worth a warning
            if self.on_error:
                self.on_error(f"ping {url} failed: {exc}")

    def _spawn(self, suffix: str, body: bytes) -> threading.Thread:
        t = threading.Thread(target=self._send, args=(suffix, body), daemon=True, name=f"ping-{suffix}")
        t.start()
        return t

    def start(self) -> None:
        """Sent in the background: the checks do not wait for it."""
        self._t_start = time.monotonic()
        self._start = self._spawn("start", b"")

    def finish(self, exit_code: int, body: str) -> None:
        """Waits at most `timeout` (plus half a second for the last ping) in all."""
        end = time.monotonic() + self.timeout
        if self._start is not None:  # keep /start before /<rc> when it is merely slow
            self._start.join(max(0.0, min(end, self._t_start + self.timeout) - time.monotonic()))
        last = self._spawn(str(exit_code), body.encode("utf-8", "replace")[:10_000])
        last.join(max(0.5, end - time.monotonic()))
