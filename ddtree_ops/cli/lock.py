"""`ddtree-ops lock status|release HOST`: the per-host deploy lock."""

from __future__ import annotations

from typing import Optional

import typer

from ddtree_ops.cli._common import JsonOpt, ProfilesOpt, SshConfigOpt

lock_app = typer.Typer(help="Inspect or release a host's deploy lock.", no_args_is_help=True)


@lock_app.command("status")
def status(host: str = typer.Argument(...), as_json: bool = JsonOpt, ssh_config: Optional[str] = SshConfigOpt,
           profiles: Optional[str] = ProfilesOpt) -> int:
    """Who holds HOST's deploy lock, since when, for what. Exit 0 free, 1 held.

    Example: ddtree-ops lock status ct200
    """
    from ddtree_ops import output
    from ddtree_ops.cli._common import connect, load
    from ddtree_ops.lock import read_lock
    from ddtree_ops.releases import Layout

    p = load(host, None, profiles)
    with connect(p, ssh_config) as h:
        info = read_lock(h, Layout.for_service(p.service.state_dir, p.service.unit))
    if as_json:
        output.emit_json({"command": "lock status", "host": host, "held": info is not None,
                          "lock": None if info is None else info.__dict__})
    else:
        output.say(f"{host}: " + ("free" if info is None else f"lock {info.describe()}"))
    return 0 if info is None else 1


@lock_app.command("release")
def release(host: str = typer.Argument(...), ssh_config: Optional[str] = SshConfigOpt,
            profiles: Optional[str] = ProfilesOpt) -> int:
    """Remove HOST's deploy lock (for a run that died); the audit log records who did it.

    Example: ddtree-ops lock release ct200
    """
    from ddtree_ops import output, releases
    from ddtree_ops.cli._common import connect, load
    from ddtree_ops.lock import read_lock, release_lock
    from ddtree_ops.releases import Layout

    p = load(host, None, profiles)
    layout = Layout.for_service(p.service.state_dir, p.service.unit)
    with connect(p, ssh_config) as h:
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
