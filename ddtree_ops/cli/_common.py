"""Options and helpers shared by the command modules (typer + stdlib only at import time)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Optional

import typer

# the result word of a deploy or rollback, host or service alike
RESULT_COLOUR = {"ok": "green", "no-change": "green", "dry-run": "cyan", "rolled-back": "yellow",
                 "degraded": "bold red", "refused": "red"}

if TYPE_CHECKING:
    from ddtree_ops.inventory import Inventory
    from ddtree_ops.profile import Profile
    from ddtree_ops.host import Host

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


def inventory(profiles: Optional[str] = None, inventory_file: Optional[str] = None) -> "Inventory":
    from ddtree_ops.inventory import Inventory
    from ddtree_ops.profile import profiles_dir

    return Inventory.load(profiles_dir(profiles), inventory_file)


def service_target(inv: "Inventory", names: "list[str] | None") -> str | None:
    """The one multi-node service named, if the targets are a service (profiles/services/<name>.yaml);
    a service among other targets is a usage error: it is one transaction of its own."""
    from ddtree_ops.errors import UsageError

    names = names or []
    services = [n for n in names if inv.is_service(n)]
    if not services:
        return None
    if len(names) > 1:
        raise UsageError(f"{services[0]} is a multi-node service: name it alone (one transaction over its nodes)")
    return services[0]


def load(host: str, overrides: Optional[list[str]] = None, profiles: Optional[str] = None,
         inventory_file: Optional[str] = None) -> "Profile":
    return inventory(profiles, inventory_file).profile(host, overrides or [])


def connect(profile: "Profile", ssh_config: Optional[str]) -> "Host":
    from ddtree_ops.host import connect as host_connect

    return host_connect(profile, ssh_config=ssh_config)


def interactive() -> bool:
    return sys.stdin.isatty() and sys.stderr.isatty() and not os.environ.get("CI")


def confirm(question: str) -> bool:
    return typer.confirm(question, default=False, err=True)
