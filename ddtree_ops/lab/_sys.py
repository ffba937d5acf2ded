"""Bounded local commands for the lab: every call has a timeout and a clear error."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any, Callable, Mapping, Sequence

from ddtree_ops.errors import OpsError

# command -> the Debian package that ships it (Debian 12)
REQUIRED = {
    "mmdebstrap": "mmdebstrap",              # builds the lab's Debian tree
    "systemd-nspawn": "systemd-container",   # boots the lab hosts
    "ip": "iproute2",                        # one network namespace per host
    "ssh-keygen": "openssh-client",          # the lab's keys
    "sshd": "openssh-server",                # the SSH layer's tests run a real sshd on loopback
    "systemd-analyze": "systemd",            # unit checks (render, schedule)
    "nsenter": "util-linux",
    "mount": "mount",
}
APT_ENV = {"DEBIAN_FRONTEND": "noninteractive"}
APT_FIX = "apt-get install -y " + " ".join(dict.fromkeys(REQUIRED.values()))


class LabError(OpsError):
    """The lab could not be brought up, inspected or taken down."""

    exit_code = 1


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, mounts, systemd-nspawn); run it as root",
                       hint="sudo ddtree-ops lab up")


def _found(name: str) -> bool:
    return shutil.which(name) is not None or os.path.exists(f"/usr/sbin/{name}")


def missing_packages(found: Callable[[str], bool] = _found) -> list[str]:
    """The Debian packages whose commands are not on this machine, in REQUIRED's order."""
    return list(dict.fromkeys(pkg for cmd, pkg in REQUIRED.items() if not found(cmd)))


def install_argv(packages: Sequence[str]) -> list[list[str]]:
    """apt-get steps that install `packages` (run with APT_ENV): fresh lists, then the packages."""
    return [["apt-get", "update", "-qq"],
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]]


def ensure_packages(*, log: Callable[[str], None] = print, found: Callable[[str], bool] = _found,
                    is_root: Callable[[], bool] = lambda: os.geteuid() == 0,
                    execute: Callable[..., Any] | None = None) -> list[str]:
    """Install the lab's missing Debian packages, saying so in one line; returns what was installed
    (nothing when all is there). Not root: one line naming the command to run as root."""
    packages = missing_packages(found)
    if not packages:
        return []
    if not is_root():
        raise LabError(f"the lab needs Debian packages that are not installed ({' '.join(packages)}); "
                       f"as root, run: apt-get install -y {' '.join(packages)}")
    log(f"installing Debian packages for the lab: {' '.join(packages)}")
    env = {**os.environ, **APT_ENV}
    for argv in install_argv(packages):
        (execute or run)(argv, timeout=1200, what=" ".join(argv[:2]), env=env)
    still = missing_packages(found)
    if still:
        raise LabError(f"apt-get finished, but {' '.join(still)} is still missing")
    return packages


def require_tools(log: Callable[[str], None] = print) -> None:
    """What `lab up` needs on this machine, installed when missing (root) or named (not root)."""
    ensure_packages(log=log)


def main(argv: Sequence[str]) -> int:
    """`python -m ddtree_ops.lab._sys packages`: the Makefile's step before the lab and the tests."""
    if list(argv) != ["packages"]:
        sys.stderr.write("usage: python -m ddtree_ops.lab._sys packages\n")
        return 64
    try:
        ensure_packages(log=lambda m: print(m, file=sys.stderr, flush=True))
    except LabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
