"""`ddtree-ops preflight HOST`: the deploy's checks alone (GPU, memory fit, flags, plugin, unit)."""

from __future__ import annotations

from typing import Optional

import typer

from ddtree_ops import output
from ddtree_ops.cli import _common, _service
from ddtree_ops.cli._common import JsonOpt, ProfilesOpt, SetOpt, SshConfigOpt
from ddtree_ops.cli._show import show_checks


def preflight_cmd(host: str = typer.Argument(...),
                  mode: Optional[str] = typer.Option(None, "--mode", "-m", metavar="MODE",
                                                help="The mode to check: nextn | dflash | ddtree-shadow | ddtree (default: the profile's `mode:`)."),
                  set_: Optional[list[str]] = SetOpt, as_json: bool = JsonOpt,
                  ssh_config: Optional[str] = SshConfigOpt, profiles: Optional[str] = ProfilesOpt) -> int:
    """Run the deploy's preflight against HOST without changing anything. Exit 0 pass, 3 refused.

    Example: ddtree-ops preflight ct129 --set memory.context_length=131072
    """
    # preflight and rendering load pydantic (profiles): imported when the command runs
    from ddtree_ops.preflight import run_preflight
    from ddtree_ops.releases import Layout
    from ddtree_ops.render import render
    from ddtree_ops.profile import PLUGIN_MODES
    from ddtree_ops.wheel import build

    inv = _common.inventory(profiles)
    if inv.is_service(host):
        return _service.preflight(inv, host, mode=mode, overrides=set_ or [], as_json=as_json, ssh_config=ssh_config)
    p = _common.load(host, set_, profiles)
    mode = mode or p.desired_mode
    rendered = render(p, mode)
    plugin = build().version if mode in PLUGIN_MODES else ""
    with _common.connect(p, ssh_config) as h:
        pf = run_preflight(h, p, mode, rendered, Layout.for_service(p.service.state_dir, p.service.unit), plugin)
    if as_json:
        output.emit_json({"command": "preflight", "host": host, "mode": mode, "exit_code": 0 if pf.ok else 3,
                          **pf.to_json()})
    else:
        show_checks(pf)
        output.say("[green]preflight passed[/]" if pf.ok else "[red]preflight refused[/]")
    return 0 if pf.ok else 3


def register(app: typer.Typer) -> None:
    app.command("preflight")(preflight_cmd)
