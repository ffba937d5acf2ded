"""`ddtree-ops promote TARGET...`: a ddtree-shadow host to the served tree when its shadow says so,
verified live, rolled back to the shadow on a miss (ddtree_ops/promote.py; a fleet through fleet.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import typer

from ddtree_ops import output
from ddtree_ops.cli import _common, _fleet
from ddtree_ops.cli._common import InventoryOpt, JsonOpt, ProfilesOpt, SetOpt, SshConfigOpt
from ddtree_ops.cli._show import show_outcome, show_plan

if TYPE_CHECKING:
    from ddtree_ops.promote import PromoteOutcome

_FLEET = "Fleet (a group or several hosts)"


def promote_cmd(targets: list[str] = typer.Argument(..., metavar="TARGET", help="Hosts and groups, as for deploy."),
                dry_run: bool = typer.Option(False, "--dry-run", help="Decide and show the plan; change nothing."),
                yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
                min_rounds: Optional[int] = typer.Option(None, "--min-rounds", metavar="N", min=20,
                                                         help="Exact greedy rounds the shadow must have counted, "
                                                              "and the tree again live (profile promote.min_rounds, "
                                                              "default 1000)."),
                min_speedup: Optional[float] = typer.Option(None, "--min-speedup", metavar="X", min=1.0,
                                                            help="The projected speedup's one-sided 95% lower "
                                                                 "bound must reach X (promote.min_speedup, 1.05)."),
                live_deadline: Optional[float] = typer.Option(None, "--live-deadline", metavar="SECONDS", min=1,
                                                              help="Bound of the live window in time "
                                                                   "(promote.live_deadline_s, 600)."),
                lock_wait: float = typer.Option(0, "--lock-wait", metavar="SECONDS"),
                set_: Optional[list[str]] = SetOpt, as_json: bool = JsonOpt,
                ssh_config: Optional[str] = SshConfigOpt, profiles: Optional[str] = ProfilesOpt,
                inventory: Optional[str] = InventoryOpt,
                canary: int = typer.Option(1, "--canary", min=0, metavar="N", rich_help_panel=_FLEET,
                                           help="Hosts promoted and verified live first, alone."),
                batch: str = typer.Option("25%", "--batch", metavar="N|P%|RAMP", rich_help_panel=_FLEET),
                max_fail: str = typer.Option("0", "--max-fail", metavar="N|P%", rich_help_panel=_FLEET)) -> int:
    """Promote each ddtree-shadow TARGET to the served DDTree tree when its shadow's verdict says so.

    Before any change it reads the host's /metrics: it promotes only when the verdict is
    promote-tree over at least N exact greedy rounds, the projected speedup's 95% lower bound
    ((tau_tree / tau_chain) / r) is at least X, and the shadow is not silent; otherwise it holds
    or refuses and names why. After the switch a live window checks that the served tau_tree is
    within the tolerance of the shadow's prediction and that the paired test (the tree against its
    own spine, same rounds) does not say keep-chain; a miss, or no data by the deadline, rolls back
    to the ddtree-shadow release.

    Exit: 0 promoted and verified live, 1 missed live and back on ddtree-shadow (healthy), 2
    degraded, 3 held or refused before any change. A fleet: canary first, then waves with a
    failure budget; hosts that are not ready are reported as held, not failed.

    Example: ddtree-ops promote ct200 --dry-run

    Example: ddtree-ops promote pro6000 --canary 1 --batch 2 --yes
    """
    # the transaction loads pydantic (profiles): only when the command runs
    from ddtree_ops.promote import Bar, TREE, check_for_fleet, promote, run_for_fleet

    inv = _common.inventory(profiles, inventory)
    over = dict(min_rounds=min_rounds, min_speedup=min_speedup, live_deadline_s=live_deadline)
    if not _common.is_single(inv, targets):
        # the fleet, its plan and rendering load pydantic and threads: only for a fleet, when it runs
        from ddtree_ops import fleet
        from ddtree_ops.fleet_plan import Rollout, parse_batch, parse_budget
        from ddtree_ops.render import render

        if any(v is not None for v in over.values()):
            set_ = [*(set_ or []), *(f"promote.{k}={v}" for k, v in over.items() if v is not None)]
        hosts = _common.profiles_of(inv, targets, set_ or [])
        for _name, p in hosts:
            p.mode(TREE)  # an unconfigured tree mode is a usage error before any connection
        rollout = Rollout(canary=canary, batch=parse_batch(batch), max_fail=parse_budget(max_fail))
        fleet_targets = [fleet.Target(n, p, render(p, TREE).release_id, f"{p.gpu.model} {p.gpu.arch}", TREE)
                         for n, p in hosts]
        opts = fleet.Options(TREE, rollout, dry_run=dry_run, assume_yes=yes,
                             confirm=_common.confirm if _common.interactive() and not as_json else None,
                             lock_wait_s=lock_wait, check=check_for_fleet, run=run_for_fleet, verb="Promote")
        out = fleet.deploy_fleet(fleet_targets, _common.connector(ssh_config), opts, requested=targets)
        _fleet.show_fleet(out, as_json=as_json)
        return out.exit_code
    p = inv.profile(targets[0], set_ or [])
    p.mode(TREE)
    with _common.connect(p, ssh_config) as h:
        out = promote(h, p, Bar.of(p, **over), dry_run=dry_run, assume_yes=yes,
                      confirm=_common.confirm if _common.interactive() and not as_json else None,
                      lock_wait_s=lock_wait, on_plan=None if as_json else show_decision)
    if as_json:
        output.emit_json(out.to_json())
    else:
        if out.plan is None:
            show_decision(out)
        if out.live is not None:
            colour = "green" if out.live.passed else "bold red"
            output.say(f"[{colour}]live:[/] {output.escape(out.live.reason)}")
        show_outcome(out)
    return int(out.exit_code)


def show_decision(out: "PromoteOutcome") -> None:
    """The decision and its figures, then the plan when it goes ahead."""
    d = out.decision
    if d is not None:
        colour = {"promote": "green", "hold": "yellow"}.get(d.decision, "red")
        output.say(f"[{colour}]{d.decision.upper()}[/] {out.host}: {output.escape(d.reason)}")
    if out.plan is not None:
        show_plan(out)


def register(app: typer.Typer) -> None:
    app.command("promote")(promote_cmd)
