"""`ddtree-ops rollback [HOST] [--to RELEASE]`: reinstall known-good through the same gate."""

from __future__ import annotations

from typing import Optional

import typer

from ddtree_ops import output
from ddtree_ops.cli import _common, _fleet, _service
from ddtree_ops.cli._common import InventoryOpt, JsonOpt, ProfilesOpt, SshConfigOpt
from ddtree_ops.cli._show import show_outcome
from ddtree_ops.errors import UsageError


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
    # the transaction loads pydantic (profiles): imported when the command runs
    from ddtree_ops.deploy import rollback

    inv = _common.inventory(profiles, inventory)
    names = targets or []
    service = _common.service_target(inv, names)
    if service is not None:
        return _service.rollback(inv, service, to=to, lock_wait=lock_wait, as_json=as_json, ssh_config=ssh_config)
    if not _common.is_single(inv, names):
        if to is not None:
            raise UsageError("--to needs one HOST (release ids belong to one host)")
        return _fleet.rollback_many(inv, names, lock_wait=lock_wait, as_json=as_json, ssh_config=ssh_config)
    p = inv.profile(names[0])
    with _common.connect(p, ssh_config) as h:
        out = rollback(h, p, to=to, lock_wait_s=lock_wait)
    if as_json:
        output.emit_json({"command": "rollback", "hosts": [out.to_json() | {"command": "rollback"}]})
    else:
        show_outcome(out)
    return int(out.exit_code)


def register(app: typer.Typer) -> None:
    app.command("rollback")(rollback_cmd)
