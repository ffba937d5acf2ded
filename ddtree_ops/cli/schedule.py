"""`ddtree-ops schedule print|install`: run `smoke` every few minutes from the control machine."""

from __future__ import annotations

from typing import Optional

import typer

from ddtree_ops import output

sub = typer.Typer(help="Schedule smoke checks on this (control) machine: a systemd timer, or a cron line.",
                  no_args_is_help=True)

EVERY = typer.Option("5m", "--every", help="Period: 15s, 5m, 1h ... (must divide the minute, hour or day).")
HOSTS = typer.Option(None, "--hosts", help="Hosts or groups to check (repeat, or comma-separated); default: --all.",
                     metavar="HOST")
PROM = typer.Option(None, "--prom-file", help="Textfile for node_exporter, passed to smoke.", metavar="PATH")
PING = typer.Option(None, "--ping-url", help="Dead-man ping base URL, passed to smoke.", metavar="URL")
SSHCFG = typer.Option(None, "--ssh-config", "-F", help="ssh_config the runs use (default: as smoke finds it now).",
                      metavar="FILE")
USER = typer.Option(None, "--user", help="Run the checks as this user (default: the one who ran sudo, or you).")


def _spec(every: str, hosts: Optional[list[str]], prom_file: Optional[str], ping_url: Optional[str],
          ssh_config: Optional[str], user: Optional[str]):  # noqa: ANN202 - schedule.Spec, imported lazily
    # schedule loads the smoke package, the inventory pydantic: imported when the command runs
    from ddtree_ops import schedule
    from ddtree_ops.config.inventory import Inventory

    names = [h for item in hosts or [] for h in item.split(",") if h]
    if names:
        Inventory.load().resolve(names)  # hosts and groups; an unknown name is a usage error now, not at 3 a.m.
    return schedule.default_spec(every, hosts=names, prom_file=prom_file, ping_url=ping_url,
                                 ssh_config=ssh_config, user=user)


@sub.command("print")
def print_cmd(
    cron: bool = typer.Option(False, "--cron", help="Print a crontab line (flock -n) instead of the units."),
    every: str = EVERY, hosts: Optional[list[str]] = HOSTS, prom_file: Optional[str] = PROM,
    ping_url: Optional[str] = PING, ssh_config: Optional[str] = SSHCFG, user: Optional[str] = USER,
) -> int:
    """Print the timer and service units (or the cron line); changes nothing."""
    from ddtree_ops import schedule  # the smoke package (prometheus_client): not for --help

    spec = _spec(every, hosts, prom_file, ping_url, ssh_config, user)
    if cron:
        output.data(schedule.cron_line(spec))
        return 0
    output.data("\n".join(f"# ---- {schedule.UNIT_DIR}/{name}\n{text}" for name, text in schedule.units(spec).items()))
    return 0


@sub.command("install")
def install_cmd(
    every: str = EVERY, hosts: Optional[list[str]] = HOSTS, prom_file: Optional[str] = PROM,
    ping_url: Optional[str] = PING, ssh_config: Optional[str] = SSHCFG, user: Optional[str] = USER,
    root: Optional[str] = typer.Option(None, "--root", help="Write the units under this directory instead "
                                       "(no systemctl); works without systemd.", metavar="DIR"),
    enable: bool = typer.Option(True, "--enable/--no-enable", help="Start the timer now and at boot."),
) -> int:
    """Verify, write and enable ddtree-smoke.timer + ddtree-smoke.service (needs systemd and root)."""
    from ddtree_ops import schedule  # the smoke package (prometheus_client): not for --help

    spec = _spec(every, hosts, prom_file, ping_url, ssh_config, user)
    plan = schedule.install(spec, root=root, enable=enable)
    for step in plan.describe():
        output.say(f"  {step}")
    if root:
        output.say(f"units written under {root}; on the target: systemctl daemon-reload && "
                   f"systemctl enable --now {schedule.TIMER}")
    else:
        output.say(f"{schedule.TIMER} installed: every {spec.every} as {spec.user}; "
                   f"see `systemctl list-timers {schedule.TIMER}` and `journalctl -u {schedule.SERVICE}`")
    return 0


def register(app: typer.Typer) -> None:
    app.add_typer(sub, name="schedule")
