"""`ddtree-ops deploy TARGET...`: render, preflight, install, gate; roll back to known-good on failure.

One host: the single-host transaction below. Groups or several hosts: a canary, then waves, each
host its own transaction (ddtree_ops/fleet.py, rendered by cli/_fleet.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import typer

from ddtree_ops import output
from ddtree_ops.cli import _common, _fleet, _service
from ddtree_ops.cli._common import InventoryOpt, JsonOpt, ProfilesOpt, SetOpt, SshConfigOpt
from ddtree_ops.cli._show import show_outcome, show_plan

if TYPE_CHECKING:
    from ddtree_ops.deploy import Outcome

ModeOpt = typer.Option(None, "--mode", "-m", metavar="MODE",
                       help="Run this mode instead of the profile's `mode:` for this deploy (nextn | dflash | "
                            "ddtree-shadow | ...); the plan shows the override and the attempt records it.")
_FLEET = "Fleet (a group or several hosts)"


def deploy_cmd(targets: list[str] = typer.Argument(..., metavar="TARGET",
                                                   help="Hosts and groups (profiles/<host>.yaml, "
                                                        "profiles/groups/<group>.yaml, --inventory); globs "
                                                        "('ct13*'), ranges (ct13[0:5]) and !HOST to leave one out."),
               mode: Optional[str] = ModeOpt,
               dry_run: bool = typer.Option(False, "--dry-run", help="Preflight, plan and diff; change nothing."),
               yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
               force_restart: bool = typer.Option(False, "--force-restart",
                                                  help="Restart and gate even when nothing changed."),
               lock_wait: float = typer.Option(0, "--lock-wait", metavar="SECONDS",
                                               help="Wait this long for another deploy's lock."),
               set_: Optional[list[str]] = SetOpt, as_json: bool = JsonOpt,
               ssh_config: Optional[str] = SshConfigOpt, profiles: Optional[str] = ProfilesOpt,
               inventory: Optional[str] = InventoryOpt,
               canary: int = typer.Option(1, "--canary", min=0, metavar="N", rich_help_panel=_FLEET,
                                          help="Hosts that go first, alone, through the full gate (taken across "
                                               "GPU classes); if one fails nothing else is touched."),
               batch: str = typer.Option("25%", "--batch", metavar="N|P%|RAMP", rich_help_panel=_FLEET,
                                         help="Hosts per wave after the canary, in parallel: 3, 25%, or a ramp "
                                              "1,5,25% whose last step repeats."),
               max_fail: str = typer.Option("0", "--max-fail", metavar="N|P%", rich_help_panel=_FLEET,
                                            help="Failures (rolled back or degraded) allowed before no new host "
                                                 "starts; running hosts always finish."),
               canary_stay: Optional[float] = typer.Option(None, "--canary-stay", metavar="SECONDS",
                                                           rich_help_panel=_FLEET,
                                                           help="The canary's own stay-healthy window "
                                                                "(default: the profile's gate.stay_healthy_s)."),
               skip_refused: bool = typer.Option(False, "--skip-refused", rich_help_panel=_FLEET,
                                                 help="Deploy to the others when preflight refuses some hosts."),
               verbose: bool = typer.Option(False, "--verbose", "-v", rich_help_panel=_FLEET,
                                            help="Every host's own progress lines, prefixed with its name.")) -> int:
    """Converge each TARGET to its profile's mode (or --mode) and prove it healthy, or roll back to
    the known-good release: the last NEXTN release that passed (the profile's rollback.target).

    Exit: 0 serving the new release, 1 failed and rolled back (healthy on known-good),
    2 failed and degraded, 3 refused before any change. A fleet: 0 every host on the new
    release, 1 not every host got it (rolled back, refused or not started) and every host
    serves a known-good release, 2 any host degraded, 3 nothing changed anywhere.

    Example: ddtree-ops deploy ct200 --dry-run

    Example: ddtree-ops deploy ct200 --mode ddtree-shadow --yes

    Example: ddtree-ops deploy a6000 pro6000 --mode dflash --canary 2 --batch 1,25% --max-fail 10% --yes
    """
    from ddtree_ops.deploy import deploy  # the transaction loads pydantic (profiles): only when the command runs

    inv = _common.inventory(profiles, inventory)
    service = _common.service_target(inv, targets)
    if service is not None:
        return _service.deploy(inv, service, mode=mode, overrides=set_ or [], dry_run=dry_run, yes=yes,
                               force_restart=force_restart, lock_wait=lock_wait, as_json=as_json,
                               ssh_config=ssh_config)
    if not _common.is_single(inv, targets):
        from ddtree_ops.fleet_plan import Rollout, parse_batch, parse_budget  # its dataclasses: not for --help

        rollout = Rollout(canary=canary, batch=parse_batch(batch), max_fail=parse_budget(max_fail),
                                canary_stay_s=canary_stay, skip_refused=skip_refused)
        return _fleet.deploy_many(inv, targets, mode=mode, overrides=set_ or [], rollout=rollout, dry_run=dry_run,
                                  yes=yes, force_restart=force_restart, lock_wait=lock_wait, verbose=verbose,
                                  as_json=as_json, ssh_config=ssh_config)
    host = targets[0]
    p = inv.profile(host, set_ or [])
    p.mode(mode or p.desired_mode)  # an unconfigured mode is a usage error before any connection
    with _common.connect(p, ssh_config) as h:
        # the plan is printed when it is decided: before the confirmation, the restart and the gate
        out = deploy(h, p, mode, dry_run=dry_run, assume_yes=yes,
                     confirm=_common.confirm if _common.interactive() and not as_json else None,
                     force_restart=force_restart,
                     lock_wait_s=lock_wait, on_plan=None if as_json else show_plan)
    show(out, as_json=as_json)
    return int(out.exit_code)


def show(out: "Outcome", *, as_json: bool) -> None:
    """The outcome, after the plan (`show_plan`, printed while deploying) and the gate's progress."""
    if as_json:
        output.emit_json(out.to_json())
    else:
        show_outcome(out)


def register(app: typer.Typer) -> None:
    app.command("deploy")(deploy_cmd)
