"""`ddtree-ops profile show|validate`: the resolved profile, and typo checks before any host is touched."""

from __future__ import annotations

from typing import Optional

import typer

from ddtree_ops.cli._common import JsonOpt, ProfilesOpt, SetOpt

profile_app = typer.Typer(help="Show or validate per-host profiles.", no_args_is_help=True)


@profile_app.command("show")
def show(host: str = typer.Argument(..., help="Host name (profiles/<host>.yaml)."),
         set_: Optional[list[str]] = SetOpt, as_json: bool = JsonOpt, profiles: Optional[str] = ProfilesOpt) -> int:
    """Print the resolved profile (defaults + host file + --set), secrets redacted.

    Example: ddtree-ops profile show ct129 --set memory.context_length=65536
    """
    import json

    import yaml

    from ddtree_ops import output
    from ddtree_ops.cli._common import load

    p = load(host, set_, profiles)
    doc = p.resolved()
    doc["service"]["secrets"] = {k: f"<{v.split(':', 1)[0] if ':' in v else 'literal'} reference, redacted>"
                                 for k, v in doc["service"]["secrets"].items()}
    doc["profile_sha256"] = p.sha256()
    if as_json:
        output.emit_json({"command": "profile show", "host": host, "profile": doc})
    else:
        output.data(yaml.safe_dump(json.loads(json.dumps(doc)), sort_keys=False))
    return 0


@profile_app.command("validate")
def validate(hosts: Optional[list[str]] = typer.Argument(None, help="Hosts to check (default: all)."),
             set_: Optional[list[str]] = SetOpt, as_json: bool = JsonOpt,
             profiles: Optional[str] = ProfilesOpt) -> int:
    """Check one or all profiles; every problem is reported with its file, line and key path.

    Example: ddtree-ops profile validate
    """
    from rich.markup import escape

    from ddtree_ops import output
    from ddtree_ops.cli._common import load
    from ddtree_ops.errors import ProfileError
    from ddtree_ops.profile import available_hosts, profiles_dir

    names = hosts or available_hosts(profiles_dir(profiles))
    results = {}
    for name in names:
        try:
            p = load(name, set_, profiles)
            results[name] = []
            output.say(f"[green]ok[/]    {name}: modes {', '.join(p.configured_modes())}")
        except ProfileError as exc:
            results[name] = exc.problems
            for problem in exc.problems:
                output.say(f"[red]error[/] {escape(problem)}")
    if as_json:
        output.emit_json({"command": "profile validate",
                          "profiles": {k: {"ok": not v, "problems": v} for k, v in results.items()}})
    return 64 if any(results.values()) else 0


def register(app: typer.Typer) -> None:
    app.add_typer(profile_app, name="profile")
