"""`ddtree-ops lock status|release HOST`: the per-host deploy lock."""

from __future__ import annotations

from typing import Optional

import typer

from ddtree_ops import output
from ddtree_ops.cli import _common, _fleet
from ddtree_ops.cli._common import InventoryOpt, JsonOpt, ProfilesOpt, SshConfigOpt

lock_app = typer.Typer(help="Inspect or release a host's deploy lock.", no_args_is_help=True)


@lock_app.command("status")
def status(targets: list[str] = typer.Argument(..., metavar="TARGET", help="A host, or groups and hosts."),
           as_json: bool = JsonOpt, ssh_config: Optional[str] = SshConfigOpt,
           profiles: Optional[str] = ProfilesOpt, inventory: Optional[str] = InventoryOpt) -> int:
    """Who holds HOST's deploy lock, since when, for what (a group: one line per host).
    Exit 0 free, 1 held (any), 3 could not be read.

    Example: ddtree-ops lock status ct200
    """
    # the lock and release records load pydantic (profiles): imported when the command runs
    from ddtree_ops.lock import read_lock
    from ddtree_ops.releases import Layout

    inv = _common.inventory(profiles, inventory)
    if not _common.is_single(inv, targets):
        return _fleet.lock_status_many(inv, targets, as_json=as_json, ssh_config=ssh_config)
    host = targets[0]
    p = inv.profile(host)
    with _common.connect(p, ssh_config) as h:
        info = read_lock(h, Layout.for_service(p.service.state_dir, p.service.unit))
    if as_json:
        output.emit_json({"command": "lock status", "exit_code": 0 if info is None else 1, "host": host,
                          "held": info is not None,
                          "lock": None if info is None else info.__dict__})
    else:
        output.say(f"{host}: " + ("free" if info is None else f"lock {info.describe()}"))
    return 0 if info is None else 1


@lock_app.command("release")
def release(host: str = typer.Argument(...), ssh_config: Optional[str] = SshConfigOpt,
            profiles: Optional[str] = ProfilesOpt, inventory: Optional[str] = InventoryOpt) -> int:
    """Remove HOST's deploy lock (for a run that died); the audit log records who did it.

    Example: ddtree-ops lock release ct200
    """
    # the lock and release records load pydantic (profiles): imported when the command runs
    from ddtree_ops import releases
    from ddtree_ops.lock import read_lock, release_lock
    from ddtree_ops.releases import Layout

    p = _common.load(host, None, profiles, inventory)
    layout = Layout.for_service(p.service.state_dir, p.service.unit)
    with _common.connect(p, ssh_config) as h:
        info = read_lock(h, layout)
        if info is None:
            output.say(f"{host}: the lock is not held")
            return 0
        release_lock(h, layout)
        releases.apply(h, releases.Change().audit(layout, f"lock-release {host} (was {info.describe()})"),
                       what="recording the lock release")
    output.say(f"{host}: released the lock that was {info.describe()}")
    return 0


def register(app: typer.Typer) -> None:
    app.add_typer(lock_app, name="lock")
