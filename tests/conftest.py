"""Session fixtures shared by every test directory.

`lab`: the lab hosts ct129 and ct200 (real systemd + journald + sshd in nspawn containers, the SGLang
stand-in), brought up once per session if they are not already up, reused if they are, and taken down
at the end only when this session started them and DDTREE_LAB_KEEP is not set. Mark tests that use it
`@pytest.mark.lab`. API (ddtree_ops.lab.api.Lab): `lab.ssh_config`, `lab.hosts`, `lab.grow(n)` (more hosts:
the fleet tests use six), `lab.inventory`, `lab.connect(host)`, `lab.fault(host, name)`, `lab.clear(host)`,
`lab.restore(host)`, `lab.exec(host, argv)`, `lab.env`.
"""

from __future__ import annotations

import os
from typing import Iterator

import pytest


def _lab_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the lab needs root (network namespaces, mounts, systemd-nspawn)"
    from ddtree_ops.lab import _sys

    missing = _sys.missing_packages()
    if missing:  # `make test` installs them first (python -m ddtree_ops.lab._sys packages)
        return f"the lab needs Debian packages {' '.join(missing)}: apt-get install -y {' '.join(missing)}"
    return None


def _lock_path(home: "os.PathLike[str]") -> str:
    # the lab's hosts (netns and machine names) are global to the machine, whatever DDTREE_LAB_HOME
    # a session uses (CI runs with a fresh one): one lock for the machine, not one per lab home
    return "/run/lock/ddtree-ops-lab-tests.lock" if os.path.isdir("/run/lock") else os.path.join(home, "tests.lock")


@pytest.fixture(scope="session")
def lab() -> Iterator[object]:
    reason = _lab_unavailable()
    if reason:
        pytest.skip(reason)
    import fcntl

    from ddtree_ops.lab import api

    handle = api.Lab()
    # one test session drives the lab at a time: faults and restarts from another would race ours
    handle.paths.home.mkdir(parents=True, exist_ok=True)
    guard = open(_lock_path(handle.paths.home), "w")
    try:
        fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("\nwaiting for another test session to finish with the lab ...", flush=True)
        fcntl.flock(guard, fcntl.LOCK_EX)
    started = not api.is_up(handle.paths)
    if started:
        api.up(handle.paths, log=lambda _m: None)
    try:
        yield handle
    finally:
        if started and not os.environ.get("DDTREE_LAB_KEEP"):
            api.down(handle.paths, log=lambda _m: None)
        guard.close()


