"""`ddtree-ops diagnose HOST` / `ddtree-ops diagnose --log FILE|-`: name the root cause of a failure.

Only typer, the standard library and the tool's light modules are imported here at module level (so
`--help` is instant); the classifier, rich and the SSH layer are imported inside the command.
Exit codes (DESIGN.md): 0 healthy, 1 warnings only, 2 failure found, 3 could not read or no verdict
(inconclusive: nothing failed and nothing showed the server served); 64 usage.
"""

from __future__ import annotations

import sys

import typer

from ddtree_ops import output
from ddtree_ops.cli import _common, _fleet, _service
from ddtree_ops.cli._common import InventoryOpt, JsonOpt, ProfilesOpt, SshConfigOpt
from ddtree_ops.errors import OpsError, UsageError
from ddtree_ops.status import DiagnoseExit


def register(app: typer.Typer) -> None:
    @app.command("diagnose")
    def diagnose(
        host: str | None = typer.Argument(None, metavar="[TARGET]",
                                             help="Host (or group) to diagnose live over SSH."),
        log: str | None = typer.Option(None, "--log", metavar="FILE|-",
                                          help="Classify a saved log or journal (plain, journald text, or "
                                               "`journalctl -o json`); '-' reads stdin."),
        json_out: bool = JsonOpt,
        mode: str | None = typer.Option(None, "--mode", metavar="MODE",
                                           help="With HOST: the mode the unit runs (default: read from its ExecStart)."),
        ssh_config: str | None = SshConfigOpt,
        profiles: str | None = ProfilesOpt,
        inventory: str | None = InventoryOpt,
    ) -> None:
        """Name the root cause of a failed SGLang start: evidence line, remedy, other findings.

        A group: one line per cause, with the hosts that share it.
        Healthy needs evidence that the server served (ready line, decode batches, served requests;
        for a HOST also its health endpoint); without it and without a failure: inconclusive.
        Exit status: 0 healthy, 1 serving with warnings, 2 failure found, 3 could not read or inconclusive.
        """
        if (host is None) == (log is None):
            raise UsageError("give exactly one of HOST or --log FILE|-",
                             hint="ddtree-ops diagnose ct129   or   ddtree-ops diagnose --log journal.txt")
        if log is not None:
            raise typer.Exit(_diagnose_log(log, json_out))
        inv = _common.inventory(profiles, inventory)
        if inv.is_service(host or ""):
            raise typer.Exit(_service.diagnose(inv, host or "", mode=mode, as_json=json_out, ssh_config=ssh_config))
        if not _common.is_single(inv, [host or ""]):
            raise typer.Exit(_fleet.diagnose_many(inv, [host or ""], mode=mode, as_json=json_out,
                                                  ssh_config=ssh_config))
        raise typer.Exit(_diagnose_host(host or "", json_out, mode, ssh_config, profiles, inventory))


def _diagnose_log(path: str, json_out: bool) -> int:
    # the catalogue (yaml, regexes compiled) loads only when a diagnosis runs
    from ddtree_ops.diagnose import report as rpt
    from ddtree_ops.diagnose.classify import CatalogueError, classify_path, classify_stream

    source = "stdin" if path == "-" else path
    try:
        if path == "-":
            result = classify_stream(sys.stdin.buffer)
        else:
            result = classify_path(path)  # a large file has its keyword screen run in worker processes
    except IsADirectoryError:
        output.fail(f"cannot read {source}: it is a directory")
        return DiagnoseExit.UNREADABLE
    except FileNotFoundError:
        output.fail(f"cannot read {source}: no such file")
        return DiagnoseExit.UNREADABLE
    except PermissionError:
        output.fail(f"cannot read {source}: permission denied (journals often need the adm or systemd-journal group)")
        return DiagnoseExit.UNREADABLE
    except OSError as exc:
        output.fail(f"cannot read {source}: {exc.strerror or exc}")
        return DiagnoseExit.UNREADABLE
    except CatalogueError as exc:
        output.fail(f"the signature catalogue is broken: {exc}")
        return DiagnoseExit.UNREADABLE
    if result.lines == 0:
        output.fail(f"{source} is empty: nothing to diagnose")
        return DiagnoseExit.UNREADABLE
    code = rpt.exit_code(result.verdict)
    if json_out:
        output.emit_json({"command": "diagnose", **rpt.to_json(result), "exit_code": int(code)})
    else:
        rpt.render(result, source=source)
    return code


def _diagnose_host(host: str, json_out: bool, mode: str | None, ssh_config: str | None,
                   profiles: str | None, inventory: str | None = None) -> int:
    # the live diagnosis loads the catalogue and pydantic (profiles): only when the command runs
    from ddtree_ops.diagnose import report as rpt
    from ddtree_ops.diagnose.live import diagnose_host

    profile = _common.load(host, profiles=profiles, inventory_file=inventory)  # ProfileError -> 64 with every problem listed
    if mode is not None:
        profile.mode(mode)  # an unconfigured mode is a usage error, said before connecting
    try:
        with _common.connect(profile, ssh_config) as conn:
            diag = diagnose_host(conn, profile, mode)
    except OpsError as exc:
        output.fail(f"{host}: {exc}")
        if exc.hint:
            output.say(f"  hint: {exc.hint}")
        if json_out:
            output.emit_json({"command": "diagnose", "host": host, "verdict": "unreadable", "unreadable": str(exc),
                              "root_cause": None, "exit_code": int(DiagnoseExit.UNREADABLE)})
        return DiagnoseExit.UNREADABLE
    combined = diag.combined()
    code = rpt.exit_code(combined.verdict)
    if json_out:
        output.emit_json({"command": "diagnose", **rpt.to_json(combined, diag), "exit_code": int(code)})
    else:
        rpt.render(combined, source=f"{host} ({profile.service.unit}, this start)", live=diag)
    if diag.unreadable:
        output.fail(f"{host}: {diag.unreadable}: nothing to diagnose")
    for err in diag.errors:
        output.warn(err)
    return code
