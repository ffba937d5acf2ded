"""A multi-node service and what each of its nodes runs: the `Service` (its nodes' profiles in rank
order), the node states read side by side, the rank that failed first (pure), the service's smoke
result (pure) and its history merged across nodes. The transaction that changes the nodes is
`service.py`; the preflight across them is `service_preflight.py`.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence, TypeVar

from ddtree_ops import gate as gating
from ddtree_ops import releases
from ddtree_ops.config.inventory import Inventory
from ddtree_ops.errors import OpsError
from ddtree_ops.host import Host, HostError
from ddtree_ops.observe import unit_state
from ddtree_ops.profile import Profile
from ddtree_ops.releases import Layout
from ddtree_ops.smoke.judge import Check as SmokeCheck
from ddtree_ops.smoke.judge import HostResult, worst
from ddtree_ops.status import NagiosExit
from ddtree_ops.transaction import health_status

T = TypeVar("T")
# findings that are usually the echo of another rank's failure: NCCL errors, collective and store
# timeouts (the catalogue's `downstream` role); a rank with any other evidence failed before them
SYMPTOM_ROLES = ("downstream",)
_RANK_PREFIX = re.compile(r"^\[[^\]]*? ((?:DP\d+ )?(?:PP\d+ )?TP\d+(?: EP\d+)?)\]")


@dataclass
class Service:
    name: str
    nodes: list[Profile]  # rank order

    @classmethod
    def load(cls, inv: Inventory, name: str, overrides: Sequence[str] = ()) -> Service:
        return cls(name, inv.service_profiles(name, overrides))

    @property
    def hosts(self) -> list[str]:
        return [p.name for p in self.nodes]

    @property
    def rank0(self) -> Profile:
        return self.nodes[0]

    @property
    def unit(self) -> str:
        return self.rank0.service.unit

    def layout(self, i: int) -> Layout:
        p = self.nodes[i]
        return Layout.for_service(p.service.state_dir, p.service.unit)

    def describe(self) -> str:
        return f"{self.name} ({len(self.nodes)} nodes: {', '.join(f'{h} rank {i}' for i, h in enumerate(self.hosts))})"


def each(items: Sequence[T], fn: Callable[[int, T], Any]) -> list[Any]:
    """fn(i, item) for every node side by side, results in rank order; the first error is raised
    after every call has finished (no node is left half done by another's failure)."""
    if len(items) <= 1:
        return [fn(i, x) for i, x in enumerate(items)]
    with ThreadPoolExecutor(max_workers=len(items), thread_name_prefix="node") as pool:
        futures = [pool.submit(fn, i, x) for i, x in enumerate(items)]
        errors = [f.exception() for f in futures]
        for exc in errors:
            if exc is not None:
                raise exc
        return [f.result() for f in futures]


# --------------------------------------------------------------------------- the first failing rank (pure)


@dataclass(frozen=True)
class NodeFailure:
    node: str
    rank: int
    when: float  # a time common to every node (journal timestamps, or seconds into the gate)
    finding: Any = None  # diagnose.classify.Finding, None when only the unit state says it failed
    detail: str = ""
    tp_rank: str = ""  # the rank's own log prefix on the evidence line (TP1), when it has one

    @property
    def symptom(self) -> bool:
        return self.finding is not None and self.finding.role in SYMPTOM_ROLES

    def describe(self) -> str:
        what = (f"{self.finding.label}: {self.finding.text.strip()[:200]}" if self.finding is not None
                else self.detail)
        tp = f", {self.tp_rank}" if self.tp_rank else ""
        return f"node rank {self.rank} ({self.node}{tp}) failed first: {what}"

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "rank": self.rank, "tp_rank": self.tp_rank or None, "symptom": self.symptom,
                "label": self.finding.label if self.finding is not None else None,
                "evidence": self.finding.text.strip()[:300] if self.finding is not None else self.detail}


def first_failed(failures: Sequence[NodeFailure]) -> NodeFailure | None:
    """The rank that failed first. NCCL errors, collective timeouts and store timeouts are what the
    OTHER ranks say once one is gone, so a rank with any other evidence (its own exception, a unit
    killed without a word) comes before every rank that only has those; among equals, the earliest."""
    if not failures:
        return None
    causes = [f for f in failures if not f.symptom]
    return min(causes or list(failures), key=lambda f: (f.when, f.rank))


def tp_rank_of(line: str) -> str:
    m = _RANK_PREFIX.match(line.strip())
    return m.group(1) if m else ""


def rank_before(messages: Sequence[str], index: int, back: int = 200) -> str:
    """The rank of the log record that holds line `index`: a traceback's lines carry no prefix, the
    record's first line does (`[... TP1] Scheduler hit an exception: Traceback ...`)."""
    for i in range(min(index, len(messages) - 1), max(-1, index - back), -1):
        rank = tp_rank_of(messages[i])
        if rank:
            return rank
    return ""


def gate_failures(result: gating.ServiceGateResult) -> list[NodeFailure]:
    """Each node that failed the gate, timed by when the gate saw it."""
    out = []
    for i, st in enumerate(result.states):
        if st.status is not gating.Status.FAIL:
            continue
        finding = st.fatal or st.scanner.report().root_cause
        messages = [ln.message for ln in st.lines]
        at = next((k for k, ln in enumerate(st.lines) if ln is st.fatal_line), len(messages) - 1)
        out.append(NodeFailure(result.names[i], i, st.failed_at if st.failed_at is not None else result.elapsed_s,
                               finding, st.reason, rank_before(messages, at) if st.fatal_line is not None else ""))
    return out


def diagnosis_failures(names: Sequence[str], diags: Sequence[Any]) -> list[NodeFailure]:
    """Each node's failure as its journal tells it (diagnose.live.LiveDiagnosis per node, rank
    order), timed by the journal's own clock: the start running now when it failed, else the start
    before it (a service rolled back after a failed deploy still names that deploy's first failure)."""
    out = []
    for rank, (name, d) in enumerate(zip(names, diags)):
        if d is None:
            continue
        report, inv = d.current, d.current_invocation
        if report.root_cause is None and d.previous and d.previous[-1].report.root_cause is not None:
            report, inv = d.previous[-1].report, d.previous[-1].invocation
        rc = report.root_cause
        if rc is None:
            if d.unit.failed:
                out.append(NodeFailure(name, rank, float("inf"), None,
                                       f"unit failed (Result={d.unit.result}) without a line naming the cause"))
            continue
        when = d.when_us(inv, rc.line)
        out.append(NodeFailure(name, rank, when / 1e6 if when else float("inf"), rc, "", rank_before([m for _, m in d.line_us.get(inv, [])], rc.line - 1)))
    return out


# --------------------------------------------------------------------------- state of every node


@dataclass
class NodeState:
    node: str
    rank: int
    current: str | None = None
    known_good: str | None = None
    pending: dict[str, Any] | None = None
    unit: str = "unknown"
    healthy: bool | None = None
    error: str = ""

    def describe(self) -> str:
        if self.error:
            return f"{self.node} (rank {self.rank}): unreachable ({self.error})"
        pend = f", PENDING {self.pending.get('action')} of {self.pending.get('release_id')}" if self.pending else ""
        health = {True: "healthy", False: "NOT healthy", None: "health unknown"}[self.healthy]
        return (f"{self.node} (rank {self.rank}): release {self.current or '-'} (known-good "
                f"{self.known_good or '-'}), unit {self.unit}, {health}{pend}")

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def read_node_states(hosts: Sequence[Host], svc: Service) -> list[NodeState]:
    def one(i: int, h: Host) -> NodeState:
        st = NodeState(svc.hosts[i], i)
        try:
            s = releases.read_state(h, svc.layout(i))
            kg = s.target(svc.nodes[i])
            st.current, st.known_good, st.pending = s.current, kg.release_id if kg else None, s.pending
            u = unit_state(h, svc.unit)
            st.unit = u.describe()
            # rank 0 serves the API; the others answer SGLang's own health check on the same port
            # once their ranks are ready (launch_dummy_health_check_server)
            st.healthy = u.running and health_status(h, svc.nodes[i]) == 200
        except (HostError, OpsError) as exc:
            st.error = str(exc)
        return st

    return each(list(hosts), one)


def consistent(states: Sequence[NodeState]) -> bool:
    """Every node on one release, none with an unfinished change, every one healthy."""
    ids = {s.current for s in states}
    return len(ids) == 1 and None not in ids and not any(s.pending or s.error or not s.healthy for s in states)


# --------------------------------------------------------------------------- smoke


def smoke_service(name: str, rank0: HostResult, nodes: Sequence[NodeState]) -> HostResult:
    """One monitoring result for the service (pure): rank 0's smoke checks (it serves the API),
    then one check per node's unit. A node whose unit is not running, or that is not on the
    service's release, makes the service CRITICAL: its ranks are gone and rank 0 will soon hang."""
    release = nodes[0].current if nodes else None
    checks = [replace(c, name=f"{rank0.host}.{c.name}") for c in rank0.checks]
    for n in nodes:
        bad = n.error or not n.unit.startswith("active/running") or (n.current != release)
        why = n.error or (f"unit {n.unit}" if not n.unit.startswith("active/running") else f"on {n.current}, rank 0 on {release}")
        checks.append(SmokeCheck(f"node{n.rank}", NagiosExit.CRITICAL if bad else NagiosExit.OK,
                                 f"{n.node}: unit {n.unit}, release {n.current or '-'}",
                                 f"node rank {n.rank} ({n.node}) {why}" if bad else ""))
    state = worst([rank0.state, *[c.state for c in checks if c.state is not None]])
    perf = tuple(replace(pd, label=pd.label.replace(f"{rank0.host}_", f"{name}_", 1)) for pd in rank0.perfdata)
    return HostResult(name, rank0.mode, state, tuple(checks), perf, rank0.observation)


# --------------------------------------------------------------------------- history


@dataclass(frozen=True)
class ServiceRelease:
    release_id: str
    mode: str
    created_at: str
    by: str
    per_node: dict[str, str]  # node -> "good known-good current", "failed", "-" (not kept there)


def merge_history(names: Sequence[str], per_node: Sequence[tuple[list[releases.ReleaseInfo], Any, list[str]]]
                  ) -> list[ServiceRelease]:
    """One row per release of the service, newest first, with what each node says about it."""
    seen: dict[str, dict[str, Any]] = {}
    for name, (rels, _pending, _audit) in zip(names, per_node):
        for r in rels:
            row = seen.setdefault(r.release_id, {"mode": r.mode, "created_at": r.created_at, "by": r.by, "nodes": {}})
            marks = r.marks()
            row["nodes"][name] = (r.status + (" " + marks if marks else ""))
            row["created_at"] = min(row["created_at"], r.created_at) if row["created_at"] else r.created_at
    out = [ServiceRelease(rid, d["mode"], d["created_at"], d["by"], {n: d["nodes"].get(n, "-") for n in names})
           for rid, d in seen.items()]
    return sorted(out, key=lambda r: r.created_at, reverse=True)


def service_history(hosts: Sequence[Host], svc: Service) -> tuple[list[ServiceRelease], list[tuple[str, Any, list[str]]]]:
    def one(i: int, h: Host) -> tuple[list[releases.ReleaseInfo], Any, list[str]]:
        st = releases.read_state(h, svc.layout(i))
        return releases.release_rows(st, svc.nodes[i]), st.pending, st.audit

    per_node = each(list(hosts), one)
    return merge_history(svc.hosts, per_node), [(n, pn[1], pn[2]) for n, pn in zip(svc.hosts, per_node)]


def connect_all(svc: Service, connect: Callable[[Profile], Any], stack: ExitStack) -> list[Host]:
    """One connection per node, opened side by side, closed with `stack`."""
    conns = each(svc.nodes, lambda _i, p: connect(p))
    return [stack.enter_context(c) for c in conns]
