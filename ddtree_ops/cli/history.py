"""`ddtree-ops history HOST`: releases kept on the host, every attempt on it, the rollback target, the audit log."""

from __future__ import annotations

from typing import Optional

import typer

from ddtree_ops import output
from ddtree_ops.cli import _common, _fleet, _service
from ddtree_ops.cli._common import InventoryOpt, JsonOpt, ProfilesOpt, SshConfigOpt


def history_cmd(targets: list[str] = typer.Argument(..., metavar="TARGET", help="A host, or groups and hosts."),
                audit: int = typer.Option(10, "--audit", metavar="N", help="Audit lines to show."),
                attempts: int = typer.Option(10, "--attempts", metavar="N",
                                             help="Attempts to show, newest first (deploys, rollbacks, promotions)."),
                as_json: bool = JsonOpt, ssh_config: Optional[str] = SshConfigOpt,
                profiles: Optional[str] = ProfilesOpt, inventory: Optional[str] = InventoryOpt) -> int:
    """List the releases on HOST (newest first: passed or how their last attempt ended, the current
    one, the rollback target), then its attempts, each a record of its own; for a group, one line
    per host: current release, rollback target, the last change (or a pending one).

    Example: ddtree-ops history ct129

    Example: ddtree-ops history a6000
    """
    # the release records load pydantic (profiles): imported when the command runs
    from ddtree_ops.releases import Layout, read_state, release_rows

    inv = _common.inventory(profiles, inventory)
    service = _common.service_target(inv, targets)
    if service is not None:
        return _service.history(inv, service, audit=audit, as_json=as_json, ssh_config=ssh_config)
    if not _common.is_single(inv, targets):
        return _fleet.history_many(inv, targets, as_json=as_json, ssh_config=ssh_config)
    host = targets[0]
    p = inv.profile(host)
    layout = Layout.for_service(p.service.state_dir, p.service.unit)
    with _common.connect(p, ssh_config) as h:
        state = read_state(h, layout)
    rels = release_rows(state, p)
    target = state.target(p)
    shown = state.attempts[-attempts:] if attempts else []
    if as_json:
        output.emit_json({"command": "history", "exit_code": 0, "host": host, "current": state.current,
                          "rollback_target": None if target is None else target.to_json(),
                          "pending": state.pending, "releases": [r.to_json() for r in rels],
                          "attempts": [a.to_json() for a in reversed(shown)],
                          "unreadable_attempt_lines": state.unreadable, "audit": state.audit[-audit:]})
        return 0
    # the lists are the command's data (stdout); notes for people go to stderr
    rows = [("RELEASE", "MODE", "STATUS", "TRIES", "CREATED", "BY", "")] + [
        (r.release_id, r.mode, r.status, str(r.attempts), r.created_at, r.by, r.marks()) for r in rels]
    output.data("\n".join(output.table(rows)))
    if shown:
        arows = [("ATTEMPT", "ACTION", "RELEASE", "MODE", "OUTCOME", "BY", "CAUSE")] + [
            (a.id, a.action, a.release_id, a.mode + (" (--mode)" if a.mode_source == "--mode" else ""),
             a.outcome or "running", a.by, _short(a.cause)) for a in reversed(shown)]
        output.data("")
        output.data("\n".join(output.table(arows)))
    if target is not None:
        output.say(f"rollback target: {target.release_id} ({target.mode}): {target.why}")
    if state.pending:
        output.warn(f"unfinished {state.pending.get('action')} of {state.pending.get('release_id')} by "
                    f"{state.pending.get('by')} since {state.pending.get('started_at')}: the next deploy or rollback "
                    "resolves it")
    if state.unreadable:
        output.warn(f"{state.unreadable} line(s) of {layout.attempts} could not be read and were skipped")
    if state.audit:
        output.say(f"audit log ({layout.audit}):")
        for line in state.audit[-audit:]:
            output.err().print("  " + line, markup=False, highlight=False)
    return 0


def _short(text: str, limit: int = 70) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def register(app: typer.Typer) -> None:
    app.command("history")(history_cmd)
