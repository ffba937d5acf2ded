"""Releases kept on the host, Capistrano-style, next to the service they describe.

    <state_dir>/<unit>/releases/<release_id>/{unit,env,meta.json}
    <state_dir>/<unit>/known-good     release id the gate last passed (the rollback target)
    <state_dir>/<unit>/current        release id installed now
    <state_dir>/<unit>/pending.json   written BEFORE the unit is touched, removed when the deploy
                                      ends either way: if it is still there, a deploy was cut off
    <state_dir>/<unit>/audit.log      one line per change

Every file is written beside its target and renamed over it, so a full disk or a dropped
connection leaves the old file, never half of a new one. Changes travel as a `Change` (one
script, one SSH round trip, applied in order, stopping at the first failure) because round
trips, not bytes, are what a deploy's own overhead is made of.
"""

from __future__ import annotations

import base64
import getpass
import json
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from ddtree_ops.host import Host
from ddtree_ops.observe import read_files
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


# ------------------------------------------------------------------ changes in one round trip

# Records on stdin, one per line, fields base64 so paths and contents need no quoting:
#   D <path>              mkdir -p (0700)
#   W <path> <mode>       then one line of base64 content: written beside, chmod, renamed over
#   R <path>              rm -rf
#   A <path>              then one line of base64 text: appended as one line (one write(2))
APPLY = r'''
set -u
b64() { printf '%s' "$1" | base64 -d; }
while read -r op a b; do
  p=$(b64 "$a") || { echo "ddtree-ops: corrupt change record" >&2; exit 3; }
  case "$op" in
    D) mkdir -p -m 0700 -- "$p" || exit 1 ;;
    W) IFS= read -r data; t="$p.ddtree-new"
       if ! b64 "$data" > "$t" || ! chmod "$b" -- "$t" || ! mv -f -T -- "$t" "$p"; then
         rm -f -- "$t"; echo "ddtree-ops: cannot write $p" >&2; exit 1
       fi ;;
    R) rm -rf -- "$p" ;;
    A) IFS= read -r data; printf '%s\n' "$(b64 "$data")" >> "$p" || exit 1 ;;
    *) echo "ddtree-ops: unknown change record $op" >&2; exit 3 ;;
  esac
done
'''


def _b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


@dataclass
class Change:
    """An ordered list of state changes, applied by one script in one round trip."""

    lines: list[str] = field(default_factory=list)

    def mkdir(self, path: str) -> Change:
        self.lines.append(f"D {_b64(path)}")
        return self

    def write(self, path: str, data: bytes | str, mode: int = 0o644) -> Change:
        self.lines += [f"W {_b64(path)} {mode:o}", _b64(data)]
        return self

    def remove(self, path: str) -> Change:
        self.lines.append(f"R {_b64(path)}")
        return self

    def append(self, path: str, line: str) -> Change:
        self.lines += [f"A {_b64(path)}", _b64(line)]
        return self

    def audit(self, layout: Layout, message: str) -> Change:
        return self.append(layout.audit, f"{utc_now()} {operator()} {message}")

    def mark(self, path: str, release_id: str) -> Change:
        return self.write(path, release_id + "\n")


def apply(host: Host, change: Change, *, what: str) -> None:
    if not change.lines:
        return
    res = host.run(["sh", "-c", APPLY], stdin=("\n".join(change.lines) + "\n").encode(), sudo=True, timeout=60)
    res.check(what)


def write_atomic(host: Host, path: str, data: bytes, *, mode: int = 0o644) -> None:
    apply(host, Change().write(path, data, mode), what=f"writing {path}")


# ------------------------------------------------------------------ reading state


@dataclass(frozen=True)
class State:
    known_good: str | None
    current: str | None
    pending: dict[str, Any] | None


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", "replace").strip() or None


def parse_pending(data: bytes | None) -> dict[str, Any] | None:
    if data is None:
        return None
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {"release_id": None, "corrupt": data[:200].decode("utf-8", "replace")}
    return doc if isinstance(doc, dict) else {"release_id": None}


def read_state(host: Host, layout: Layout) -> State:
    files = read_files(host, [layout.known_good, layout.current, layout.pending])
    return State(_text(files[layout.known_good]), _text(files[layout.current]), parse_pending(files[layout.pending]))


def read_text(host: Host, path: str) -> str | None:
    return _text(read_files(host, [path])[path])


def read_pending(host: Host, layout: Layout) -> dict[str, Any] | None:
    return parse_pending(read_files(host, [layout.pending])[layout.pending])


@dataclass(frozen=True)
class StoredRelease:
    release_id: str
    unit: str
    env: str
    meta: dict[str, Any]


def load_release(host: Host, layout: Layout, release_id: str) -> StoredRelease | None:
    d = layout.release_dir(release_id)
    files = read_files(host, [f"{d}/unit", f"{d}/env", f"{d}/meta.json"])
    unit, env = files[f"{d}/unit"], files[f"{d}/env"]
    if unit is None or env is None:
        return None
    try:
        meta = json.loads(files[f"{d}/meta.json"] or b"{}")
    except json.JSONDecodeError:
        meta = {}
    return StoredRelease(release_id, unit.decode(), env.decode(), meta if isinstance(meta, dict) else {})


# ------------------------------------------------------------------ what a deploy records


def meta_for(rendered: Rendered, status: str) -> dict[str, Any]:
    return {**rendered.manifest(), "status": status, "created_at": utc_now(), "by": operator()}


def record_release(change: Change, layout: Layout, rid: str, unit: str, env: str, meta: dict[str, Any]) -> Change:
    d = layout.release_dir(rid)
    return (change.mkdir(d).write(f"{d}/unit", unit).write(f"{d}/env", env, 0o600)
            .write(f"{d}/meta.json", json.dumps(meta, indent=1)))


def set_status(change: Change, layout: Layout, release: StoredRelease | dict[str, Any], status: str) -> Change:
    meta = dict(release.meta if isinstance(release, StoredRelease) else release)
    meta["status"] = status
    meta[f"{status}_at"] = utc_now()
    return change.write(f"{layout.release_dir(meta['release_id'])}/meta.json", json.dumps(meta, indent=1))


def pending_doc(release_id: str, previous: str | None, action: str) -> str:
    return json.dumps({"release_id": release_id, "previous": previous, "action": action, "by": operator(),
                       "pid": os.getpid(), "started_at": utc_now()})


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
    """Releases (newest first), the pending record if any, and the audit log's tail: one round trip."""
    script = ('cd "$1" 2>/dev/null || exit 0; for d in releases/*/; do [ -f "$d/meta.json" ] && '
              '{ cat "$d/meta.json"; printf "\\n\\036\\n"; }; done; printf "\\035%s\\035%s\\035" '
              '"$(cat known-good 2>/dev/null)" "$(cat current 2>/dev/null)"; '
              'cat pending.json 2>/dev/null; printf "\\035"; tail -n 50 audit.log 2>/dev/null')
    res = host.run(["sh", "-c", script, "sh", layout.root], sudo=True, timeout=30)
    metas_part, _, rest = res.stdout.partition("\035")
    kg, _, rest = rest.partition("\035")
    cur, _, rest = rest.partition("\035")
    pending_raw, _, audit_tail = rest.partition("\035")
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
    pending = parse_pending(pending_raw.encode()) if pending_raw.strip() else None
    return out, pending, [ln for ln in audit_tail.splitlines() if ln.strip()]


def prune(host: Host, layout: Layout, keep: int) -> list[str]:
    """Drop the oldest releases beyond `keep`, never the known-good, current or pending one."""
    releases, pending, _ = history(host, layout)
    protected = {r.release_id for r in releases if r.known_good or r.current}
    if pending and pending.get("release_id"):
        protected.add(pending["release_id"])
    removed = [r.release_id for r in releases[keep:] if r.release_id not in protected]
    change = Change()
    for rid in removed:
        change.remove(layout.release_dir(rid))
    apply(host, change, what="pruning old releases")
    return removed
