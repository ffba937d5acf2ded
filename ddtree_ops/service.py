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
exits 2. The service and its nodes' states are `service_nodes.py`, the preflight across nodes
`service_preflight.py`; what this shares with a single host's transaction is `transaction.py`.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ddtree_ops import attempts as records
from ddtree_ops import gate as gating
from ddtree_ops import lock, output, releases, remote
from ddtree_ops.errors import OpsError
from ddtree_ops.host import Host, HostError
from ddtree_ops.observe import parse_cursor, parse_systemctl_show, read_files
from ddtree_ops.profile import PLUGIN_MODES
from ddtree_ops.releases import Change, Step, StoredRelease
from ddtree_ops.render import Rendered, render_service
from ddtree_ops.service_nodes import (NodeFailure, NodeState, Service, consistent, each, first_failed, gate_failures,
                                      read_node_states)
from ddtree_ops.service_preflight import ServicePreflight, preflight_service
from ddtree_ops.status import DeployExit
from ddtree_ops.transaction import (Outcome, degrade, env_path_of, gate_progress, install_plugin, make_diff, reconnect,
                                    refusal, settle_rollback, stage_files, unit_path_of)
from ddtree_ops.wheel import build


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


def restart_in_order(hosts: Sequence[Host], svc: Service) -> list[gating.NodeStart]:
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
    """Every node back to its rollback target (or `targets`), through the service's gate, as a
    rollback attempt on each node; an unfinished change a node's pending.json names ends
    `interrupted` first. A node without a target: the service is stopped on every node (a partial
    service cannot serve), and that is a failure the caller reports as degraded."""
    states = [releases.read_state(h, svc.layout(i)) for i, h in enumerate(hosts)]
    ids = list(targets) if targets is not None else [
        (t.release_id if (t := s.target(svc.nodes[i])) else None) for i, s in enumerate(states)]
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
    changes, steps = [], []
    for i, (h, rel, st) in enumerate(zip(hosts, stored, states)):
        assert rel is not None
        env_path = rel.meta.get("env_path") or env_path_of(svc.nodes[i])
        unit_path = rel.meta.get("unit_path") or unit_path_of(svc.nodes[i])
        files = read_files(h, [env_path, unit_path])
        ch = releases.migrate_records(Change(), svc.layout(i), st)
        if st.pending:
            releases.end_interrupted(ch, svc.layout(i), svc.hosts[i], st, why)
        step = Step(svc.layout(i), "rollback", rel.release_id, rel.meta.get("mode", "?"), svc.hosts[i],
                    previous=st.current, cause=why)
        steps.append(step)
        step.begin(ch)
        stage_files(ch, unit_path, rel.unit, env_path, rel.env, (files[env_path], files[unit_path]))
        changes.append(ch.mark(svc.layout(i).current, rel.release_id))
    _stage(hosts, svc, changes)
    starts = restart_in_order(hosts, svc)
    mode = (stored[0].meta.get("mode") if stored[0] else None) or svc.rank0.known_good_mode
    result = gating.run_service_gate(starts, mode, on_progress=gate_progress("rollback"))
    for h, step in zip(hosts, steps):
        done = step.end(Change(), records.PASSED if result.passed else records.FAILED,
                        "" if result.passed else result.reason)
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

    plugin = build() if mode in PLUGIN_MODES else None
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
        kg = states[0].target(svc.rank0)
        out.known_good = kg.release_id if kg else None
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
    steps = [Step(svc.layout(i), "deploy", rid, mode, svc.hosts[i], previous=st.current)
             for i, st in enumerate(states)]
    try:
        for i, (h, pf) in enumerate(zip(hosts, spf.nodes)):
            if plugin is not None and pf.plugin_needed:
                install_plugin(h, svc.nodes[i], plugin)
                out.events.append(f"{svc.hosts[i]}: installed the ddtree plugin {plugin.version}")
        t_install = time.monotonic()
        changes = []
        for i, (r, pf, st) in enumerate(zip(rendered, spf.nodes, states)):
            lay = svc.layout(i)
            ch = releases.migrate_records(Change(), lay, st)
            if rid not in st.metas:
                releases.record_release(ch, lay, rid, r.unit_text, r.env_text, releases.meta_for(r))
            steps[i].begin(ch)
            installed = (pf.installed_env.encode() if pf.installed_env is not None else None,
                         pf.installed_unit.encode() if pf.installed_unit is not None else None)
            stage_files(ch, r.unit_path, r.unit_text, r.env_path, r.env_text, installed)
            changes.append(ch.mark(lay.current, rid))
        touched = True
        _stage(hosts, svc, changes)
        starts = restart_in_order(hosts, svc)
        out.timings["install"] = time.monotonic() - t_install
        output.say(f"{svc.name}: installed {rid} on {len(hosts)} nodes, started rank 0 ({svc.hosts[0]}) then the "
                   "others; gating")
        result = gating.run_service_gate(starts, mode, on_progress=gate_progress(mode, abort))
        out.gate = result  # type: ignore[assignment]
        out.timings["gate"] = result.elapsed_s
        if result.passed:
            for i, h in enumerate(hosts):
                releases.apply(h, steps[i].end(Change(), records.PASSED), what="recording the passed deploy")
                releases.prune(h, svc.layout(i), svc.nodes[i].releases.keep, svc.nodes[i])
            out.exit_code, out.result, out.reason = DeployExit.OK, "ok", result.reason
            out.known_good = rid
            return
        out.failure = first_failed(gate_failures(result))
        first = out.failure.rank if out.failure is not None else (result.failed_rank or 0)
        out.diagnosis = result.states[first].scanner.report().to_json()
        out.diagnosis["first_failed"] = None if out.failure is None else out.failure.to_json()
        out.evidence = [f"{svc.hosts[first]}: {ln.message}" for ln in result.states[first].lines[-25:]]
        out.reason = f"gate failed: {out.failure.describe() if out.failure else result.reason}"
        for h, step in zip(hosts, steps):
            releases.apply(h, step.end(Change(), records.FAILED, result.reason), what="recording the failure")
    except KeyboardInterrupt:
        if not touched:
            raise
        out.reason = "interrupted (Ctrl-C) after the nodes were changed"
        output.warn(f"{svc.name}: interrupted; rolling every node back to its known-good release")
        _end_all(hosts, steps, records.INTERRUPTED, out.reason)
    except HostError as exc:
        out.reason = f"the connection to a node dropped while installing {rid}: {exc}"
        if not all(reconnect(h) for h in hosts):
            degrade(out, f". The nodes keep a pending record for {rid}; `ddtree-ops rollback {svc.name}` (or a deploy) "
                         "rolls every node back once they are reachable.")
            return
        _end_all(hosts, steps, records.INTERRUPTED, out.reason)
    except OpsError as exc:
        if not touched:
            raise
        out.reason = f"installing {rid} failed: {exc}"
        _end_all(hosts, steps, records.FAILED, str(exc))
    t_rb = time.monotonic()
    try:
        passed, why, rb = rollback_nodes(hosts, svc, why=out.reason)
    except (HostError, OpsError) as exc:
        degrade(out, f"; the rollback could not run: {exc}")
        return
    out.rollback_gate = rb  # type: ignore[assignment]
    out.timings["rollback"] = time.monotonic() - t_rb
    settle_rollback(out, passed, healthy=f"; every node rolled back to {out.known_good}, healthy again",
                    failed=f"; the rollback ALSO FAILED: {why}")


def _end_all(hosts: Sequence[Host], steps: Sequence[Step], outcome: str, cause: str) -> None:
    """Each node's attempt ends alike; a node out of reach keeps its pending record for the next run."""
    for h, step in zip(hosts, steps):
        try:
            releases.apply(h, step.end(Change(), outcome, cause), what=f"recording the {outcome} attempt")
        except (HostError, OpsError) as exc:
            output.warn(f"{step.host}: could not record the attempt's end ({exc}); its pending record stays")


def rollback_service(hosts: Sequence[Host], svc: Service, *, to: str | None = None, lock_wait_s: float = 0,
                     dry_run: bool = False, assume_yes: bool = False,
                     confirm: Callable[[str], bool] | None = None) -> ServiceOutcome:
    """Every node back to its rollback target (or `to`, kept on every node), together; it asks
    first, as a deploy does."""
    t0 = time.monotonic()
    out = ServiceOutcome(svc.name, svc.rank0.known_good_mode, to or "", DeployExit.REFUSED, "refused", "",
                         service=svc.name, node_names=svc.hosts, command="rollback")
    with ExitStack() as held:
        for i, h in enumerate(hosts):
            held.enter_context(lock.held(h, svc.layout(i), command=f"rollback {svc.name}", release=to,
                                         wait_s=lock_wait_s))
        states = [releases.read_state(h, svc.layout(i)) for i, h in enumerate(hosts)]
        kg = states[0].target(svc.rank0)
        out.known_good = kg.release_id if kg else None
        out.release_id = to or out.known_good or ""
        if not out.release_id:
            out.reason = f"{svc.name}: no release has passed on {svc.hosts[0]}; nothing to roll back to"
            return out
        if dry_run:
            out.exit_code, out.result = DeployExit.OK, "dry-run"
            out.reason = f"dry run: would roll every node back to {out.release_id}; nothing changed"
            out.nodes = read_node_states(hosts, svc)
            return out
        why_not = refusal(f"Roll {svc.describe()} back to {out.release_id} and restart {svc.unit} on every node?",
                          "hosts", assume_yes=assume_yes, confirm=confirm, stop=None)
        if why_not:
            out.reason = why_not
            return out
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
            out.exit_code, out.result, out.reason = DeployExit.OK, "ok", f"{out.release_id} serving on every node: {reason}"
        else:
            if rb is not None:
                out.failure = first_failed(gate_failures(rb))
            out.exit_code, out.result, out.reason = DeployExit.DEGRADED, "degraded", f"rollback failed: {reason}"
        _finish_states(out, hosts, svc)
    out.timings["total"] = time.monotonic() - t0
    return out
