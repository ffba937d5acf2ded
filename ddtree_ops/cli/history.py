"""`ddtree-ops history HOST`: releases kept on the host, the known-good marker, the audit log."""

from __future__ import annotations

from typing import Optional

import typer

from ddtree_ops.cli._common import JsonOpt, ProfilesOpt, SshConfigOpt


def history_cmd(host: str = typer.Argument(..., help="Host name."),
                audit: int = typer.Option(10, "--audit", metavar="N", help="Audit lines to show."),
                as_json: bool = JsonOpt, ssh_config: Optional[str] = SshConfigOpt,
                profiles: Optional[str] = ProfilesOpt) -> int:
    """List the releases on HOST, newest first, with the known-good and current markers.

    Example: ddtree-ops history ct129
    """
    from ddtree_ops import output
    from ddtree_ops.cli._common import connect, load
    from ddtree_ops.releases import Layout, history

    p = load(host, None, profiles)
    layout = Layout.for_service(p.service.state_dir, p.service.unit)
    with connect(p, ssh_config) as h:
        rels, pending, audit_lines = history(h, layout)
    if as_json:
        output.emit_json({"command": "history", "host": host, "releases": [r.__dict__ for r in rels],
                          "pending": pending, "audit": audit_lines[-audit:]})
        return 0
    from rich.table import Table

    table = Table(title=f"{host}: releases in {layout.releases}", title_justify="left")
    for col in ("release", "mode", "status", "created", "by", ""):
        table.add_column(col)
    for r in rels:
        marks = " ".join(m for m, on in (("known-good", r.known_good), ("current", r.current)) if on)
        table.add_row(r.release_id, r.mode, r.status, r.created_at, r.by, marks)
    output.err().print(table)
    if pending:
        output.warn(f"unfinished {pending.get('action')} of {pending.get('release_id')} by {pending.get('by')} "
                    f"since {pending.get('started_at')}: the next deploy or rollback resolves it")
    if audit_lines:
        output.say("[bold]audit log:[/]")
        for line in audit_lines[-audit:]:
            output.err().print("  " + line, markup=False, highlight=False)
    for r in rels:
        output.data(f"{r.release_id}\t{r.mode}\t{r.status}\t{r.created_at}\t"
                    f"{'known-good' if r.known_good else ''}{' current' if r.current else ''}".rstrip())
    return 0


def register(app: typer.Typer) -> None:
    app.command("history")(history_cmd)
