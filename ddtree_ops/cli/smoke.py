"""`ddtree-ops smoke HOST... | --all`: one scheduled check, with monitoring-plugin output."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ddtree_ops import output
from ddtree_ops.cli import _common, _service
from ddtree_ops.cli._common import InventoryOpt, ProfilesOpt
from ddtree_ops.errors import UsageError

HELP = """Check hosts the way a monitoring plugin does, changing nothing on them.

Per host: the unit's state and NRestarts, /health_generate, one smoke /generate (temperature 0)
against the profile's latency budget, the speculative acceptance length against the profile's
floors, and the golden output when one exists. Hosts are checked in parallel.

stdout: one Nagios status line with perfdata, then one block per host (or one JSON document
with --json). Exit: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (a check could not run), worst
state over the hosts in the order CRITICAL > UNKNOWN > WARNING > OK; 64 usage error. A run
that finds another one in progress says so and exits 0.
"""


def register(app: typer.Typer) -> None:
    @app.command("smoke", help=HELP)
    def smoke_cmd(
        hosts: Optional[list[str]] = typer.Argument(
            None, help="Hosts or groups to check (a group is a subset of --all).", show_default=False,
            metavar="TARGET..."),
        all_hosts: bool = typer.Option(False, "--all", help="Check every host (profiles, groups, inventory)."),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON document instead of the Nagios lines."),
        prom_file: Optional[Path] = typer.Option(
            None, "--prom-file", help="Write node_exporter textfile metrics here (atomically).", metavar="PATH"),
        ping_url: Optional[str] = typer.Option(
            None, "--ping-url", help="Dead-man ping base URL: /start before, /<exit code> after.", metavar="URL"),
        ssh_config: Optional[str] = typer.Option(
            None, "--ssh-config", "-F", help="ssh_config file (default: $DDTREE_OPS_SSH_CONFIG, ~/.ssh/config).",
            metavar="FILE"),
        overrides: Optional[list[str]] = typer.Option(
            None, "--set", help="Override a profile key for every host, e.g. smoke.latency_warning_s=3.",
            metavar="KEY=VALUE"),
        record_golden: bool = typer.Option(
            False, "--record-golden",
            help="Keep each host's completion as the golden output later checks must reproduce."),
        jobs: int = typer.Option(0, "--jobs", "-j", min=0, help="Hosts checked at once (0: all; 1: one by one)."),
        state_dir: Optional[Path] = typer.Option(
            None, "--state-dir", help="Where NRestarts and golden outputs are kept between runs.", metavar="DIR"),
        lock_file: Optional[Path] = typer.Option(
            None, "--lock-file", help="Lock that keeps two runs from overlapping (default /run/lock/ddtree-smoke.lock).",
            metavar="PATH"),
        profiles: Optional[str] = ProfilesOpt,
        inventory: Optional[str] = InventoryOpt,
    ) -> int:
        # smoke loads prometheus_client and pydantic (profiles): imported when the command runs
        from ddtree_ops import smoke

        inv = _common.inventory(profiles, inventory)
        services = [n for n in hosts or [] if inv.is_service(n)]
        if services:
            if len(services) != len(hosts or []) or all_hosts:
                raise UsageError("check multi-node services apart from hosts: ddtree-ops smoke SERVICE...")
            return _service.smoke(inv, services, as_json=json_out, ssh_config=ssh_config)
        targets = smoke.load_targets(hosts or [], all_hosts=all_hosts, overrides=overrides or [], profiles=profiles,
                                     inventory=inventory)
        outcome = smoke.run(
            targets, _common.connector(ssh_config),
            lock_path=lock_file or smoke.default_lock_path(), state_dir=state_dir or smoke.default_state_dir(),
            prom_file=prom_file, ping_url=ping_url, jobs=jobs, record_golden=record_golden, warn=output.warn)
        if outcome.skipped:
            output.say(f"skipped: another smoke run holds {outcome.lock_path}"
                       + (f" ({outcome.lock_holder})" if outcome.lock_holder else ""))
        for host, path in outcome.recorded.items():
            output.say(f"{host}: recorded the golden output in {path}")
        if json_out:
            output.emit_json(outcome.document())
        else:
            output.data("\n".join([outcome.summary(), *smoke.detail_lines(outcome.results)]))
        return outcome.exit_code
