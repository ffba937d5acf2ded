"""Attempts: every deploy, rollback, promotion and adoption on a host, as records never rewritten.

    <state_dir>/<unit>/attempts.jsonl   one JSON object per line, appended (one write(2) each):
        {"event": "start", "attempt": ID, "action": A, "release_id": R, "mode": M, "mode_source": S,
         "by": WHO, "at": WHEN, "previous": R0, "cause": WHY}
        {"event": "end", "attempt": ID, "outcome": O, "cause": WHY, "at": WHEN}

A release id is the hash of what reaches the host, so one release is installed by many attempts;
each attempt is its own record, and what a release *is* (ever passed, the rollback target) is
derived from all of them, never stored in one field that the next attempt overwrites. An attempt's
outcome is its end line (the last one, when a later run resolved it); a start without an end is in
progress while pending.json names it, and interrupted once nothing does.

Outcomes: `passed` (the release passed its gate, and for a promotion its live check), `failed`
(its gate failed: the release never verified), `rolled-back` (it passed its gate and was rolled
back afterwards: a promotion that missed live), `interrupted` (cut off before it ended),
`adopted` (a running unit recorded as the baseline). A refusal changes nothing on the host, so it
is never written here: the command's own output and exit code 3 carry it.

Pure functions over the records; `releases.py` reads and writes them with the other state files.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

PASSED, FAILED, ROLLED_BACK, INTERRUPTED, ADOPTED = "passed", "failed", "rolled-back", "interrupted", "adopted"
OUTCOMES = (PASSED, FAILED, ROLLED_BACK, INTERRUPTED, ADOPTED)
GOOD = (PASSED, ADOPTED)  # a release one of these attempts installed has served verified
# what the operator's commands start; `adopt` and `migrated` only record what was already there
CHANGES = ("deploy", "rollback", "promote", "resume")

POLICIES = ("known-good-mode", "last-good")


def new_id(action: str, now: float | None = None) -> str:
    """Sortable by time, unique per attempt: `20261205T101500Z-deploy-3fa2`."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{action}-{secrets.token_hex(2)}"


@dataclass(frozen=True)
class Attempt:
    id: str
    action: str
    release_id: str
    mode: str
    by: str
    started_at: str
    mode_source: str = ""
    previous: str | None = None
    outcome: str | None = None  # None: still running (pending.json names it) or cut off
    cause: str = ""
    ended_at: str | None = None
    migrated: bool = False

    @property
    def good(self) -> bool:
        return self.outcome in GOOD

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def start_event(attempt_id: str, action: str, release_id: str, mode: str, *, by: str, at: str,
                previous: str | None = None, mode_source: str = "", cause: str = "") -> str:
    return json.dumps({"event": "start", "attempt": attempt_id, "action": action, "release_id": release_id,
                       "mode": mode, "mode_source": mode_source, "by": by, "at": at, "previous": previous,
                       "cause": cause}, sort_keys=True)


def end_event(attempt_id: str, outcome: str, *, at: str, cause: str = "") -> str:
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r}")
    return json.dumps({"event": "end", "attempt": attempt_id, "outcome": outcome, "cause": cause, "at": at},
                      sort_keys=True)


def fold(lines: Iterable[str], *, running: str | None = None) -> tuple[list[Attempt], int]:
    """The attempts in the order they started, and how many lines could not be read (a line cut by a
    full disk, an edit by hand): skipped, never guessed. A start without an end is interrupted
    unless it is `running` (the attempt pending.json names)."""
    order: list[str] = []
    starts: dict[str, dict[str, Any]] = {}
    ends: dict[str, dict[str, Any]] = {}
    bad = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
            aid, kind = ev["attempt"], ev["event"]
        except (json.JSONDecodeError, KeyError, TypeError):
            bad += 1
            continue
        if kind == "start" and aid not in starts:
            starts[aid] = ev
            order.append(aid)
        elif kind == "end" and ev.get("outcome") in OUTCOMES:
            ends[aid] = ev  # the last end wins: a later run that resolved a cut-off attempt
        else:
            bad += 1
    out = []
    for aid in order:
        s, e = starts[aid], ends.get(aid)
        outcome = e["outcome"] if e else (None if aid == running else INTERRUPTED)
        cause = (e or {}).get("cause") or ("" if e or aid == running else "cut off: no end was recorded")
        out.append(Attempt(aid, s.get("action", "?"), s.get("release_id", "?"), s.get("mode", "?"), s.get("by", ""),
                           s.get("at", ""), s.get("mode_source", ""), s.get("previous"), outcome, cause,
                           (e or {}).get("at"), bool(s.get("migrated"))))
    return out, bad


def migrate(metas: Sequence[dict[str, Any]], known_good: str | None) -> list[str]:
    """The records of ddtree-ops before attempts (a mutable `status` in each release's meta.json and a
    `known-good` marker) as attempt lines, oldest first: one attempt per release, its status as the
    outcome. Nothing is lost: the old files stay as they are, and these lines are written with the
    first change that goes ahead (a read or a refusal writes nothing)."""
    lines = []
    for m in sorted(metas, key=lambda m: m.get("created_at", "")):
        rid = m.get("release_id")
        if not rid:
            continue
        status = m.get("status")
        adopted = bool(m.get("adopted"))
        outcome = (ADOPTED if adopted else PASSED) if status == "good" or rid == known_good else \
            FAILED if status == "failed" else INTERRUPTED
        at = m.get("created_at", "")
        aid = f"migrated-{rid}"
        start = json.loads(start_event(aid, "adopt" if adopted else "deploy", rid, m.get("mode", "?"),
                                       by=m.get("by", ""), at=at, cause="migrated from meta.json"))
        lines.append(json.dumps({**start, "migrated": True}, sort_keys=True))
        lines.append(end_event(aid, outcome, at=m.get(f"{status}_at", at) if status else at,
                               cause=f"meta.json said status={status}"
                                     + (", and known-good named it" if rid == known_good else "")))
    return lines


# ------------------------------------------------------------------ what the records say


@dataclass(frozen=True)
class Target:
    """Where a rollback goes, and why there."""

    release_id: str
    mode: str
    policy: str
    why: str

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def good_releases(attempts: Sequence[Attempt]) -> dict[str, Attempt]:
    """Each release that ever served verified, with the last attempt that showed it."""
    out: dict[str, Attempt] = {}
    for a in attempts:
        if a.good:
            out.pop(a.release_id, None)
            out[a.release_id] = a  # insertion order = order of the last good attempt
    return out


def rollback_target(attempts: Sequence[Attempt], *, policy: str, known_good_mode: str) -> Target | None:
    """`known-good-mode` (the default): the last release of `known_good_mode` (NEXTN) that passed,
    whatever passed since; `last-good`: the last release of any mode that passed. With no release of
    `known_good_mode` ever passed, the last good one of any mode, and the reason says so: returning
    to something verified beats returning to nothing."""
    good = list(good_releases(attempts).values())
    if not good:
        return None
    if policy == "known-good-mode":
        same = [a for a in good if a.mode == known_good_mode]
        if same:
            return Target(same[-1].release_id, same[-1].mode, policy,
                          f"the last {known_good_mode} release that passed (rollback.target: known-good-mode)")
        last = good[-1]
        return Target(last.release_id, last.mode, policy,
                      f"no {known_good_mode} release has passed on this host; the last release that passed")
    last = good[-1]
    return Target(last.release_id, last.mode, policy, "the last release that passed (rollback.target: last-good)")


def previous_target(attempts: Sequence[Attempt], current: str | None) -> Target | None:
    """`rollback --to previous`: the last release that passed before the one installed now."""
    good = [a for a in good_releases(attempts).values() if a.release_id != current]
    if not good:
        return None
    return Target(good[-1].release_id, good[-1].mode, "previous", "the last release that passed before the current one")


def last_change(attempts: Sequence[Attempt]) -> Attempt | None:
    """The operator's last change (deploy, rollback, promotion, resume), adoption and migration aside."""
    return next((a for a in reversed(attempts) if a.action in CHANGES), None)
