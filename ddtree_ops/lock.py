"""One deploy per host at a time: an atomic `mkdir` on the host plus who/when/pid/release in it.

Held for the whole transaction and released on every exit path (exceptions and Ctrl-C
included). A lock left by a control process that died on THIS machine is taken over with a
warning; anything else is reported and left for `ddtree-ops lock release`.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Iterator
from contextlib import contextmanager

from ddtree_ops import output, remote
from ddtree_ops.errors import OpsError
from ddtree_ops.host import Host
from ddtree_ops.releases import Layout, operator, utc_now

# mkdir is atomic: exactly one of two racing deploys creates the lock directory (Kamal's lock).
# The winner writes who/when into it from stdin; a loser prints the holder's details instead.
_ACQUIRE = ('mkdir -p -m 0700 -- "$1" || exit 3; '
            'if mkdir -- "$2" 2>/dev/null; then cat > "$2/info.json"; exit 0; fi; '
            'cat -- "$2/info.json" 2>/dev/null; exit 1')


class LockHeld(OpsError):
    exit_code = 3


@dataclass(frozen=True)
class LockInfo:
    by: str
    pid: int
    since: str
    command: str
    release: str | None
    control_host: str

    def describe(self) -> str:
        rel = f", release {self.release}" if self.release else ""
        return f"held by {self.by} (pid {self.pid}) since {self.since} for `{self.command}`{rel}"


def read_lock(host: Host, layout: Layout) -> LockInfo | None:
    res = host.run(["sh", "-c", 'test -d "$1" || exit 44; cat "$1/info.json" 2>/dev/null', "sh", layout.lock],
                   sudo=True, timeout=20)
    return None if res.rc == 44 else _info(res.stdout)


def _info(text: str) -> LockInfo:
    try:
        raw: dict[str, Any] = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        raw = {}
    return LockInfo(by=raw.get("by", "unknown"), pid=int(raw.get("pid", 0) or 0), since=raw.get("since", "?"),
                    command=raw.get("command", "?"), release=raw.get("release"),
                    control_host=raw.get("control_host", "?"))


def _owner_is_dead_here(info: LockInfo) -> bool:
    if info.control_host != socket.gethostname() or info.pid <= 0 or info.pid == os.getpid():
        return False
    try:
        os.kill(info.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def acquire(host: Host, layout: Layout, *, command: str, release: str | None, wait_s: float = 0) -> None:
    deadline = time.monotonic() + wait_s
    announced = False
    while True:
        info = {"by": operator(), "pid": os.getpid(), "since": utc_now(), "command": command,
                "release": release, "control_host": socket.gethostname()}
        res = host.run(["sh", "-c", _ACQUIRE, "sh", layout.root, layout.lock], stdin=json.dumps(info).encode(),
                       sudo=True, timeout=20)
        if res.rc == 0:
            return
        if res.rc != 1:
            res.check(f"taking the deploy lock {layout.lock}")
        held = _info(res.stdout)
        if _owner_is_dead_here(held):
            output.warn(f"{host.name}: taking over a lock whose process {held.pid} on this machine is gone "
                        f"({held.describe()})")
            release_lock(host, layout)
            continue
        if time.monotonic() >= deadline:
            raise LockHeld(f"{host.name}: deploy lock {held.describe()}",
                           hint="wait for it (--lock-wait SECONDS), or `ddtree-ops lock release "
                                f"{host.name}` if that run is dead")
        if not announced:
            output.say(f"{host.name}: waiting for the deploy lock, {held.describe()}")
            announced = True
        time.sleep(min(2.0, max(0.1, deadline - time.monotonic())))


def release_lock(host: Host, layout: Layout) -> None:
    host.run(remote.remove_tree(layout.lock), sudo=True, timeout=20)


@contextmanager
def held(host: Host, layout: Layout, *, command: str, release: str | None, wait_s: float = 0) -> Iterator[None]:
    acquire(host, layout, command=command, release=release, wait_s=wait_s)
    try:
        yield
    finally:
        try:
            release_lock(host, layout)
        except Exception as exc:  # noqa: BLE001 - a lost connection must not hide the real outcome
            output.warn(f"{host.name}: could not release the deploy lock ({exc}); "
                        f"run `ddtree-ops lock release {host.name}`")

