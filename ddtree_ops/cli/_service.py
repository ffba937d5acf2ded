"""The commands on a multi-node service (profiles/services/<name>.yaml): deploy, rollback,
diagnose, history, smoke and preflight over every node at once (ddtree_ops/service.py does the
work; this renders it). The library (pydantic, through the profile) is imported inside each
function, so importing this module for `--help` costs nothing."""

from __future__ import annotations

import time
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, Optional, Sequence

from ddtree_ops import output
from ddtree_ops.cli import _common
from ddtree_ops.cli._show import MARKS, RESULT_COLOUR, show_checks
from ddtree_ops.errors import OpsError
from ddtree_ops.status import DiagnoseExit

if TYPE_CHECKING:
    from ddtree_ops.config.inventory import Inventory
    from ddtree_ops.service import ServiceOutcome
    from ddtree_ops.service_nodes import Service


def load(inv: "Inventory", name: str, overrides: Sequence[str] = ()) -> "Service":
    # the service's profiles are pydantic models: imported when a command runs
    from ddtree_ops.service_nodes import Service

    return Service.load(inv, name, overrides)


def _hosts(svc: "Service", ssh_config: Optional[str], stack: ExitStack) -> list[Any]:
    # the service transaction loads pydantic (profiles): imported when a command runs
    from ddtree_ops.service_nodes import connect_all

    return connect_all(svc, _common.connector(ssh_config), stack)


def show_plan(out: "ServiceOutcome") -> None:
    spf = out.service_preflight
    if spf is None:
        return
    output.say(f"[bold]{out.service}[/] preflight for {out.release_id} ({len(spf.nodes)} nodes):")
    for i, (node, pf) in enumerate(zip(spf.names, spf.nodes)):
        output.say(f" [bold]{node}[/] (node rank {i}):")
        show_checks(pf, node)
    for c in spf.service:
        output.say(f"  {MARKS[c.status]} {'service ' + c.name:<13} {c.detail}")
    if out.diff and spf.ok:
        output.say("[bold]changes:[/]")
        output.err().print(out.diff, markup=False, highlight=False, style=None)


def show(out: "ServiceOutcome", *, as_json: bool, command: str = "deploy") -> None:
    escape = output.escape
    if as_json:
        output.emit_json(out.to_json() | {"command": command})
        return
    for e in out.events:
        output.say(f"  {escape(e)}")
    if out.failure is not None:
        output.say(f"[bold red]first failure:[/] {escape(out.failure.describe())}")
    rc = (out.diagnosis or {}).get("root_cause")
    if rc and rc.get("remedy"):
        output.say(f"[bold]remedy:[/] {escape(rc['remedy'])}")
    if out.evidence:
        output.say("[bold]journal of the failing node (last lines):[/]")
        for line in out.evidence[-12:]:
            output.err().print("  " + line, markup=False, highlight=False)
    for n in out.nodes:
        output.err().print("  " + n.describe(), markup=False, highlight=False)
    colour = RESULT_COLOUR.get(out.result, "white")
    output.say(f"[{colour}]{out.result.upper()}[/] {out.service} {out.mode}: {escape(out.reason)}")
    if out.result == "degraded":
        output.say(f"[bold red]SERVICE {out.service} IS DEGRADED:[/] its nodes are not on one verified release "
                   f"(each node's state above). `ddtree-ops diagnose {out.service}` names the failing rank.")


def deploy(inv: "Inventory", name: str, *, mode: Optional[str], overrides: Sequence[str], dry_run: bool, yes: bool,
           force_restart: bool, lock_wait: float, as_json: bool, ssh_config: Optional[str]) -> int:
    # the service transaction loads pydantic (profiles): imported when the command runs
    from ddtree_ops.service import deploy_service

    svc = load(inv, name, overrides)
    mode = mode or svc.rank0.desired_mode
    svc.rank0.mode(mode)
    with ExitStack() as stack:
        hosts = _hosts(svc, ssh_config, stack)
        out = deploy_service(hosts, svc, mode, dry_run=dry_run, assume_yes=yes,
                             confirm=_common.confirm if _common.interactive() and not as_json else None,
                             force_restart=force_restart, lock_wait_s=lock_wait,
                             on_plan=None if as_json else show_plan)
    show(out, as_json=as_json)
    return int(out.exit_code)


def rollback(inv: "Inventory", name: str, *, to: Optional[str], lock_wait: float, as_json: bool,
             ssh_config: Optional[str], dry_run: bool = False, yes: bool = False) -> int:
    # the service transaction loads pydantic (profiles): imported when the command runs
    from ddtree_ops.service import rollback_service

    svc = load(inv, name)
    with ExitStack() as stack:
        hosts = _hosts(svc, ssh_config, stack)
        out = rollback_service(hosts, svc, to=to, lock_wait_s=lock_wait, dry_run=dry_run, assume_yes=yes,
                               confirm=_common.confirm if _common.interactive() and not as_json else None)
    show(out, as_json=as_json, command="rollback")
    return int(out.exit_code)


def diagnose(inv: "Inventory", name: str, *, mode: Optional[str], as_json: bool, ssh_config: Optional[str]) -> int:
    """Every node's journal; the rank that failed first is the cause, the others' NCCL and store
    timeouts are its echo."""
    # the live diagnosis and the service load the catalogue and pydantic: imported when the command runs
    from ddtree_ops.diagnose import report as rpt
    from ddtree_ops.diagnose.live import diagnose_host
    from ddtree_ops.service_nodes import diagnosis_failures, each, first_failed

    escape = output.escape

    svc = load(inv, name)
    errors: list[str] = []
    with ExitStack() as stack:
        try:
            hosts = _hosts(svc, ssh_config, stack)
        except OpsError as exc:
            output.fail(f"{name}: {exc}")
            return DiagnoseExit.UNREADABLE

        def one(i: int, h: Any) -> Any:
            try:
                return diagnose_host(h, svc.nodes[i], mode)
            except OpsError as exc:
                errors.append(f"{svc.hosts[i]}: {exc}")
                return None

        diags = each(hosts, one)
    failures = diagnosis_failures(svc.hosts, diags)
    first = first_failed(failures)
    combined = [d.combined() if d is not None else None for d in diags]
    verdict = rpt.service_verdict([c.verdict if c is not None else None for c in combined])
    code = int(DiagnoseExit.UNREADABLE) if verdict == "unreadable" else int(rpt.exit_code(verdict))
    if as_json:
        output.emit_json({"command": "diagnose", "exit_code": code, "service": name, "verdict": verdict,
                          "first_failed": None if first is None else first.to_json(),
                          "root_cause": None if first is None or first.finding is None else {
                              "label": first.finding.label, "line": first.finding.line,
                              "evidence": first.finding.evidence, "remedy": first.finding.remedy},
                          "symptoms": [f.to_json() for f in failures if f is not first],
                          "nodes": [{"node": n, "rank": i, **(rpt.to_json(c, d) if c is not None else {"error": "unreadable"})}
                                    for i, (n, c, d) in enumerate(zip(svc.hosts, combined, diags))],
                          "errors": errors})
    else:
        for i, (n, c) in enumerate(zip(svc.hosts, combined)):
            rc = c.root_cause if c is not None else None
            what = "unreadable" if c is None else f"{c.verdict}" + (f": {rc.label}: {rc.text.strip()[:160]}" if rc else "")
            output.err().print(f"  {n} (node rank {i}): {what}", markup=False, highlight=False)
        if first is not None:
            output.say(f"[bold red]{escape(name)}: {escape(first.describe())}[/]")
            if first.finding is not None and first.finding.remedy:
                output.say(f"[bold]remedy:[/] {escape(first.finding.remedy)}")
            others = [f for f in failures if f is not first]
            for f in others:
                role = "symptom" if f.symptom else "also failed"
                output.err().print(f"  {role}: node rank {f.rank} ({f.node}): "
                                   + (f.finding.label if f.finding is not None else f.detail),
                                   markup=False, highlight=False)
        else:
            output.say(f"[green]{escape(name)}: no node's journal names a failure[/]")
        for e in errors:
            output.warn(e)
    return code


def history(inv: "Inventory", name: str, *, audit: int, as_json: bool, ssh_config: Optional[str]) -> int:
    # the service loads pydantic (profiles): imported when the command runs
    from ddtree_ops.service_nodes import service_history

    svc = load(inv, name)
    with ExitStack() as stack:
        rows, per_node = service_history(_hosts(svc, ssh_config, stack), svc)
    if as_json:
        output.emit_json({"command": "history", "exit_code": 0, "service": name, "nodes": svc.hosts,
                          "releases": [r.__dict__ for r in rows],
                          "per_node": [{"node": n, "pending": pend, "audit": lines[-audit:]}
                                       for n, pend, lines in per_node]})
        return 0
    table = [("RELEASE", "MODE", "CREATED", *[f"{n} (rank {i})" for i, n in enumerate(svc.hosts)])]
    table += [(r.release_id, r.mode, r.created_at, *[r.per_node[n] for n in svc.hosts]) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        output.data("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    for n, pend, lines in per_node:
        if pend:
            output.warn(f"{n}: unfinished {pend.get('action')} of {pend.get('release_id')}: the next deploy or "
                        "rollback of the service resolves it on every node")
        if lines:
            output.say(f"{n} audit log:")
            for line in lines[-audit:]:
                output.err().print("  " + line, markup=False, highlight=False)
    return 0


def smoke(inv: "Inventory", names: Sequence[str], *, as_json: bool, ssh_config: Optional[str]) -> int:
    """One check per service: rank 0's smoke (health, request, acceptance) with every node's unit
    underneath; any node not running makes the service CRITICAL."""
    # smoke and the service load prometheus_client and pydantic: imported when the command runs
    from ddtree_ops.service_nodes import read_node_states, smoke_service
    from ddtree_ops.smoke import nagios
    from ddtree_ops.smoke.runner import Target, check_host

    results = []
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for name in names:
        svc = load(inv, name)
        rank0 = check_host(Target(svc.rank0.name, svc.rank0), _common.connector(ssh_config))
        with ExitStack() as stack:
            states = read_node_states(_hosts(svc, ssh_config, stack), svc)
        results.append(smoke_service(name, rank0, states))
    finished = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if as_json:
        output.emit_json(nagios.to_json(results, started_at=started, finished_at=finished))
    else:
        output.data("\n".join([nagios.status_line(results), *nagios.detail_lines(results)]))
    return int(nagios.worst([r.state for r in results]))


def preflight(inv: "Inventory", name: str, *, mode: Optional[str], overrides: Sequence[str], as_json: bool,
              ssh_config: Optional[str]) -> int:
    # rendering and the service load pydantic (profiles): imported when the command runs
    from ddtree_ops.profile import PLUGIN_MODES
    from ddtree_ops.render import render_service
    from ddtree_ops.service_preflight import preflight_service
    from ddtree_ops.wheel import build

    svc = load(inv, name, overrides)
    mode = mode or svc.rank0.desired_mode
    rendered = render_service(svc.nodes, mode)
    plugin = build().version if mode in PLUGIN_MODES else ""
    with ExitStack() as stack:
        spf = preflight_service(_hosts(svc, ssh_config, stack), svc, mode, rendered, plugin)
    if as_json:
        output.emit_json({"command": "preflight", "service": name, "mode": mode, "exit_code": 0 if spf.ok else 3,
                          **spf.to_json()})
    else:
        for i, (node, pf) in enumerate(zip(spf.names, spf.nodes)):
            output.say(f" [bold]{node}[/] (node rank {i}):")
            show_checks(pf, node)
        for c in spf.service:
            output.say(f"  {MARKS[c.status]} {'service ' + c.name:<13} {c.detail}")
        output.say("[green]preflight passed[/]" if spf.ok else "[red]preflight refused[/]")
    return 0 if spf.ok else 3
