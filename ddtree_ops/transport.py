"""How a host is reached: the one factory that picks a `Host` implementation by profile.

It sits beside the implementations (`ssh.py`, `local.py`) and above the interface (`host.py`), so
the interface never imports what implements it. Commands reach it through `cli/_common.connector`,
which a caller may replace with its own factory (the contract tests inject a fake Host there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ddtree_ops.host import Host
from ddtree_ops.local import LocalHost
from ddtree_ops.ssh import connect as ssh_connect

if TYPE_CHECKING:
    from ddtree_ops.profile import Profile


def connect(profile: Profile, *, ssh_config: str | None = None, strict: bool | None = None) -> Host:
    """The one connection a command uses for a host, by the profile's `host.transport` (use it as
    a context manager)."""
    if profile.host.transport == "local":
        return LocalHost(profile.name, use_sudo=profile.host.sudo)
    return ssh_connect(profile, ssh_config=ssh_config, strict=strict)
