"""What every command module shares: options, loading the inventory, reaching hosts, confirming.

No command module is imported here, and nothing here imports one: the command modules import this,
`_show`, `_fleet` and `_service`, never each other. At import time only typer, the standard library
and the tool's light modules (errors) load, so `--help` stays instant.

Reaching hosts goes through `connector`: a caller may inject its own Host factory as the command's
`obj` (`cli.app.main(argv, obj=factory)`, the way GCM's health checks inject a fake into their Click
commands); otherwise `transport.connect` picks SSH or local by profile.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import typer
from typer._click.globals import get_current_context  # typer 0.29 carries click as typer._click

from ddtree_ops.errors import ProfileError, UsageError

if TYPE_CHECKING:
    from ddtree_ops.config.inventory import Inventory
    from ddtree_ops.host import Host
    from ddtree_ops.profile import Profile

Connect = Callable[["Profile"], "Host"]

SetOpt = typer.Option(None, "--set", metavar="KEY.PATH=VALUE",
                      help="Override a profile value for this run, e.g. --set memory.mem_fraction_static=0.9 "
                           "(repeatable).")
JsonOpt = typer.Option(False, "--json", help="Print one JSON document on stdout.")
SshConfigOpt = typer.Option(None, "--ssh-config", metavar="FILE", envvar="DDTREE_OPS_SSH_CONFIG",
                            help="ssh_config to resolve host names with (default: $DDTREE_OPS_SSH_CONFIG, "
                                 "then ~/.ssh/config).")
ProfilesOpt = typer.Option(None, "--profiles", metavar="DIR", envvar="DDTREE_OPS_PROFILES",
                           help="Directory holding defaults.yaml, <host>.yaml and groups/<group>.yaml "
                                "(default: ./profiles).")
InventoryOpt = typer.Option(None, "--inventory", "-i", metavar="FILE", envvar="DDTREE_OPS_INVENTORY",
                            help="An Ansible inventory (YAML or INI) naming more hosts and groups "
                                 "(default: $DDTREE_OPS_INVENTORY).")


# --------------------------------------------------------------------------- settings


def inventory(profiles: Optional[str] = None, inventory_file: Optional[str] = None) -> "Inventory":
    # pydantic and yaml load with the inventory: only once a command runs, never for --help
    from ddtree_ops.config.inventory import Inventory
    from ddtree_ops.config.paths import profiles_dir

    return Inventory.load(profiles_dir(profiles), inventory_file)


def load(host: str, overrides: Optional[list[str]] = None, profiles: Optional[str] = None,
         inventory_file: Optional[str] = None) -> "Profile":
    return inventory(profiles, inventory_file).profile(host, overrides or [])


def service_target(inv: "Inventory", names: "list[str] | None") -> str | None:
    """The one multi-node service named, if the targets are a service (profiles/services/<name>.yaml);
    a service among other targets is a usage error: it is one transaction of its own."""
    names = names or []
    services = [n for n in names if inv.is_service(n)]
    if not services:
        return None
    if len(names) > 1:
        raise UsageError(f"{services[0]} is a multi-node service: name it alone (one transaction over its nodes)")
    return services[0]


def is_single(inv: "Inventory", names: Sequence[str]) -> bool:
    """One plain host name (not a group, a glob, a range or an exclusion)."""
    return len(names) == 1 and not inv.is_group(names[0]) and not any(c in names[0] for c in "*?[!")


def profiles_of(inv: "Inventory", names: Sequence[str], overrides: Sequence[str] = ()) -> list[tuple[str, "Profile"]]:
    """Every target's profile, or every problem of every target at once (exit 64, nothing touched)."""
    out, problems = [], []
    for name in inv.resolve(names):
        try:
            out.append((name, inv.profile(name, overrides)))
        except ProfileError as exc:
            problems += exc.problems
    if problems:
        raise ProfileError(list(dict.fromkeys(problems)))
    return out


# --------------------------------------------------------------------------- hosts


def connector(ssh_config: Optional[str]) -> Connect:
    """How this command reaches hosts: the Host factory its caller injected as `obj`, else the real
    transport. Resolved on the command's own thread (the context is thread-local), then handed to
    the threads of a fleet or a service."""
    ctx = get_current_context(silent=True)
    injected = ctx.obj if ctx is not None else None
    if injected is not None:
        if not callable(injected):
            raise TypeError(f"the command's obj must be a Host factory (profile -> Host), got {injected!r}")
        return injected
    # transport loads ssh (http.client, socket, logging: ~60 ms) that --help never needs
    from ddtree_ops.transport import connect as transport_connect

    return lambda p: transport_connect(p, ssh_config=ssh_config)


def connect(profile: "Profile", ssh_config: Optional[str]) -> "Host":
    return connector(ssh_config)(profile)


# --------------------------------------------------------------------------- asking


def interactive() -> bool:
    return sys.stdin.isatty() and sys.stderr.isatty() and not os.environ.get("CI")


def confirm(question: str) -> bool:
    return typer.confirm(question, default=False, err=True)
