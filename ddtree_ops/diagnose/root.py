"""The root cause among a log's findings, chosen the way an engineer reads a log.

Per event (a traceback, or a line outside any traceback) the most specific finding stands for it;
then the first cause in time, where a wrapper yields to the cause inside it, an NCCL/watchdog echo
yields to an earlier unexplained crash, and secondary symptoms explain the failure only when
nothing else does.
"""

from __future__ import annotations

from typing import Any

from ddtree_ops.diagnose.findings import Finding

# inside one traceback: the specific cause first, then a wrapper, a death (the EOFError a dead
# child leaves in its parent's pipe is the death's symptom), the backstop, a consequence
ROLE_IN_GROUP = {"cause": 0, "downstream": 0, "wrapper": 1, "death": 1.5, "backstop": 2, "consequence": 3}
# across events: causes (0) before unexplained deaths and crashes (1, the first in time) before
# secondary symptoms (2)
ROLE_CLASS = {"cause": 0, "downstream": 0, "wrapper": 0, "death": 1, "backstop": 1, "consequence": 2}


VERDICTS = ("healthy", "degraded", "failed", "inconclusive")


def verdict_of(root: Finding | None, findings: list[Finding], serving: bool) -> str:
    """The verdict of what was read: a root cause fails it; otherwise it needs positive evidence
    that the server served (a ready milestone, decode batches, served requests; for a live host
    also its health endpoint) to be healthy, or degraded with warnings. Without that evidence it is
    inconclusive, warnings or not: a fragment that ends before a server started is not a healthy
    server (issue 31: two such failure logs were called healthy)."""
    if root is not None:
        return "failed"
    if not serving:
        return "inconclusive"
    return "degraded" if any(f.severity == "warning" for f in findings) else "healthy"


def choose_root(findings: list[Finding], group_starts: dict[int, int] | None = None,
                defer: dict[str, int] | None = None) -> Finding | None:
    """The first fatal event in time, read the way an engineer reads a log.

    Per event (a traceback, or a line outside any traceback) the most specific finding stands
    for it. Then: the first event with a cause; a wrapper yields to a cause inside it or within
    its `defer_within` lines; an NCCL/watchdog echo yields to an earlier unexplained crash or
    death; without a cause, the first unexplained crash or death in time (a process killed by a
    signal, then its launcher's traceback: the kill); secondary symptoms explain the failure
    only when nothing else does.
    """
    fatal = [f for f in findings if f.severity == "fatal"]
    if not fatal:
        return None
    starts = group_starts or {}
    reps: dict[Any, Finding] = {}
    first_line: dict[Any, int] = {}
    for f in fatal:
        key = ("g", f.group) if f.group is not None else ("l", f.line)
        first_line[key] = min(first_line.get(key, f.line), starts.get(f.group, f.line) if f.group else f.line)
        cur = reps.get(key)
        if cur is None or (ROLE_IN_GROUP.get(f.role, 4), f.line) < (ROLE_IN_GROUP.get(cur.role, 4), cur.line):
            reps[key] = f
    events = sorted(reps.items(), key=lambda kv: (first_line[kv[0]], kv[1].line))
    causes = [(k, f) for k, f in events if ROLE_CLASS.get(f.role) == 0]
    backstops = [(k, f) for k, f in events if ROLE_CLASS.get(f.role) == 1]
    root: Finding | None = None
    if causes:
        key, root = causes[0]
        if root.role == "downstream":
            earlier = [f for k, f in backstops if first_line[k] < first_line[key]]
            if earlier:
                return earlier[0]
    elif backstops:
        root = backstops[0][1]
    else:
        root = events[0][1]
    return _deferred(root, fatal, (defer or {}).get(root.rule_id, 0))


def _deferred(root: Finding, fatal: list[Finding], window: int) -> Finding:
    """A wrapper or banner yields to the cause it announces (same traceback or the next lines);
    an echo whose message names its own cause a few lines on (NCCL's "Last error:") yields to it."""
    if root.role not in ("wrapper", "consequence", "downstream"):
        return root
    wanted = ("cause",) if root.role == "downstream" else ("cause", "downstream")
    for f in fatal:
        if f.line < root.line or f is root or f.role not in wanted:
            continue
        same_group = root.group is not None and f.group == root.group
        if same_group or (window and f.line - root.line <= window):
            return f
    return root

