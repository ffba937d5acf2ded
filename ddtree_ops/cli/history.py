"""`ddtree-ops history HOST`: releases kept on the host, the known-good marker, the audit log."""

from __future__ import annotations

from typing import Optional

import typer

from ddtree_ops import output
from ddtree_ops.cli import _common, _fleet, _service
from ddtree_ops.cli._common import InventoryOpt, JsonOpt, ProfilesOpt, SshConfigOpt


def history_cmd(targets: list[str] = typer.Argument(..., metavar="TARGET", help="A host, or groups and hosts."),
                audit: int = typer.Option(10, "--audit", metavar="N", help="Audit lines to show."),
                as_json: bool = JsonOpt, ssh_config: Optional[str] = SshConfigOpt,
                profiles: Optional[str] = ProfilesOpt, inventory: Optional[str] = InventoryOpt) -> int:
    """List the releases on HOST, newest first, with the known-good and current markers; for a
    group, one line per host: current release, known-good, last result (or a pending change).

    Example: ddtree-ops history ct129

    Example: ddtree-ops history a6000
    """
    # the release records load pydantic (profiles): imported when the command runs
    from ddtree_ops.releases import Layout, history

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
        rels, pending, audit_lines = history(h, layout)
    if as_json:
        output.emit_json({"command": "history", "host": host, "releases": [r.__dict__ for r in rels],
                          "pending": pending, "audit": audit_lines[-audit:]})
        return 0
    # the list is the command's data (stdout); notes for people go to stderr
    rows = [("RELEASE", "MODE", "STATUS", "CREATED", "BY", "")] + [
        (r.release_id, r.mode, r.status, r.created_at, r.by,
         " ".join(m for m, on in (("known-good", r.known_good), ("current", r.current)) if on)) for r in rels]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        output.data("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[5])
    if pending:
        output.warn(f"unfinished {pending.get('action')} of {pending.get('release_id')} by {pending.get('by')} "
                    f"since {pending.get('started_at')}: the next deploy or rollback resolves it")
    if audit_lines:
        output.say(f"audit log ({layout.audit}):")
        for line in audit_lines[-audit:]:
            output.err().print("  " + line, markup=False, highlight=False)
    return 0


def register(app: typer.Typer) -> None:
    app.command("history")(history_cmd)
