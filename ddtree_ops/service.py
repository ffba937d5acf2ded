"""Multi-node services: one SGLang service over several hosts, deployed as one transaction.

    service file -> one profile per node, rank order (inventory.py) -> render_service: one release id
    lock every node (rank order) -> an interrupted change on any node: roll every node back first
    preflight every node side by side, then across them: the KV pool from the least free memory of
    every card, one sglang version, rank 0's rendezvous reachable from every other node
                                                     (refuse = nothing changed on any node, exit 3)
    no change on any node and the service healthy -> no-op
    record release + pending and write env + unit on EVERY node (staged: nothing restarts yet)
    stop every node (rank 0 first: its ShutdownReq stops the others' schedulers) -> start rank 0 (it hosts torch's TCPStore at
    --dist-init-addr: rendezvous.py `_create_c10d_store`, start_daemon = rank == 0), then the others
    (their store clients retry until --dist-timeout)
    gate: rank 0's /health_generate, smoke and stay window + every node's unit and journal; a fatal
    line on any node fails the service
        PASS -> known-good on every node        FAIL -> the first failing rank named, every node rolled back

A service's release has one id on every node, so "the nodes of one service are on one release"
is a comparison of ids. A command that cannot restore that says so, names each node's state and
exits 2.
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar

from ddtree_ops import gate as gating
from ddtree_ops import lock, output, releases, remote
from ddtree_ops.deploy import (Outcome, _progress, env_path_of, healthy_now, install_plugin, make_diff, redact_env,
                               refusal, unit_path_of)
from ddtree_ops.errors import OpsError
from ddtree_ops.host import Host, HostError, HttpUnavailable
from ddtree_ops.observe import parse_cursor, parse_systemctl_show, read_files, unit_state
from ddtree_ops.preflight import FAIL, OK, Check, Preflight, plan_memory, run_preflight
from ddtree_ops.releases import Change, Layout, StoredRelease
from ddtree_ops.render import Rendered, render_service
from ddtree_ops.status import DeployExit

if TYPE_CHECKING:
    from ddtree_ops.config.inventory import Inventory
    from ddtree_ops.profile import Profile

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
            st.current, st.known_good, st.pending = s.current, s.known_good, s.pending
            u = unit_state(h, svc.unit)
            st.unit = u.describe()
            # rank 0 serves the API; the others answer SGLang's own health check on the same port
            # once their ranks are ready (launch_dummy_health_check_server)
            st.healthy = u.running and _health(h, svc.nodes[i]) == 200
        except (HostError, OpsError) as exc:
            st.error = str(exc)
        return st

    return each(list(hosts), one)


def _health(h: Host, p: Profile) -> int | None:
    try:
        return h.http("GET", p.service.port, "/health_generate", timeout=min(p.gate.http_timeout_s, 5)).status
    except HttpUnavailable:
        return None


def consistent(states: Sequence[NodeState]) -> bool:
    """Every node on one release, none with an unfinished change, every one healthy."""
    ids = {s.current for s in states}
    return len(ids) == 1 and None not in ids and not any(s.pending or s.error or not s.healthy for s in states)


# --------------------------------------------------------------------------- preflight across nodes


@dataclass
class ServicePreflight:
    nodes: list[Preflight]
    names: list[str]
    service: list[Check] = field(default_factory=list)  # checks across nodes (reported once)

    @property
    def failed(self) -> list[tuple[str, Check]]:
        out = [(self.names[i], c) for i, pf in enumerate(self.nodes) for c in pf.failed]
        return out + [("service", c) for c in self.service if c.status == FAIL]

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "service_checks": [c.__dict__ for c in self.service],
                "nodes": [{"node": n, "rank": i, **pf.to_json()} for i, (n, pf) in enumerate(zip(self.names, self.nodes))]}


def preflight_service(hosts: Sequence[Host], svc: Service, mode: str, rendered: Sequence[Rendered],
                      plugin_version: str) -> ServicePreflight:
    """Every node's own preflight side by side, then the checks that need all of them."""
    pfs = each(list(hosts), lambda i, h: run_preflight(h, svc.nodes[i], mode, rendered[i], svc.layout(i),
                                                        plugin_version))
    spf = ServicePreflight(pfs, svc.hosts)
    _memory_across(spf, svc)
    _same_sglang(spf)
    _rendezvous(spf, hosts, svc)
    return spf


def _memory_across(spf: ServicePreflight, svc: Service) -> None:
    """SGLang sizes every rank's pool from the least free memory of ALL ranks (an all-reduce MIN
    over the world group): a node's own plan becomes the plan of the least free card anywhere."""
    rows = [(n, r) for n, pf in zip(spf.names, spf.nodes) for r in pf.cards]
    if not rows or any(pf.shapes is None for pf in spf.nodes):
        return
    node, least = min(rows, key=lambda x: x[1].free_for_service)
    for i, pf in enumerate(spf.nodes):
        plan_memory(pf, svc.nodes[i], least.free_for_service, len(rows))
    # (when it does not fit, every node's own memory check says so)
    spf.service.append(Check("memory", OK,
                             f"every rank sized from the least free card of the service: {node} card {least.index} "
                             f"({least.free_for_service:,} MiB free for it), {len(rows)} cards on "
                             f"{len(spf.nodes)} nodes", {}))


def _same_sglang(spf: ServicePreflight) -> None:
    versions = {n: pf.sglang_version for n, pf in zip(spf.names, spf.nodes) if pf.sglang_version}
    if len(set(versions.values())) > 1:
        listing = ", ".join(f"{n} {v}" for n, v in versions.items())
        spf.service.append(Check("sglang", FAIL, f"the nodes run different SGLang releases ({listing}): every rank "
                                                 "must run the same one", {}))


def _rendezvous(spf: ServicePreflight, hosts: Sequence[Host], svc: Service) -> None:
    """From every other node, a TCP connection to rank 0's --dist-init-addr: refused is fine
    (nothing listens there yet), a timeout is a firewall dropping the port or no route."""
    m = svc.rank0.multinode
    if m is None:
        return

    def probe(i: int, h: Host) -> tuple[str, str]:
        if i == 0:
            return "", ""
        res = h.run(remote.tcp_probe(svc.nodes[i].service.python, m.dist_init_host, m.dist_init_port), timeout=30)
        return (res.stdout.strip().splitlines() or ["error no answer"])[-1], (res.stderr or "").strip()[-200:]

    for i, (said, err) in enumerate(each(list(hosts), probe)):
        if i == 0:
            continue
        target = f"rank 0's rendezvous {m.dist_init_addr}"
        if said in ("open", "refused"):
            spf.nodes[i].add("rendezvous", OK, f"{target} is reachable from {svc.hosts[i]} "
                                               f"({'a server answers' if said == 'open' else 'nothing listens yet'})")
        else:
            why = "timed out after 3 s: a firewall dropping the port, or no route" if said == "timeout" else said or err
            spf.nodes[i].add("rendezvous", FAIL, f"{svc.hosts[i]} cannot reach {target} ({why}); rank {i} would wait "
                                                 "at the store until --dist-timeout and the service would never start")


# --------------------------------------------------------------------------- the outcome


@dataclass
class ServiceOutcome(Outcome):
    service: str = ""
    node_names: list[str] = field(default_factory=list)
    service_preflight: ServicePreflight | None = None
    nodes: list[NodeState] = field(default_factory=list)
    failure: NodeFailure | None = None
    diffs: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        doc = super().to_json()
        doc.update(service=self.service, host=None, node_names=self.node_names,
                   preflight=None if self.service_preflight is None else self.service_preflight.to_json(),
                   nodes=[n.to_json() for n in self.nodes],
                   first_failed=None if self.failure is None else self.failure.to_json())
        return doc


def _finish_states(out: ServiceOutcome, hosts: Sequence[Host], svc: Service) -> None:
    """The command's last word: every node's state; nodes left apart make the outcome degraded."""
    out.nodes = read_node_states(hosts, svc)
    if out.result in ("ok", "rolled-back", "no-change") and not consistent(out.nodes):
        out.exit_code, out.result = DeployExit.DEGRADED, "degraded"
        out.reason += ("; THE NODES ARE NOT ON ONE HEALTHY RELEASE: "
                       + "; ".join(n.describe() for n in out.nodes))


# --------------------------------------------------------------------------- install, stop, start


def _stage(hosts: Sequence[Host], svc: Service, changes: Sequence[Change]) -> None:
    """Write every node's files (release records, pending, env, unit) and reload systemd; nothing restarts."""
    def one(i: int, h: Host) -> None:
        res = h.run(["sh", "-c", releases.APPLY + remote.stage_unit(svc.unit)[2], "sh", svc.unit],
                    stdin=("\n".join(changes[i].lines) + "\n").encode(), sudo=True, timeout=180)
        res.check(f"{svc.hosts[i]}: staging {svc.unit}")

    each(list(hosts), one)


def _files(change: Change, r_unit_path: str, unit_text: str, env_path: str, env_text: str,
           installed: tuple[bytes | None, bytes | None]) -> Change:
    change.remove(f"{env_path}.ddtree-new").remove(f"{r_unit_path}.ddtree-new")
    if installed[0] != env_text.encode():
        change.mkdir(env_path.rsplit("/", 1)[0]).write(env_path, env_text, 0o600)
    if installed[1] != unit_text.encode():
        change.write(r_unit_path, unit_text, 0o644)
    return change


def _restart_in_order(hosts: Sequence[Host], svc: Service) -> list[gating.NodeStart]:
    """Stop every node, rank 0 first, then start rank 0, whose store the others connect to, then
    the rest. Rank 0 first because SGLang stops a multi-node service from there: nodes other than
    rank 0 do not drain on SIGTERM but wait for rank 0's ShutdownReq broadcast (0.5.23
    entrypoints/engine.py, the node_rank >= 1 SIGTERM handler), so stopping them first would wait
    out TimeoutStopSec on each."""
    for i in range(len(hosts)):
        hosts[i].run(remote.stop_and_wait(svc.unit), sudo=True, timeout=svc.nodes[i].service.timeout_stop_s + 60) \
            .check(f"{svc.hosts[i]}: stopping {svc.unit}")
    starts = []
    for i, h in enumerate(hosts):
        res = h.run(remote.start_scoped(svc.unit), sudo=True, timeout=60)
        res.check(f"{svc.hosts[i]}: starting {svc.unit}")
        starts.append(gating.NodeStart(h, svc.nodes[i], parse_cursor(res.stdout),
                                       parse_systemctl_show(res.stdout).invocation))
    return starts


def _stop_all(hosts: Sequence[Host], svc: Service) -> None:
    for i in range(len(hosts)):
        hosts[i].run(["systemctl", "stop", "--", svc.unit], sudo=True, timeout=svc.nodes[i].service.timeout_stop_s + 60)


# --------------------------------------------------------------------------- rollback of every node


def rollback_nodes(hosts: Sequence[Host], svc: Service, *, why: str,
                   targets: Sequence[str | None] | None = None) -> tuple[bool, str, gating.ServiceGateResult | None]:
    """Every node back to its known-good release (or `targets`), through the service's gate.
    A node without one: the service is stopped on every node (a partial service cannot serve), and
    that is a failure the caller reports as degraded."""
    states = [releases.read_state(h, svc.layout(i)) for i, h in enumerate(hosts)]
    ids = list(targets) if targets is not None else [s.known_good for s in states]
    stored: list[StoredRelease | None] = [releases.load_release(h, svc.layout(i), rid) if rid else None
                                          for i, (h, rid) in enumerate(zip(hosts, ids))]
    missing = [svc.hosts[i] for i, r in enumerate(stored) if r is None]
    if missing:
        _stop_all(hosts, svc)
        for i, h in enumerate(hosts):
            releases.apply(h, Change().audit(svc.layout(i), f"rollback {svc.name} node={svc.hosts[i]} "
                                                             f"result=FAILED 'no known-good release on {', '.join(missing)}'"),
                           what="recording the stop")
        return False, (f"no known-good release kept on {', '.join(missing)}: {svc.unit} is stopped on every node "
                       "(a service with a missing node cannot serve)"), None
    rid = ids[0]
    output.say(f"{svc.name}: rolling every node back to {rid if len(set(ids)) == 1 else ', '.join(map(str, ids))}: "
               f"{output.escape(why)}", style="bold yellow")
    changes = []
    for i, (h, rel, st) in enumerate(zip(hosts, stored, states)):
        assert rel is not None
        env_path = rel.meta.get("env_path") or env_path_of(svc.nodes[i])
        unit_path = rel.meta.get("unit_path") or unit_path_of(svc.nodes[i])
        files = read_files(h, [env_path, unit_path])
        ch = Change().write(svc.layout(i).pending, releases.pending_doc(rel.release_id, st.current, "rollback"))
        ch.audit(svc.layout(i), f"rollback {svc.name} node={svc.hosts[i]} release={rel.release_id} reason={why!r}")
        changes.append(_files(ch, unit_path, rel.unit, env_path, rel.env, (files[env_path], files[unit_path])))
    _stage(hosts, svc, changes)
    starts = _restart_in_order(hosts, svc)
    mode = (stored[0].meta.get("mode") if stored[0] else None) or svc.rank0.known_good_mode
    result = gating.run_service_gate(starts, mode, on_progress=_progress("rollback"))
    for i, (h, rel) in enumerate(zip(hosts, stored)):
        assert rel is not None
        done = Change()
        if result.passed:
            done.mark(svc.layout(i).current, rel.release_id).remove(svc.layout(i).pending).audit(
                svc.layout(i), f"rollback {svc.name} node={svc.hosts[i]} release={rel.release_id} result=healthy")
        else:
            done.audit(svc.layout(i), f"rollback {svc.name} node={svc.hosts[i]} release={rel.release_id} "
                                      f"result=FAILED {result.reason!r}")
        releases.apply(h, done, what="recording the rollback's result")
    return result.passed, result.reason, result


# --------------------------------------------------------------------------- deploy


def deploy_service(hosts: Sequence[Host], svc: Service, mode: str, *, dry_run: bool = False,
                   assume_yes: bool = False, confirm: Callable[[str], bool] | None = None,
                   force_restart: bool = False, lock_wait_s: float = 0,
                   on_plan: Callable[[ServiceOutcome], None] | None = None,
                   stop: Callable[[], bool] | None = None, abort: Callable[[], bool] | None = None) -> ServiceOutcome:
    """One transaction over every node of the service (the module docstring has the order)."""
    t0 = time.monotonic()
    rendered = render_service(svc.nodes, mode)
    rid = rendered[0].release_id
    out = ServiceOutcome(svc.name, mode, rid, DeployExit.REFUSED, "refused", "", service=svc.name,
                         node_names=svc.hosts)

    def finish() -> ServiceOutcome:
        out.timings["total"] = time.monotonic() - t0
        out.round_trips = sum(getattr(h, "round_trips", 0) for h in hosts)
        return out

    from ddtree_ops.wheel import build

    plugin = build() if mode == "ddtree-shadow" else None
    version = plugin.version if plugin else ""

    def plan() -> ServicePreflight:
        spf = preflight_service(hosts, svc, mode, rendered, version)
        out.service_preflight, out.preflight = spf, spf.nodes[0]
        out.diffs = [make_diff(r, pf, set(p.service.secrets)) for r, pf, p in zip(rendered, spf.nodes, svc.nodes)]
        out.diff = "".join(out.diffs)
        if on_plan:
            on_plan(out)
        return spf

    if dry_run:
        spf = plan()
        out.timings["preflight"] = time.monotonic() - t0
        out.exit_code = DeployExit.OK if spf.ok else DeployExit.REFUSED
        out.result = "dry-run" if spf.ok else "refused"
        out.reason = "dry run: nothing changed" if spf.ok else "preflight: " + _refusal(spf)
        out.nodes = read_node_states(hosts, svc)
        return finish()

    with ExitStack() as held:
        for i, h in enumerate(hosts):  # rank order, every deploy the same way: no two wait on each other
            held.enter_context(lock.held(h, svc.layout(i), command=f"deploy {svc.name} --mode {mode}", release=rid,
                                         wait_s=lock_wait_s))
        states = [releases.read_state(h, svc.layout(i)) for i, h in enumerate(hosts)]
        if any(s.pending for s in states):
            pend = [f"{svc.hosts[i]}: {s.pending.get('action')} of {s.pending.get('release_id')}"
                    for i, s in enumerate(states) if s.pending]
            output.warn(f"{svc.name}: an earlier change did not finish ({'; '.join(pend)}); rolling every node back "
                        "to its known-good release first")
            passed, why, _ = rollback_nodes(hosts, svc, why="an interrupted change did not finish")
            if not passed:
                out.exit_code, out.result = DeployExit.DEGRADED, "degraded"
                out.reason = f"an interrupted change could not be rolled back: {why}"
                _finish_states(out, hosts, svc)
                return finish()
            out.events.append("rolled every node back from an interrupted change")
            states = [releases.read_state(h, svc.layout(i)) for i, h in enumerate(hosts)]
        t_pf = time.monotonic()
        spf = plan()
        out.timings["preflight"] = time.monotonic() - t_pf
        if not spf.ok:
            out.reason = "preflight refused the deploy: " + _refusal(spf)
            return finish()
        kgs = [s.known_good for s in states]
        out.known_good = kgs[0]
        same = all(pf.installed_unit == r.unit_text and pf.installed_env == r.env_text and not pf.plugin_needed
                   for pf, r in zip(spf.nodes, rendered))
        if same and not force_restart:
            now = read_node_states(hosts, svc)
            if consistent(now) and now[0].current == rid:
                out.exit_code, out.result = DeployExit.OK, "no-change"
                out.reason = f"no changes: {rid} is installed and healthy on every node"
                out.nodes = now
                return finish()
        why_not = refusal(f"Deploy {rid} to {svc.describe()} and restart {svc.unit} on every node?", "hosts",
                          assume_yes=assume_yes, confirm=confirm, stop=stop)
        if why_not:
            out.reason = why_not
            return finish()
        _transaction(hosts, svc, mode, rendered, spf, plugin, states, out, abort)
        _finish_states(out, hosts, svc)
        return finish()


def _refusal(spf: ServicePreflight) -> str:
    return "; ".join(f"{node}: {c.name}: {c.detail}" for node, c in spf.failed)


def _transaction(hosts: Sequence[Host], svc: Service, mode: str, rendered: Sequence[Rendered],
                 spf: ServicePreflight, plugin: Any, states: Sequence[releases.State], out: ServiceOutcome,
                 abort: Callable[[], bool] | None) -> None:
    rid = rendered[0].release_id
    touched = False
    metas = [releases.meta_for(r, "pending") for r in rendered]
    try:
        for i, (h, pf) in enumerate(zip(hosts, spf.nodes)):
            if plugin is not None and pf.plugin_needed:
                install_plugin(h, svc.nodes[i], plugin)
                out.events.append(f"{svc.hosts[i]}: installed the ddtree plugin {plugin.version}")
        t_install = time.monotonic()
        changes = []
        for i, (r, pf, st) in enumerate(zip(rendered, spf.nodes, states)):
            lay = svc.layout(i)
            ch = releases.record_release(Change(), lay, rid, r.unit_text, r.env_text, metas[i])
            ch.write(lay.pending, releases.pending_doc(rid, st.current, "deploy")).audit(
                lay, f"deploy {svc.name} node={svc.hosts[i]} release={rid} mode={mode} start")
            installed = (pf.installed_env.encode() if pf.installed_env is not None else None,
                         pf.installed_unit.encode() if pf.installed_unit is not None else None)
            changes.append(_files(ch, r.unit_path, r.unit_text, r.env_path, r.env_text, installed))
        touched = True
        _stage(hosts, svc, changes)
        starts = _restart_in_order(hosts, svc)
        out.timings["install"] = time.monotonic() - t_install
        output.say(f"{svc.name}: installed {rid} on {len(hosts)} nodes, started rank 0 ({svc.hosts[0]}) then the "
                   "others; gating")
        result = gating.run_service_gate(starts, mode, on_progress=_progress(mode, abort))
        out.gate = result  # type: ignore[assignment]
        out.timings["gate"] = result.elapsed_s
        if result.passed:
            for i, h in enumerate(hosts):
                lay = svc.layout(i)
                done = releases.set_status(Change(), lay, metas[i], "good")
                done.mark(lay.known_good, rid).mark(lay.current, rid).remove(lay.pending).audit(
                    lay, f"deploy {svc.name} node={svc.hosts[i]} release={rid} result=passed")
                releases.apply(h, done, what="recording the passed deploy")
                releases.prune(h, lay, svc.nodes[i].releases.keep)
            out.exit_code, out.result, out.reason = DeployExit.OK, "ok", result.reason
            out.known_good = rid
            return
        out.failure = first_failed(gate_failures(result))
        first = out.failure.rank if out.failure is not None else (result.failed_rank or 0)
        out.diagnosis = result.states[first].scanner.report().to_json()
        out.diagnosis["first_failed"] = None if out.failure is None else out.failure.to_json()
        out.evidence = [f"{svc.hosts[first]}: {ln.message}" for ln in result.states[first].lines[-25:]]
        out.reason = f"gate failed: {out.failure.describe() if out.failure else result.reason}"
        for i, h in enumerate(hosts):
            releases.apply(h, releases.set_status(Change(), svc.layout(i), metas[i], "failed").audit(
                svc.layout(i), f"deploy {svc.name} node={svc.hosts[i]} release={rid} result=FAILED {result.reason!r}"),
                what="recording the failure")
    except KeyboardInterrupt:
        if not touched:
            raise
        out.reason = "interrupted (Ctrl-C) after the nodes were changed"
        output.warn(f"{svc.name}: interrupted; rolling every node back to its known-good release")
    except HostError as exc:
        out.reason = f"the connection to a node dropped while installing {rid}: {exc}"
        if not all(_reconnect(h) for h in hosts):
            out.exit_code, out.result = DeployExit.DEGRADED, "degraded"
            out.reason += (f". The nodes keep a pending record for {rid}; `ddtree-ops rollback {svc.name}` (or a deploy) "
                           "rolls every node back once they are reachable.")
            return
    except OpsError as exc:
        if not touched:
            raise
        out.reason = f"installing {rid} failed: {exc}"
    t_rb = time.monotonic()
    try:
        passed, why, rb = rollback_nodes(hosts, svc, why=out.reason)
    except (HostError, OpsError) as exc:
        out.exit_code, out.result = DeployExit.DEGRADED, "degraded"
        out.reason += f"; the rollback could not run: {exc}"
        return
    out.rollback_gate = rb  # type: ignore[assignment]
    out.timings["rollback"] = time.monotonic() - t_rb
    if passed:
        out.exit_code, out.result = DeployExit.ROLLED_BACK, "rolled-back"
        out.reason += f"; every node rolled back to {out.known_good}, healthy again"
    else:
        out.exit_code, out.result = DeployExit.DEGRADED, "degraded"
        out.reason += f"; the rollback ALSO FAILED: {why}"


def _reconnect(h: Host) -> bool:
    reconnect = getattr(h, "reconnect", None)
    if reconnect is None:
        return False
    try:
        reconnect()
    except HostError:
        return False
    return True


def rollback_service(hosts: Sequence[Host], svc: Service, *, to: str | None = None,
                     lock_wait_s: float = 0) -> ServiceOutcome:
    """Every node back to its known-good release (or `to`, kept on every node), together."""
    t0 = time.monotonic()
    out = ServiceOutcome(svc.name, svc.rank0.known_good_mode, to or "", DeployExit.REFUSED, "refused", "",
                         service=svc.name, node_names=svc.hosts)
    with ExitStack() as held:
        for i, h in enumerate(hosts):
            held.enter_context(lock.held(h, svc.layout(i), command=f"rollback {svc.name}", release=to,
                                         wait_s=lock_wait_s))
        states = [releases.read_state(h, svc.layout(i)) for i, h in enumerate(hosts)]
        out.known_good = states[0].known_good
        out.release_id = to or states[0].known_good or ""
        pending = [s.pending for s in states if s.pending]
        why = "requested by the operator" if not pending else (
            f"the {pending[0].get('action')} of {pending[0].get('release_id')} did not finish")
        try:
            passed, reason, rb = rollback_nodes(hosts, svc, why=why, targets=[to] * len(hosts) if to else None)
        except HostError as exc:
            out.exit_code, out.result, out.reason = DeployExit.DEGRADED, "degraded", str(exc)
            _finish_states(out, hosts, svc)
            return out
        out.gate = rb  # type: ignore[assignment]
        if passed:
            for i, (h, st) in enumerate(zip(hosts, states)):
                done = Change().mark(svc.layout(i).known_good, out.release_id)
                if st.pending and st.pending.get("release_id") not in (None, out.release_id):
                    failed = releases.load_release(h, svc.layout(i), st.pending["release_id"])
                    if failed is not None:
                        releases.set_status(done, svc.layout(i), failed, "failed")
                releases.apply(h, done, what="recording the rollback")
            out.exit_code, out.result, out.reason = DeployExit.OK, "ok", f"{out.release_id} serving on every node: {reason}"
        else:
            if rb is not None:
                out.failure = first_failed(gate_failures(rb))
            out.exit_code, out.result, out.reason = DeployExit.DEGRADED, "degraded", f"rollback failed: {reason}"
        _finish_states(out, hosts, svc)
    out.timings["total"] = time.monotonic() - t0
    return out


def needs_rollback(hosts: Sequence[Host], svc: Service) -> tuple[bool, str]:
    states = read_node_states(hosts, svc)
    if consistent(states) and all(s.current == s.known_good for s in states):
        return False, f"healthy on known-good {states[0].current} on every node; nothing to do"
    return True, "; ".join(s.describe() for s in states)


# --------------------------------------------------------------------------- smoke


def smoke_service(name: str, rank0: Any, nodes: Sequence[NodeState]) -> Any:
    """One monitoring result for the service (pure): rank 0's smoke checks (it serves the API),
    then one check per node's unit. A node whose unit is not running, or that is not on the
    service's release, makes the service CRITICAL: its ranks are gone and rank 0 will soon hang."""
    from dataclasses import replace as _replace

    from ddtree_ops.smoke.judge import Check as SmokeCheck
    from ddtree_ops.smoke.judge import HostResult, worst
    from ddtree_ops.status import NagiosExit

    release = nodes[0].current if nodes else None
    checks = [_replace(c, name=f"{rank0.host}.{c.name}") for c in rank0.checks]
    for n in nodes:
        bad = n.error or not n.unit.startswith("active/running") or (n.current != release)
        why = n.error or (f"unit {n.unit}" if not n.unit.startswith("active/running") else f"on {n.current}, rank 0 on {release}")
        checks.append(SmokeCheck(f"node{n.rank}", NagiosExit.CRITICAL if bad else NagiosExit.OK,
                                 f"{n.node}: unit {n.unit}, release {n.current or '-'}",
                                 f"node rank {n.rank} ({n.node}) {why}" if bad else ""))
    state = worst([rank0.state, *[c.state for c in checks if c.state is not None]])
    perf = tuple(_replace(pd, label=pd.label.replace(f"{rank0.host}_", f"{name}_", 1)) for pd in rank0.perfdata)
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
            marks = " ".join(m for m, on in (("known-good", r.known_good), ("current", r.current)) if on)
            row["nodes"][name] = (r.status + (" " + marks if marks else ""))
            row["created_at"] = min(row["created_at"], r.created_at) if row["created_at"] else r.created_at
    out = [ServiceRelease(rid, d["mode"], d["created_at"], d["by"], {n: d["nodes"].get(n, "-") for n in names})
           for rid, d in seen.items()]
    return sorted(out, key=lambda r: r.created_at, reverse=True)


def service_history(hosts: Sequence[Host], svc: Service) -> tuple[list[ServiceRelease], list[tuple[str, Any, list[str]]]]:
    per_node = each(list(hosts), lambda i, h: releases.history(h, svc.layout(i)))
    return merge_history(svc.hosts, per_node), [(n, pn[1], pn[2]) for n, pn in zip(svc.hosts, per_node)]


def connect_all(svc: Service, connect: Callable[[Profile], Any], stack: ExitStack) -> list[Host]:
    """One connection per node, opened side by side, closed with `stack`."""
    conns = each(svc.nodes, lambda _i, p: connect(p))
    return [stack.enter_context(c) for c in conns]


__all__ = ["Service", "ServiceOutcome", "deploy_service", "rollback_service", "first_failed", "NodeFailure",
           "merge_history", "service_history", "read_node_states", "consistent", "healthy_now", "redact_env"]
