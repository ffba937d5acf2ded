"""The fleet side of the commands: parse the targets, call fleet.py, render one line per host.

Used by `deploy`, `rollback`, `history`, `lock status` and `diagnose` when they are given a group or
several hosts; a single host keeps its single-host command and output. stdout carries the table (or
the one JSON document), stderr the people-lines. The library (pydantic, through the profile) is
imported inside each function, so importing this module for `--help` costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

from ddtree_ops import output
from ddtree_ops.cli import _common
from ddtree_ops.cli._common import profiles_of
from ddtree_ops.config.hostnames import compress
from ddtree_ops.errors import UsageError

if TYPE_CHECKING:
    from ddtree_ops.config.inventory import Inventory
    from ddtree_ops.fleet import FleetOutcome


# --------------------------------------------------------------------------- deploy


def deploy_many(inv: "Inventory", names: Sequence[str], *, mode: Optional[str], overrides: Sequence[str], rollout: Any,
                dry_run: bool, yes: bool, force_restart: bool, lock_wait: float, verbose: bool, as_json: bool,
                ssh_config: Optional[str]) -> int:
    # the library loads pydantic (profiles) and the transaction: only when the command runs
    from ddtree_ops import fleet
    from ddtree_ops.render import render

    hosts = profiles_of(inv, names, overrides)
    if not hosts:
        raise UsageError(f"{' '.join(names)}: no hosts")
    targets = []
    for name, p in hosts:
        p.mode(mode or p.desired_mode)  # an unconfigured mode is a usage error before any connection
        stay = rollout.canary_stay_s
        if stay is not None and stay >= p.gate.startup_deadline_s:
            raise UsageError(f"--canary-stay {stay:g} must be shorter than {name}'s gate.startup_deadline_s "
                             f"({p.gate.startup_deadline_s:g})")
        run = mode or p.desired_mode
        targets.append(fleet.Target(name, p, render(p, run).release_id, f"{p.gpu.model} {p.gpu.arch}", run))
    opts = fleet.Options(mode, rollout, dry_run=dry_run, assume_yes=yes, force_restart=force_restart,
                         confirm=_common.confirm if _common.interactive() and not as_json else None,
                         lock_wait_s=lock_wait,
                         verbose=verbose)
    out = fleet.deploy_fleet(targets, _common.connector(ssh_config), opts, requested=names)
    show_fleet(out, as_json=as_json)
    return out.exit_code


def show_fleet(out: "FleetOutcome", *, as_json: bool) -> None:
    # fleet imports the transaction (pydantic): only when a fleet command runs
    from ddtree_ops import fleet

    if as_json:
        output.emit_json(out.to_json())
    else:
        output.data("\n".join(fleet.summary_lines(out)))
    for cause, hosts, remedy in fleet.causes(out.hosts):
        output.say(f"[bold red]cause[/] {output.escape(cause)}: {compress(hosts)}"
                   + (f"\n  [bold]remedy:[/] {output.escape(remedy)}" if remedy else ""))
    if out.stopped:
        output.say(f"[bold yellow]stopped:[/] {output.escape(out.stopped)}")
    counts = ", ".join(f"{n} {r}" for r, n in out.to_json()["counts"].items())
    code = out.exit_code
    colour = {0: "green", 1: "yellow", 2: "bold red", 3: "red"}[code]
    output.say(f"[{colour}]{'DRY RUN' if out.dry_run else 'FLEET'}[/] {out.mode} on {len(out.hosts)} hosts: {counts} "
               f"in {out.seconds:.1f}s (exit {code})")
    degraded = [h.host for h in out.hosts if h.result == fleet.DEGRADED]
    if degraded:
        output.say(f"[bold red]DEGRADED: {', '.join(degraded)}[/] serve no verified release. "
                   f"`ddtree-ops diagnose {degraded[0]}`; `ddtree-ops rollback` repairs what it can.")


# --------------------------------------------------------------------------- rollback


def rollback_many(inv: "Inventory", names: Sequence[str], *, lock_wait: float, as_json: bool,
                  ssh_config: Optional[str], dry_run: bool = False, yes: bool = False) -> int:
    """Every host among the targets whose last change did not pass (pending, a last attempt that did
    not pass, or unhealthy), checked side by side; then, once confirmed (or --yes), rolled back side
    by side. --dry-run stops after the check."""
    # the transaction loads pydantic (profiles): only when the command runs
    from ddtree_ops import fleet
    from ddtree_ops.deploy import needs_rollback, rollback

    hosts = dict(profiles_of(inv, names) if names else [(n, inv.profile(n)) for n in inv.hosts()])
    connect = _common.connector(ssh_config)

    def check(name: str) -> tuple[bool, str]:
        with connect(hosts[name]) as h:
            return needs_rollback(h, hosts[name])

    todo = []
    for name, verdict, err in fleet.across(list(hosts), check):
        if verdict is None:
            output.warn(f"{name}: cannot check ({output.escape(err)})")
            continue
        output.say(f"{name}: {output.escape(verdict[1])}")
        if verdict[0]:
            todo.append(name)
    if not todo:
        output.say("no host needs a rollback")
        if as_json:
            output.emit_json({"command": "rollback", "exit_code": 0, "hosts": []})
        return 0
    why_not = None
    if dry_run:
        why_not = "dry run: nothing changed"
    elif not yes:
        if not (_common.interactive() and not as_json):
            why_not = "refusing to change hosts without confirmation: pass --yes (stdin is not a terminal)"
        elif not _common.confirm(f"Roll back {len(todo)} host(s): {compress(todo)}?"):
            why_not = "not confirmed; nothing changed"
    if why_not:
        code = 0 if dry_run else 3
        output.say(f"would roll back: {compress(todo)}" if dry_run else why_not)
        if as_json:
            output.emit_json({"command": "rollback", "exit_code": code, "dry_run": dry_run, "would_roll_back": todo,
                              "reason": why_not, "hosts": []})
        return code

    def act(name: str) -> Any:
        # a rollback's own lines (why, what it waits for) matter to people: shown, led by the host
        with output.captured(name, echo=True), connect(hosts[name]) as h:
            return rollback(h, hosts[name], lock_wait_s=lock_wait, assume_yes=True)

    done = fleet.across(todo, act)
    rows = [("HOST", "RESULT", "TIME", "SERVING", "DETAIL")]
    docs, worst = [], 0
    for name, o, err in done:
        if o is None:
            rows.append((name, "refused", "-", "-", fleet.shorten(err)))
            docs.append({"command": "rollback", "host": name, "result": "refused", "exit_code": 3, "reason": err})
            worst = max(worst, 3)
            continue
        serving = o.release_id if o.result in ("ok", "no-change") else "-"
        rows.append((name, o.result, f"{o.timings.get('total', 0):.1f}s", serving or "-", fleet.shorten(o.reason)))
        docs.append(o.to_json())
        worst = max(worst, int(o.exit_code))
    if as_json:
        output.emit_json({"command": "rollback", "exit_code": worst, "hosts": docs})
    else:
        output.data("\n".join(output.table(rows)))
    return worst


# --------------------------------------------------------------------------- history, lock status


def history_many(inv: "Inventory", names: Sequence[str], *, as_json: bool, ssh_config: Optional[str]) -> int:
    # the release records load pydantic (profiles): only when the command runs
    from ddtree_ops import attempts as records
    from ddtree_ops import fleet
    from ddtree_ops.releases import Layout, read_state, release_rows

    hosts = dict(profiles_of(inv, names))
    connect = _common.connector(ssh_config)

    def read(name: str) -> Any:
        p = hosts[name]
        with connect(p) as h:
            return read_state(h, Layout.for_service(p.service.state_dir, p.service.unit))

    rows = [("HOST", "CURRENT", "MODE", "ROLLBACK-TARGET", "LAST CHANGE")]
    docs = []
    for name, state, err in fleet.across(list(hosts), read):
        if state is None:
            rows.append((name, "?", "?", "?", f"unreachable: {fleet.shorten(err, 60)}"))
            docs.append({"host": name, "error": err})
            continue
        target = state.target(hosts[name])
        change = records.last_change(state.attempts)
        last = f"{change.action} {change.release_id} {change.outcome or 'running'} ({change.started_at})" if change else ""
        if state.pending:
            last = (f"PENDING {state.pending.get('action')} of {state.pending.get('release_id')} since "
                    f"{state.pending.get('started_at')}")
        rows.append((name, state.current or "-", state.mode_of(state.current) or "-",
                     target.release_id if target else "-", last or "-"))
        docs.append({"host": name, "current": state.current, "mode": state.mode_of(state.current),
                     "rollback_target": None if target is None else target.to_json(), "last": last,
                     "last_change": None if change is None else change.to_json(), "pending": state.pending,
                     "releases": [r.to_json() for r in release_rows(state, hosts[name])]})
    if as_json:
        output.emit_json({"command": "history", "exit_code": 0, "hosts": docs})
    else:
        output.data("\n".join(output.table(rows)))
    return 0


def lock_status_many(inv: "Inventory", names: Sequence[str], *, as_json: bool, ssh_config: Optional[str]) -> int:
    # the lock and release records load pydantic (profiles): only when the command runs
    from ddtree_ops import fleet
    from ddtree_ops.lock import read_lock
    from ddtree_ops.releases import Layout

    hosts = dict(profiles_of(inv, names))
    connect = _common.connector(ssh_config)

    def read(name: str) -> Any:
        p = hosts[name]
        with connect(p) as h:
            return [read_lock(h, Layout.for_service(p.service.state_dir, p.service.unit))]

    rows = [("HOST", "LOCK", "DETAIL")]
    docs, held, unknown = [], 0, 0
    for name, got, err in fleet.across(list(hosts), read):
        if got is None:
            unknown += 1
            rows.append((name, "unknown", fleet.shorten(err, 80)))
            docs.append({"host": name, "held": None, "error": err})
            continue
        info = got[0]
        held += info is not None
        rows.append((name, "held" if info else "free", info.describe() if info else "-"))
        docs.append({"host": name, "held": info is not None, "lock": None if info is None else info.__dict__})
    code = 1 if held else (3 if unknown else 0)
    if as_json:
        output.emit_json({"command": "lock status", "exit_code": code, "hosts": docs})
    else:
        output.data("\n".join(output.table(rows)))
    return code


# --------------------------------------------------------------------------- diagnose


# across hosts the worst verdict wins, and a failure found outranks a host that could not be read
_DIAGNOSE_RANK = {0: 0, 1: 1, 3: 2, 2: 3}


def diagnose_many(inv: "Inventory", names: Sequence[str], *, mode: Optional[str], as_json: bool,
                  ssh_config: Optional[str]) -> int:
    """A table of causes: hosts that share one are on one line; the evidence and remedy once each."""
    # the live diagnosis loads the catalogue and pydantic (profiles): only when the command runs
    from ddtree_ops import fleet
    from ddtree_ops.diagnose import report as rpt
    from ddtree_ops.diagnose.live import diagnose_host
    from ddtree_ops.status import DiagnoseExit

    hosts = dict(profiles_of(inv, names))
    connect = _common.connector(ssh_config)

    def one(name: str) -> Any:
        with connect(hosts[name]) as h:
            diag = diagnose_host(h, hosts[name], mode)
        return diag, diag.combined()

    per_host, worst = [], 0
    groups: dict[tuple[str, ...], dict[str, Any]] = {}
    for name, got, err in fleet.across(list(hosts), one):
        if got is None:
            key, doc = ("unreadable", fleet.shorten(err, 70)), {"host": name, "verdict": "unreadable", "error": err}
            cause = key[1]
            code = int(DiagnoseExit.UNREADABLE)
            evidence = remedy = ""
        else:
            diag, combined = got
            f = combined.root_cause or (combined.warnings[0] if combined.warnings else None)
            said = ""
            if f is None and (f := rpt.previous_start(combined)) is not None:
                # healthy now, after a failed start (a rolled-back deploy): its own line, so the group
                # view never folds a failure into "healthy"
                said = "previous start: "
            key = (combined.verdict, said + f.label if f is not None else "-")
            cause = key[1]
            if f is not None and f.description is not None:
                # a failure no rule names: hosts that fail the same unnamed way (component, exception,
                # message without its numbers) are one line; others with the same label are not
                key = (combined.verdict, said + f.label, f.description.key)
                cause = f"{said}{f.label}: {f.description.head()[:120]}"
            evidence = f"line {f.line}: {f.evidence}" if f is not None else ""
            remedy = (f.remedy or "") if f is not None else ""
            doc = {"host": name, **rpt.to_json(combined, diag)}
            code = int(rpt.exit_code(combined.verdict))
        worst = max(worst, code, key=_DIAGNOSE_RANK.__getitem__)
        per_host.append(doc | {"exit_code": code})
        g = groups.setdefault(key, {"verdict": key[0], "cause": cause, "hosts": [], "evidence": evidence,
                                    "evidence_host": name, "remedy": remedy,
                                    **({"fingerprint": key[2]} if len(key) > 2 else {})})
        g["hosts"].append(name)
    order = {"failed": 0, "unreadable": 1, "inconclusive": 2, "degraded": 3, "healthy": 4}
    ranked = sorted(groups.values(), key=lambda g: (order.get(g["verdict"], 9), -len(g["hosts"])))
    if as_json:
        output.emit_json({"command": "diagnose", "exit_code": worst, "causes": ranked, "hosts": per_host})
    else:
        rows = [("VERDICT", "CAUSE", "N", "HOSTS")] + [
            (g["verdict"], g["cause"], str(len(g["hosts"])), compress(g["hosts"])) for g in ranked]
        output.data("\n".join(output.table(rows)))
        for g in ranked:
            if g["evidence"]:
                output.say(f"[bold]{output.escape(g['cause'])}[/] ({g['evidence_host']}, "
                           f"{output.escape(g['evidence'])})"
                           + (f"\n  [bold]remedy:[/] {output.escape(g['remedy'])}" if g["remedy"] else ""))
    return worst
