"""`ddtree-ops rollback [HOST] [--to RELEASE]`: reinstall known-good through the same gate."""

from __future__ import annotations

from typing import Optional

import typer

from ddtree_ops.cli._common import JsonOpt, ProfilesOpt, SshConfigOpt


def rollback_cmd(host: Optional[str] = typer.Argument(None, help="Host (default: every host whose last deploy "
                                                                 "did not pass)."),
                 to: Optional[str] = typer.Option(None, "--to", metavar="RELEASE",
                                                  help="Release id to return to (default: the known-good one)."),
                 lock_wait: float = typer.Option(0, "--lock-wait", metavar="SECONDS"),
                 as_json: bool = JsonOpt, ssh_config: Optional[str] = SshConfigOpt,
                 profiles: Optional[str] = ProfilesOpt) -> int:
    """Reinstall the known-good release (NEXTN baseline by default) and gate it.

    Exit: 0 known-good serving and healthy, 2 the rollback failed its gate, 3 refused.

    Example: ddtree-ops rollback ct129
    """
    from ddtree_ops import output
    from ddtree_ops.cli._common import connect, load
    from ddtree_ops.cli.deploy import show
    from ddtree_ops.deploy import rollback
    from ddtree_ops.host import HostError
    from ddtree_ops.profile import available_hosts, profiles_dir

    if host is None and to is not None:
        from ddtree_ops.errors import UsageError

        raise UsageError("--to needs a HOST")
    targets = [host] if host else []
    if host is None:
        for name in available_hosts(profiles_dir(profiles)):
            p = load(name, None, profiles)
            try:
                with connect(p, ssh_config) as h:
                    need, why = needs_rollback(h, p)
            except HostError as exc:
                output.warn(f"{name}: cannot check ({exc})")
                continue
            output.say(f"{name}: {why}")
            if need:
                targets.append(name)
        if not targets:
            output.say("no host needs a rollback")
            if as_json:
                output.emit_json({"command": "rollback", "hosts": []})
            return 0
    worst = 0
    docs = []
    for name in targets:
        p = load(name, None, profiles)
        with connect(p, ssh_config) as h:
            out = rollback(h, p, to=to, lock_wait_s=lock_wait)
        docs.append(out.to_json() | {"command": "rollback"})
        if not as_json:
            show(out, as_json=False)
        worst = max(worst, int(out.exit_code))
    if as_json:
        output.emit_json({"command": "rollback", "hosts": docs})
    return worst


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
