"""Releases kept on the host, Capistrano-style, next to the service they describe.

    <state_dir>/<unit>/releases/<release_id>/{unit,env,meta.json}
    <state_dir>/<unit>/known-good     release id the gate last passed (the rollback target)
    <state_dir>/<unit>/current        release id installed now
    <state_dir>/<unit>/pending.json   written BEFORE the unit is touched, removed when the deploy
                                      ends either way: if it is still there, a deploy was cut off
    <state_dir>/<unit>/audit.log      one line per change

Every state file is written beside its target and renamed over it, so a full disk or a dropped
connection leaves the old file, never half of a new one.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from ddtree_ops import remote
from ddtree_ops.host import Host
from ddtree_ops.render import Rendered


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def operator() -> str:
    """Who is acting, as `user@control-host`, for locks and audit lines."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True)
class Layout:
    root: str  # <state_dir>/<unit stem>

    @classmethod
    def for_service(cls, state_dir: str, unit: str) -> Layout:
        return cls(f"{state_dir.rstrip('/')}/{unit.removesuffix('.service')}")

    def release_dir(self, release_id: str) -> str:
        return f"{self.root}/releases/{release_id}"

    @property
    def releases(self) -> str:
        return f"{self.root}/releases"

    @property
    def known_good(self) -> str:
        return f"{self.root}/known-good"

    @property
    def current(self) -> str:
        return f"{self.root}/current"

    @property
    def pending(self) -> str:
        return f"{self.root}/pending.json"

    @property
    def audit(self) -> str:
        return f"{self.root}/audit.log"

    @property
    def lock(self) -> str:
        return f"{self.root}/lock"


def write_atomic(host: Host, path: str, data: bytes, *, mode: int = 0o644) -> None:
    """Write beside, then rename over: readers see the old bytes or the new, never a part.
    A failed write (full disk, dropped connection) removes its own partial file."""
    tmp = f"{path}.ddtree-new"
    try:
        host.put(tmp, data, mode=mode)
    except BaseException:
        try:
            host.run(remote.remove(tmp), timeout=20)
        except Exception:  # noqa: BLE001 - the original failure is the one worth reporting
            pass
        raise
    host.run(remote.rename(tmp, path), sudo=True, timeout=20).check(f"installing {path}")


def read_text(host: Host, path: str) -> str | None:
    data = host.get(path)
    return None if data is None else data.decode("utf-8", "replace").strip()


def save_release(host: Host, layout: Layout, rendered: Rendered, *, status: str) -> None:
    d = layout.release_dir(rendered.release_id)
    host.run(remote.mkdirs(d, mode="0700"), sudo=True, timeout=20).check(f"creating {d}")
    write_atomic(host, f"{d}/unit", rendered.unit_text.encode())
    write_atomic(host, f"{d}/env", rendered.env_text.encode(), mode=0o600)
    meta = {**rendered.manifest(), "status": status, "created_at": utc_now(), "by": operator()}
    old = load_meta(host, layout, rendered.release_id)
    if old:
        meta["created_at"] = old.get("created_at", meta["created_at"])
    write_atomic(host, f"{d}/meta.json", json.dumps(meta, indent=1).encode())


def load_meta(host: Host, layout: Layout, release_id: str) -> dict[str, Any] | None:
    raw = read_text(host, f"{layout.release_dir(release_id)}/meta.json")
    if not raw:
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return None


def set_status(host: Host, layout: Layout, release_id: str, status: str) -> None:
    meta = load_meta(host, layout, release_id) or {"release_id": release_id}
    meta["status"] = status
    meta[f"{status}_at"] = utc_now()
    write_atomic(host, f"{layout.release_dir(release_id)}/meta.json", json.dumps(meta, indent=1).encode())


def release_files(host: Host, layout: Layout, release_id: str) -> tuple[str, str] | None:
    d = layout.release_dir(release_id)
    unit, env = host.get(f"{d}/unit"), host.get(f"{d}/env")
    if unit is None or env is None:
        return None
    return unit.decode(), env.decode()


def mark(host: Host, path: str, release_id: str) -> None:
    write_atomic(host, path, (release_id + "\n").encode())


def audit(host: Host, layout: Layout, message: str) -> None:
    host.run(remote.append_line(layout.audit, f"{utc_now()} {operator()} {message}"), sudo=True, timeout=20)


# ------------------------------------------------------------------ pending (interrupted deploys)


def write_pending(host: Host, layout: Layout, *, release_id: str, previous: str | None, action: str) -> None:
    doc = {"release_id": release_id, "previous": previous, "action": action, "by": operator(),
           "pid": os.getpid(), "started_at": utc_now()}
    write_atomic(host, layout.pending, json.dumps(doc).encode())


def read_pending(host: Host, layout: Layout) -> dict[str, Any] | None:
    raw = read_text(host, layout.pending)
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return {"release_id": None, "corrupt": raw[:200]}


def clear_pending(host: Host, layout: Layout) -> None:
    host.run(remote.remove(layout.pending), sudo=True, timeout=20)


# ------------------------------------------------------------------ history


@dataclass(frozen=True)
class ReleaseInfo:
    release_id: str
    mode: str
    status: str
    created_at: str
    by: str
    known_good: bool
    current: bool


def history(host: Host, layout: Layout) -> tuple[list[ReleaseInfo], dict[str, Any] | None, list[str]]:
    """Releases (newest first), the pending record if any, and the audit log's tail."""
    script = ('cd "$1" 2>/dev/null || exit 0; for d in releases/*/; do [ -f "$d/meta.json" ] && '
              '{ cat "$d/meta.json"; printf "\\n\\036\\n"; }; done; printf "\\035%s\\035%s\\035" '
              '"$(cat known-good 2>/dev/null)" "$(cat current 2>/dev/null)"; tail -n 50 audit.log 2>/dev/null')
    res = host.run(["sh", "-c", script, "sh", layout.root], sudo=True, timeout=30)
    metas_part, _, rest = res.stdout.partition("\035")
    kg, _, rest = rest.partition("\035")
    cur, _, audit_tail = rest.partition("\035")
    out = []
    for chunk in metas_part.split("\036"):
        chunk = chunk.strip()
        if not chunk:
            continue
        try:
            m = json.loads(chunk)
        except json.JSONDecodeError:
            continue
        rid = m.get("release_id", "?")
        out.append(ReleaseInfo(rid, m.get("mode", "?"), m.get("status", "?"), m.get("created_at", ""),
                               m.get("by", ""), rid == kg.strip(), rid == cur.strip()))
    out.sort(key=lambda r: r.created_at, reverse=True)
    return out, read_pending(host, layout), [ln for ln in audit_tail.splitlines() if ln.strip()]


def prune(host: Host, layout: Layout, keep: int) -> list[str]:
    """Drop the oldest releases beyond `keep`, never the known-good, current or pending one."""
    releases, pending, _ = history(host, layout)
    protected = {r.release_id for r in releases if r.known_good or r.current}
    if pending and pending.get("release_id"):
        protected.add(pending["release_id"])
    removed = []
    for r in releases[keep:]:
        if r.release_id not in protected:
            host.run(remote.remove_tree(layout.release_dir(r.release_id)), sudo=True, timeout=30)
            removed.append(r.release_id)
    return removed
