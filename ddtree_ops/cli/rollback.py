"""`ddtree-ops rollback [HOST] [--to RELEASE]`: reinstall known-good through the same gate."""

from __future__ import annotations

from typing import Optional

import typer

from ddtree_ops import output
from ddtree_ops.cli import _common, _fleet, _service
from ddtree_ops.cli._common import InventoryOpt, JsonOpt, ProfilesOpt, SshConfigOpt
from ddtree_ops.cli._show import show_outcome, show_plan
from ddtree_ops.errors import UsageError


def rollback_cmd(targets: Optional[list[str]] = typer.Argument(None, metavar="[TARGET]...",
                                                             help="A host, or groups and hosts (default: every "
                                                                  "host whose last deploy did not pass)."),
                 to: Optional[str] = typer.Option(None, "--to", metavar="RELEASE|previous",
                                                  help="A release id kept on the host, or `previous` (the last "
                                                       "release that passed before the current one). Default: the "
                                                       "profile's rollback target, the last NEXTN release that passed."),
                 dry_run: bool = typer.Option(False, "--dry-run", help="Show the plan; change nothing."),
                 yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
                 lock_wait: float = typer.Option(0, "--lock-wait", metavar="SECONDS"),
                 as_json: bool = JsonOpt, ssh_config: Optional[str] = SshConfigOpt,
                 profiles: Optional[str] = ProfilesOpt, inventory: Optional[str] = InventoryOpt) -> int:
    """Reinstall the rollback target and gate it: the last NEXTN release that passed (the profile's
    known_good_mode and rollback.target), or --to RELEASE|previous.

    One HOST: its rollback target; if that is already installed and healthy, nothing happens and it
    says so. A group, several hosts, or none: the hosts among them whose last change did not pass
    (a pending record, a last attempt that failed or was cut off, or unhealthy), checked and rolled
    back side by side, one line per host. It asks first on a terminal; off one, pass --yes.

    Exit: 0 the target serves and is healthy (or already did), 2 the rollback failed its gate,
    3 refused (nothing to return to, not confirmed, lock held, --dry-run of a refusal).

    Example: ddtree-ops rollback ct129 --dry-run

    Example: ddtree-ops rollback ct129 --to previous --yes

    Example: ddtree-ops rollback a6000 --yes
    """
    # the transaction loads pydantic (profiles): imported when the command runs
    from ddtree_ops.deploy import rollback

    inv = _common.inventory(profiles, inventory)
    names = targets or []
    service = _common.service_target(inv, names)
    if service is not None:
        return _service.rollback(inv, service, to=to, lock_wait=lock_wait, as_json=as_json, ssh_config=ssh_config,
                                 dry_run=dry_run, yes=yes)
    if not _common.is_single(inv, names):
        if to is not None:
            raise UsageError("--to needs one HOST (release ids belong to one host)")
        return _fleet.rollback_many(inv, names, lock_wait=lock_wait, as_json=as_json, ssh_config=ssh_config,
                                    dry_run=dry_run, yes=yes)
    p = inv.profile(names[0])
    with _common.connect(p, ssh_config) as h:
        out = rollback(h, p, to=to, dry_run=dry_run, assume_yes=yes,
                       confirm=_common.confirm if _common.interactive() and not as_json else None,
                       lock_wait_s=lock_wait, on_plan=None if as_json else show_plan)
    if as_json:
        output.emit_json({"command": "rollback", "exit_code": int(out.exit_code), "hosts": [out.to_json()]})
    else:
        show_outcome(out)
    return int(out.exit_code)


def register(app: typer.Typer) -> None:
    app.command("rollback")(rollback_cmd)
