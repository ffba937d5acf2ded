"""`ddtree-ops profile show|validate|init`: the resolved profile, typo checks before any host is
touched, and a new host's profile written from what the host reports."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Optional

import typer

from ddtree_ops import output
from ddtree_ops.cli import _common
from ddtree_ops.cli._common import InventoryOpt, JsonOpt, ProfilesOpt, SetOpt, SshConfigOpt
from ddtree_ops.cli._show import show_checks
from ddtree_ops.config.hostnames import compress
from ddtree_ops.errors import ProfileError, UsageError

if TYPE_CHECKING:
    from ddtree_ops.config.inventory import Inventory
    from ddtree_ops.profile import Profile

profile_app = typer.Typer(help="Show, validate or write (init) per-host profiles and groups.", no_args_is_help=True)


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


@profile_app.command("init")
def init(host: str = typer.Argument(..., help="The new host's name (profiles/<host>.yaml)."),
         ssh_host: Optional[str] = typer.Option(None, "--ssh-host", metavar="NAME",
                                                help="Its name in ssh_config, when not HOST."),
         from_: Optional[str] = typer.Option(None, "--from", metavar="PROFILE|GROUP",
                                             help="Layer a group's (or a profile's) settings under the host's facts."),
         model: Optional[str] = typer.Option(None, "--model", metavar="PATH",
                                             help="The target model's directory on the host (default: the running "
                                                  "unit's)."),
         draft: Optional[list[str]] = typer.Option(None, "--draft", metavar="PATH",
                                                   help="A draft's directory on the host (repeatable; default: the "
                                                        "running unit's and those beside the target)."),
         write: bool = typer.Option(True, "--write/--print",
                                    help="Write profiles/<host>.yaml (default), or print it and write nothing."),
         force: bool = typer.Option(False, "--force", help="Replace an existing profiles/<host>.yaml."),
         local: bool = typer.Option(False, "--local", help="The host is this machine (host.transport: local)."),
         as_json: bool = JsonOpt, ssh_config: Optional[str] = SshConfigOpt, profiles: Optional[str] = ProfilesOpt,
         inventory: Optional[str] = InventoryOpt) -> int:
    """Write a new host's profile from what the host reports (GPU, SGLang, a running unit's launch
    line, models and drafts, memory that fits), each value commented with its source; then run
    preflight on it. Exit 0 written and preflight passed, 3 preflight refused or the host lacks a GPU
    or SGLang, 64 bad input (nothing written).

    Example: ddtree-ops profile init ct130 --from a6000

    Example: ddtree-ops profile init gpu7 --model /models/Qwen3-8B --draft /models/Qwen3-8B-DFlash-b16 --print
    """
    # the profile models, the host facts and preflight load pydantic and yaml: only when it runs
    import re
    import tempfile
    from pathlib import Path

    from ddtree_ops import profilegen
    from ddtree_ops.hostfacts import gather
    from ddtree_ops.profile import HostSection, Profile

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", host):
        raise UsageError(f"{host!r} is not a host name (letters, digits, '.', '_' and '-')")
    inv = _common.inventory(profiles, inventory)
    if inv.is_group(host) or inv.is_service(host):
        raise UsageError(f"{host} is a {'group' if inv.is_group(host) else 'service'}, not a host")
    path = inv.directory / f"{host}.yaml"
    if write and path.exists() and not force:
        raise UsageError(f"{path} exists; --force replaces it (--print shows what init would write, changing nothing)")
    base, policy, groups = profilegen.layers(inv, host, from_)
    opts = profilegen.Options(host, ssh_host, local, model, list(draft or []), from_, groups)
    hs = dict(profilegen.get(policy.data, ("host",)) or {})
    hs.update({"transport": "local"} if local else {"ssh_host": ssh_host or hs.get("ssh_host") or host})
    bootstrap = Profile.model_construct(name=host, host=HostSection.model_validate(hs))
    hints = profilegen.hints(policy)
    with _common.connect(bootstrap, ssh_config) as h:
        facts = gather(h, models=[model] if model else hints["models"], drafts=list(draft or []) + hints["drafts"],
                       pythons=hints["pythons"])
        try:
            result = profilegen.build(opts, facts, policy, base)
        except profilegen.Refusal as exc:
            for problem in exc.problems:
                output.fail(output.escape(problem))
            if as_json:
                output.emit_json({"command": "profile init", "host": host, "written": False, "problems": exc.problems})
            return exc.exit_code
        with tempfile.TemporaryDirectory(prefix="ddtree-ops-init-") as tmp:
            p = profilegen.validated(inv, host, result.text, Path(tmp) / f"{host}.yaml")
        if write:
            profilegen.write_profile(path, result.text)
        return _init_report(h, p, result, facts, path if write else None, as_json)


def _init_report(h: Any, p: "Profile", result: Any, facts: Any, path: Any, as_json: bool) -> int:
    """What init found and wrote, the new profile against the running unit, then its preflight."""
    import os

    # preflight, rendering and the plugin wheel load pydantic with the profile: only when init runs
    from ddtree_ops.preflight import run_preflight
    from ddtree_ops.profilegen import compare_running
    from ddtree_ops.releases import Layout
    from ddtree_ops.render import render
    from ddtree_ops.wheel import build

    for w in result.warnings:
        output.warn(output.escape(w))
    counts = ", ".join(f"{n} {k}" for k, n in result.counts().items())
    if path is None:
        if not as_json:
            output.data(result.text)
    else:
        output.say(f"wrote {path} ({counts}); mode {result.mode}")
    missing = {k: "<not set here>" for k, ref in p.service.secrets.items()
               if ref.startswith("env:") and ref[4:] not in os.environ}
    for name in missing:
        output.warn(f"{name} is not set on this machine: preflight runs without it; export it before deploy")
    environ = {**os.environ, **{p.service.secrets[k][4:]: v for k, v in missing.items()}}
    doc: dict[str, Any] = {"command": "profile init", "host": p.name, "written": path is not None,
                           "path": str(path) if path else None, "mode": result.mode,
                           "sources": {".".join(k): v.source for k, v in result.values.items()},
                           "warnings": result.warnings, "profile": result.text}
    unit = result.running
    if unit is not None and unit.argv:
        compared_mode = result.mapped.mode if result.mapped and result.mapped.mode else result.mode
        r = render(p, compared_mode, environ=environ)
        same, argv_diff, env_diff = compare_running(unit, r.argv, r.env_redacted, facts.spec)
        doc.update(running_unit=unit.name, compared_mode=compared_mode, argv_identical=same,
                   argv_differences=argv_diff, env_differences=env_diff)
        if same and not env_diff:
            output.say(f"[green]render --mode {compared_mode}[/] gives the running {unit.name}'s argv and environment "
                       "exactly")
        else:
            output.say(f"render --mode {compared_mode} against the running {unit.name} "
                       f"({'same argv' if same else 'argv differs'}; "
                       f"{'same environment' if not env_diff else 'environment differs'}):")
            for line in [*argv_diff, *env_diff] or ["  the same flags, in another order"]:
                output.say(f"  {output.escape(line)}")
            for note in result.mapped.notes if result.mapped else []:
                output.say(f"  [dim]{output.escape(note.what)}: {output.escape(note.reason)}[/]")
    mode = p.desired_mode
    rendered = render(p, mode, environ=environ)
    plugin = build().version if mode == "ddtree-shadow" else ""
    pf = run_preflight(h, p, mode, rendered, Layout.for_service(p.service.state_dir, p.service.unit), plugin)
    doc["preflight"] = {"mode": mode, **pf.to_json()}
    if as_json:
        output.emit_json(doc)
    else:
        output.say(f"[bold]preflight {p.name}[/] (mode {mode}) on the new profile:")
        show_checks(pf)
        output.say("[green]preflight passed[/]" if pf.ok else "[red]preflight refused[/]")
    return 0 if pf.ok else 3


def register(app: typer.Typer) -> None:
    app.add_typer(profile_app, name="profile")
