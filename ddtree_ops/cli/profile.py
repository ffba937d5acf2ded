"""`ddtree-ops profile show|validate`: the resolved profile, and typo checks before any host is touched."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Optional

import typer

from ddtree_ops import output
from ddtree_ops.cli import _common
from ddtree_ops.cli._common import InventoryOpt, JsonOpt, ProfilesOpt, SetOpt
from ddtree_ops.config.hostnames import compress
from ddtree_ops.errors import ProfileError

if TYPE_CHECKING:
    from ddtree_ops.config.inventory import Inventory
    from ddtree_ops.profile import Profile

profile_app = typer.Typer(help="Show or validate per-host profiles and groups.", no_args_is_help=True)


def _redacted(p: "Profile") -> dict:
    doc = p.resolved()
    doc["service"]["secrets"] = {k: f"<{v.split(':', 1)[0] if ':' in v else 'literal'} reference, redacted>"
                                 for k, v in doc["service"]["secrets"].items()}
    return doc


@profile_app.command("show")
def show(host: str = typer.Argument(..., metavar="HOST|GROUP",
                                    help="A host (profiles/<host>.yaml, or a group member) or a group."),
         set_: Optional[list[str]] = SetOpt, as_json: bool = JsonOpt, profiles: Optional[str] = ProfilesOpt,
         inventory: Optional[str] = InventoryOpt) -> int:
    """Print the resolved profile (defaults + groups + host entry and file + --set), secrets redacted.
    For a group: its hosts, one line each, with what differs between them, and where it is set.

    Example: ddtree-ops profile show ct129 --set memory.context_length=65536

    Example: ddtree-ops profile show a6000
    """
    import yaml  # ~30 ms, for this command's text output only

    inv = _common.inventory(profiles, inventory)
    if inv.is_group(host):
        return _show_group(inv, host, set_ or [], as_json)
    p = inv.profile(host, set_ or [])
    doc = _redacted(p)
    from ddtree_ops.render import inputs_sha256  # the unit's inputs hash per mode: pydantic is loaded already

    # two hashes, two names: the whole resolved profile, and per mode the keys its unit renders
    # from (the unit header's inputs_sha256: a gate or smoke setting changes the first, not the unit)
    doc["profile_sha256"] = p.sha256()
    doc["inputs_sha256"] = {m: inputs_sha256(p, m)[:16] for m in p.configured_modes()}
    if as_json:
        output.emit_json({"command": "profile show", "exit_code": 0, "host": host, "profile": doc})
    else:
        output.data(yaml.safe_dump(json.loads(json.dumps(doc)), sort_keys=False))
    return 0


def _show_group(inv: "Inventory", group: str, overrides: list[str], as_json: bool) -> int:
    from ddtree_ops.config.layers import differences  # yaml (~30 ms): only when the command runs

    hosts = inv.members(group)
    docs = {h: _redacted(inv.profile(h, overrides)) for h in hosts}
    shared, differ = differences(docs)
    origin = {h: inv.sourced(h, overrides).origin for h in hosts}

    def where(h: str, key: str) -> str:
        return origin[h].get(tuple(key.split(".")), "default")

    g = inv.groups.get(group)
    sources = list(dict.fromkeys(g.files if g else []))
    # one row per (key, value): readable at 50 hosts, where one row per host would not be
    values: dict[str, dict[str, list[str]]] = {}
    for h in hosts:
        for key, v in differ[h].items():
            values.setdefault(key, {}).setdefault(_value(v), []).append(h)
    if as_json:
        output.emit_json({"command": "profile show", "exit_code": 0, "group": group, "hosts": hosts,
                          "sources": sources,
                          "shared": shared, "differs": differ,
                          "origin": {h: {k: where(h, k) for k in d} for h, d in differ.items()}})
        return 0
    output.data(f"group {group}: {len(hosts)} host{'s' if len(hosts) != 1 else ''}"
                + (f" (from {', '.join(sources)})" if sources else ""))
    if not hosts:
        return 0
    rows = [("HOST", "GROUPS", "OWN LAYERS")]
    for h in hosts:
        own = [str(inv.host_files[h])] if h in inv.host_files else []
        own += [f"entry at {inv.listed[h]}"] if inv.entries.get(h) else []
        rows.append((h, ",".join(x for x in inv.groups_of(h) if x != "all"), ", ".join(own) or "-"))
    output.data("\n".join(output.table(rows)))
    if not values:
        output.data(f"all {len(hosts)} resolve alike ({len(shared)} keys) apart from their names")
        return 0
    rows = [("KEY", "VALUE", "HOSTS", "SET AT")]
    for key, by_value in values.items():
        for i, (v, hs) in enumerate(by_value.items()):
            rows.append((key if i == 0 else "", v, compress(hs), ", ".join(dict.fromkeys(where(h, key) for h in hs))))
    output.data(f"what differs ({len(values)} of {len(values) + len(shared)} keys):")
    output.data("\n".join(output.table(rows)))
    return 0


def _value(v: object) -> str:
    return json.dumps(v) if not isinstance(v, str) else v


@profile_app.command("validate")
def validate(hosts: Optional[list[str]] = typer.Argument(None, help="Hosts or groups to check (default: all)."),
             set_: Optional[list[str]] = SetOpt, as_json: bool = JsonOpt,
             profiles: Optional[str] = ProfilesOpt, inventory: Optional[str] = InventoryOpt) -> int:
    """Check one or all profiles (group files and the inventory too); every problem is reported with
    its file, line and key path.

    Example: ddtree-ops profile validate
    """
    try:
        inv = _common.inventory(profiles, inventory)
    except ProfileError as exc:  # a broken group file or inventory: every problem, then 64
        for problem in exc.problems:
            output.say(f"[red]error[/] {output.escape(problem)}")
        if as_json:
            output.emit_json({"command": "profile validate", "exit_code": 64, "profiles": {},
                              "problems": exc.problems})
        return 64
    names = inv.resolve(hosts) if hosts else inv.hosts()
    results = {}
    for name in names:
        try:
            p = inv.profile(name, set_ or [])
            results[name] = []
            output.say(f"[green]ok[/]    {name}: modes {', '.join(p.configured_modes())}")
        except ProfileError as exc:
            results[name] = exc.problems
            for problem in exc.problems:
                output.say(f"[red]error[/] {output.escape(problem)}")
    if as_json:
        output.emit_json({"command": "profile validate", "exit_code": 64 if any(results.values()) else 0,
                          "profiles": {k: {"ok": not v, "problems": v} for k, v in results.items()}})
    return 64 if any(results.values()) else 0


def register(app: typer.Typer) -> None:
    app.add_typer(profile_app, name="profile")
