"""`ddtree-ops rollback [HOST] [--to RELEASE]`: reinstall known-good through the same gate."""

from __future__ import annotations

from typing import Optional

import typer

from ddtree_ops.cli._common import InventoryOpt, JsonOpt, ProfilesOpt, SshConfigOpt


def rollback_cmd(targets: Optional[list[str]] = typer.Argument(None, metavar="[TARGET]...",
                                                             help="A host, or groups and hosts (default: every "
                                                                  "host whose last deploy did not pass)."),
                 to: Optional[str] = typer.Option(None, "--to", metavar="RELEASE",
                                                  help="Release id to return to (default: the known-good one)."),
                 lock_wait: float = typer.Option(0, "--lock-wait", metavar="SECONDS"),
                 as_json: bool = JsonOpt, ssh_config: Optional[str] = SshConfigOpt,
                 profiles: Optional[str] = ProfilesOpt, inventory: Optional[str] = InventoryOpt) -> int:
    """Reinstall the known-good release (NEXTN baseline by default) and gate it.

    One HOST: reinstall its known-good release. A group, several hosts, or none: the hosts among
    them whose last change did not pass (a pending record, not on their known-good release, or
    unhealthy), checked and rolled back side by side, one line per host.

    Exit: 0 known-good serving and healthy, 2 the rollback failed its gate, 3 refused.

    Example: ddtree-ops rollback ct129

    Example: ddtree-ops rollback a6000
    """
    from ddtree_ops.cli import _fleet
    from ddtree_ops.cli._common import connect, service_target
    from ddtree_ops.cli._common import inventory as load_inventory
    from ddtree_ops.cli.deploy import show
    from ddtree_ops.deploy import rollback
    from ddtree_ops.errors import UsageError

    inv = load_inventory(profiles, inventory)
    names = targets or []
    service = service_target(inv, names)
    if service is not None:
        from ddtree_ops.cli import _service

        return _service.rollback(inv, service, to=to, lock_wait=lock_wait, as_json=as_json, ssh_config=ssh_config)
    if not _fleet.is_single(inv, names):
        if to is not None:
            raise UsageError("--to needs one HOST (release ids belong to one host)")
        return _fleet.rollback_many(inv, names, lock_wait=lock_wait, as_json=as_json, ssh_config=ssh_config)
    p = inv.profile(names[0])
    with connect(p, ssh_config) as h:
        out = rollback(h, p, to=to, lock_wait_s=lock_wait)
    if as_json:
        from ddtree_ops import output

        output.emit_json({"command": "rollback", "hosts": [out.to_json() | {"command": "rollback"}]})
    else:
        show(out, as_json=False)
    return int(out.exit_code)


def needs_rollback(h: object, p: object) -> tuple[bool, str]:
    """Pending change, or not running what is recorded as known-good, or unhealthy."""
    from ddtree_ops import releases
    from ddtree_ops.deploy import healthy_now
    from ddtree_ops.releases import Layout

    layout = Layout.for_service(p.service.state_dir, p.service.unit)  # type: ignore[attr-defined]
    pending = releases.read_pending(h, layout)  # type: ignore[arg-type]
    if pending:
        return True, f"an unfinished {pending.get('action')} of {pending.get('release_id')} is pending"
    kg = releases.read_text(h, layout.known_good)  # type: ignore[arg-type]
    cur = releases.read_text(h, layout.current)  # type: ignore[arg-type]
    if kg and cur and kg != cur:
        return True, f"running {cur}, not the known-good {kg}"
    ok, detail = healthy_now(h, p)  # type: ignore[arg-type]
    if not ok:
        return True, f"not healthy ({detail})"
    return False, f"healthy on known-good {kg or cur or 'release'}; nothing to do"


def register(app: typer.Typer) -> None:
    app.command("rollback")(rollback_cmd)
