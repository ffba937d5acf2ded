"""Bounded local commands for the lab: every call has a timeout and a clear error."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Mapping, Sequence

from ddtree_ops.errors import OpsError

APT_FIX = "apt-get install -y debootstrap systemd-container openssh-server openssh-client iproute2"
# command -> the Debian package that ships it
REQUIRED = {
    "debootstrap": "debootstrap",
    "systemd-nspawn": "systemd-container",
    "ip": "iproute2",
    "ssh-keygen": "openssh-client",
    "nsenter": "util-linux",
    "mount": "mount",
}


class LabError(OpsError):
    """The lab could not be brought up, inspected or taken down."""

    exit_code = 1


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, mounts, systemd-nspawn); run it as root",
                       hint="sudo ddtree-ops lab up")


def missing_tools(names: Sequence[str] = tuple(REQUIRED)) -> list[str]:
    return [n for n in names if shutil.which(n) is None and not os.path.exists(f"/usr/sbin/{n}")]


def require_tools() -> None:
    missing = missing_tools()
    if missing:
        pkgs = sorted({REQUIRED[m] for m in missing})
        raise LabError(f"missing {', '.join(missing)} (Debian packages: {' '.join(pkgs)})",
                       hint=f"{APT_FIX}")


def run(argv: Sequence[str], *, timeout: float, check: bool = True, what: str | None = None,
        env: Mapping[str, str] | None = None, input: bytes | None = None) -> subprocess.CompletedProcess[str]:
    """Run one local command with a deadline; a non-zero exit raises LabError unless check=False."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, timeout=timeout, env=dict(env) if env else None,
                              input=input, check=False)
    except subprocess.TimeoutExpired:
        raise LabError(f"{what or argv[0]} timed out after {timeout:g}s ({' '.join(argv)[:200]})") from None
    except FileNotFoundError:
        raise LabError(f"{argv[0]} is not installed", hint=APT_FIX) from None
    out = subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode("utf-8", "replace"),
                                      proc.stderr.decode("utf-8", "replace"))
    if check and proc.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
        raise LabError(f"{what or ' '.join(argv)[:120]} failed (exit {proc.returncode}): {' | '.join(tail)}")
    return out
