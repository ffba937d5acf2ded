"""Releases kept on the host, Capistrano-style, next to the service they describe.

    <state_dir>/<unit>/releases/<release_id>/{unit,env,meta.json}
    <state_dir>/<unit>/attempts.jsonl every deploy, rollback, promotion and adoption, appended and
                                      never rewritten (`attempts.py`): what passed, the rollback
                                      target and the history are derived from it
    <state_dir>/<unit>/current        release id installed now (written with the install itself)
    <state_dir>/<unit>/pending.json   written BEFORE the unit is touched, removed when the attempt
                                      ends either way: if it is still there, a run was cut off
    <state_dir>/<unit>/audit.log      one line per step, for people
    <state_dir>/<unit>/known-good     written by versions before attempts; read once to migrate

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

from ddtree_ops import attempts as records
from ddtree_ops.attempts import Attempt, Target
from ddtree_ops.host import Host
from ddtree_ops.observe import read_files
from ddtree_ops.profile import Profile
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
    def known_good(self) -> str:  # the marker of versions before attempts.jsonl: read to migrate only
        return f"{self.root}/known-good"

    @property
    def attempts(self) -> str:
        return f"{self.root}/attempts.jsonl"

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

    @property
    def parser_cache(self) -> str:
        """Where a launch line the host's SGLang parser accepted is remembered: a cache (FHS
        /var/cache: disposable, rebuilt on a miss), outside the state a refusal leaves untouched."""
        return f"/var/cache/ddtree-ops/{self.root.rstrip('/').rsplit('/', 1)[-1]}/parser-ok"


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

    def event(self, layout: Layout, line: str) -> Change:
        """One attempt record (attempts.py), appended to attempts.jsonl."""
        return self.append(layout.attempts, line)


def apply(host: Host, change: Change, *, what: str) -> None:
    if not change.lines:
        return
    res = host.run(["sh", "-c", APPLY], stdin=("\n".join(change.lines) + "\n").encode(), sudo=True, timeout=60)
    res.check(what)


def write_atomic(host: Host, path: str, data: bytes, *, mode: int = 0o644) -> None:
    apply(host, Change().write(path, data, mode), what=f"writing {path}")


# ------------------------------------------------------------------ reading state


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


@dataclass(frozen=True)
class State:
    """Everything ddtree-ops keeps on a host about one service, read in one round trip."""

    current: str | None
    pending: dict[str, Any] | None
    attempts: list[Attempt]
    metas: dict[str, dict[str, Any]]  # release id -> its meta.json (what the release is, never its fate)
    audit: list[str] = field(default_factory=list)
    # attempt lines read from the records of an older ddtree-ops, to write with the next change
    migrated: list[str] = field(default_factory=list)
    unreadable: int = 0  # attempt lines that could not be read

    def target(self, p: Profile) -> Target | None:
        """The rollback target under the profile's policy (rollback.target, known_good_mode)."""
        return records.rollback_target(self.attempts, policy=p.rollback.target, known_good_mode=p.known_good_mode)

    @property
    def passed(self) -> dict[str, Attempt]:
        return records.good_releases(self.attempts)

    def mode_of(self, release_id: str | None) -> str | None:
        if not release_id:
            return None
        meta = self.metas.get(release_id)
        if meta and meta.get("mode"):
            return str(meta["mode"])
        return next((a.mode for a in reversed(self.attempts) if a.release_id == release_id), None)

    @property
    def running(self) -> str | None:
        """The attempt pending.json names: cut off, or still running elsewhere (its lock says which)."""
        return (self.pending or {}).get("attempt")


# one script: every release's meta.json, then current, the old known-good marker, pending.json,
# attempts.jsonl and the audit log's tail, separated by bytes no JSON or log line holds
_READ_STATE = ('cd "$1" 2>/dev/null || exit 0; for d in releases/*/; do [ -f "$d/meta.json" ] && '
               '{ cat "$d/meta.json"; printf "\\n\\036\\n"; }; done; printf "\\035"; cat current 2>/dev/null; '
               'printf "\\035"; cat known-good 2>/dev/null; printf "\\035"; cat pending.json 2>/dev/null; '
               'printf "\\035"; cat attempts.jsonl 2>/dev/null; printf "\\035"; tail -n "$2" audit.log 2>/dev/null')


def read_state(host: Host, layout: Layout, *, audit_lines: int = 50) -> State:
    res = host.run(["sh", "-c", _READ_STATE, "sh", layout.root, str(audit_lines)], sudo=True, timeout=30)
    return parse_state(res.stdout)


def parse_state(text: str) -> State:
    metas_part, cur, kg, pending_raw, attempts_raw, audit = (text.split("\035") + [""] * 6)[:6]
    metas: dict[str, dict[str, Any]] = {}
    for chunk in metas_part.split("\036"):
        try:
            m = json.loads(chunk) if chunk.strip() else None
        except json.JSONDecodeError:
            continue
        if isinstance(m, dict) and m.get("release_id"):
            metas[str(m["release_id"])] = m
    pending = parse_pending(pending_raw.encode()) if pending_raw.strip() else None
    lines = attempts_raw.splitlines()
    migrated: list[str] = []
    if not any(ln.strip() for ln in lines) and metas:
        migrated = records.migrate(list(metas.values()), kg.strip() or None)
        lines = migrated
    attempts, bad = records.fold(lines, running=(pending or {}).get("attempt"))
    return State(cur.strip() or None, pending, attempts, metas, [ln for ln in audit.splitlines() if ln.strip()],
                 migrated, bad)


def read_text(host: Host, path: str) -> str | None:
    return _text(read_files(host, [path])[path])


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


# ------------------------------------------------------------------ what a change records


def meta_for(rendered: Rendered) -> dict[str, Any]:
    """What a release is: its manifest, when it was first made and by whom. Its fate (passed,
    failed) lives in the attempts that installed it, never here."""
    return {**rendered.manifest(), "created_at": utc_now(), "by": operator()}


def record_release(change: Change, layout: Layout, rid: str, unit: str, env: str, meta: dict[str, Any]) -> Change:
    d = layout.release_dir(rid)
    return (change.mkdir(d).write(f"{d}/unit", unit).write(f"{d}/env", env, 0o600)
            .write(f"{d}/meta.json", json.dumps(meta, indent=1)))


def pending_doc(release_id: str, previous: str | None, action: str, attempt: str = "") -> str:
    return json.dumps({"release_id": release_id, "previous": previous, "action": action, "attempt": attempt,
                       "by": operator(), "pid": os.getpid(), "started_at": utc_now()})


@dataclass
class Step:
    """One attempt in progress: its id and what its start and end write (attempts.jsonl, the
    audit log, pending.json), so a deploy, a rollback and a promotion record themselves alike."""

    layout: Layout
    action: str
    release_id: str
    mode: str
    host: str
    previous: str | None = None
    mode_source: str = ""
    cause: str = ""
    id: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or records.new_id(self.action)

    def begin(self, change: Change, *, pending: bool = True) -> Change:
        """The attempt's start (and pending.json, written before the unit is touched)."""
        change.event(self.layout, records.start_event(self.id, self.action, self.release_id, self.mode,
                                                      by=operator(), at=utc_now(), previous=self.previous,
                                                      mode_source=self.mode_source, cause=self.cause))
        if pending:
            change.write(self.layout.pending, pending_doc(self.release_id, self.previous, self.action, self.id))
        why = f" reason={self.cause!r}" if self.cause else ""
        return change.audit(self.layout, f"{self.action} {self.host} release={self.release_id} mode={self.mode} "
                                         f"attempt={self.id} start{why}")

    def end(self, change: Change, outcome: str, cause: str = "") -> Change:
        """The attempt's end; pending.json goes with it (it named this attempt)."""
        change.event(self.layout, records.end_event(self.id, outcome, at=utc_now(), cause=cause))
        change.remove(self.layout.pending)
        word = {records.PASSED: "passed"}.get(outcome, outcome.upper())
        return change.audit(self.layout, f"{self.action} {self.host} release={self.release_id} attempt={self.id} "
                                         f"result={word}" + (f" {cause!r}" if cause else ""))


def end_interrupted(change: Change, layout: Layout, host: str, state: State, why: str) -> Change:
    """The attempt a cut-off run left (pending.json names it) ends `interrupted`, with an audit line.
    Records of older versions name no attempt: only the audit line is written for them."""
    pending = state.pending or {}
    aid = pending.get("attempt")
    if aid:
        change.event(layout, records.end_event(aid, records.INTERRUPTED, at=utc_now(), cause=why))
    return change.audit(layout, f"{pending.get('action', 'change')} {host} release={pending.get('release_id')} "
                                f"attempt={aid or '-'} result=INTERRUPTED {why!r}")


def migrate_records(change: Change, layout: Layout, state: State) -> Change:
    """Write what `parse_state` read from an older version's records, once, with the first change."""
    for line in state.migrated:
        change.event(layout, line)
    return change


# ------------------------------------------------------------------ history


@dataclass(frozen=True)
class ReleaseInfo:
    """A release as its attempts show it: whether it ever served verified, how its last attempt
    ended, and whether it is installed now or is where a rollback goes."""

    release_id: str
    mode: str
    created_at: str
    by: str
    passed: bool  # some attempt that installed it passed (or adopted it)
    last: str  # how the last attempt on it ended: passed, failed, interrupted, running, ...
    attempts: int
    current: bool
    target: bool  # the rollback target under the profile's policy
    kept: bool  # its files are still on the host (pruned releases keep their attempts)

    @property
    def status(self) -> str:
        """One word, the same in text and JSON: `passed` once any attempt passed, else the last outcome."""
        return "passed" if self.passed else self.last

    def marks(self) -> str:
        return " ".join(m for m, on in (("current", self.current), ("rollback-target", self.target)) if on)

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "status": self.status}


def release_rows(state: State, p: Profile) -> list[ReleaseInfo]:
    """Every release the host keeps or an attempt names, newest first."""
    target = state.target(p)
    good = state.passed
    seen: dict[str, list[Attempt]] = {}
    for a in state.attempts:
        seen.setdefault(a.release_id, []).append(a)
    ids = list(dict.fromkeys([*state.metas, *seen]))
    rows = []
    for rid in ids:
        meta, tries = state.metas.get(rid, {}), seen.get(rid, [])
        last = tries[-1] if tries else None
        rows.append(ReleaseInfo(
            rid, str(meta.get("mode") or (last.mode if last else "?")),
            str(meta.get("created_at") or (tries[0].started_at if tries else "")),
            str(meta.get("by") or (tries[0].by if tries else "")), rid in good,
            (last.outcome or "running") if last else "never installed", len(tries), rid == state.current,
            target is not None and rid == target.release_id, rid in state.metas))
    return sorted(rows, key=lambda r: r.created_at, reverse=True)


def prune(host: Host, layout: Layout, keep: int, p: Profile) -> list[str]:
    """Drop the oldest releases beyond `keep`, never the current or pending one, nor a rollback
    target (under either policy, and `previous`). Attempts naming a pruned release stay."""
    state = read_state(host, layout, audit_lines=0)
    protected = {state.current, (state.pending or {}).get("release_id")}
    for t in (state.target(p), records.rollback_target(state.attempts, policy="last-good",
                                                       known_good_mode=p.known_good_mode),
              records.previous_target(state.attempts, state.current)):
        if t is not None:
            protected.add(t.release_id)
    newest_first = sorted(state.metas.values(), key=lambda m: m.get("created_at", ""), reverse=True)
    removed = [str(m["release_id"]) for m in newest_first[keep:] if m["release_id"] not in protected]
    change = Change()
    for rid in removed:
        change.remove(layout.release_dir(rid))
    apply(host, change, what="pruning old releases")
    return removed
