"""`lab down` leaves nothing behind and `up` works again (runs last in this directory: it takes the
session's lab down and brings back its first two hosts; a later test that needs more grows the lab)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from labkit import SUITE_HOSTS

from ddtree_ops.lab import api, hosts, machine
from ddtree_ops.lab.machine import LabState

# it takes the whole lab down: it waits until no other worker has lab tests left, then holds every host
pytestmark = [pytest.mark.lab, pytest.mark.whole_lab, pytest.mark.hosts(*SUITE_HOSTS)]


def leftovers(lab: Any, names: list[str], pids: list[int], cgroups: list[list[str]]) -> list[str]:
    paths = lab.paths
    found = [f"pid {p} alive" for p in pids if machine.alive(p)]
    found += [f"netns {n}" for n in names if Path(f"/run/netns/{n}").exists()]
    found += [f"link vh-{n}" for n in names if Path(f"/sys/class/net/vh-{n}").exists()]
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True, timeout=10).stdout
    found += [f"route {line}" for line in routes.splitlines() if line.startswith(hosts.SUBNET + ".")]
    found += [f"mount {line.split()[4]}" for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if str(paths.home) in line.split()[4]]
    found += [f"nspawn state {p}" for n in names for p in Path("/run/systemd/nspawn").glob(f"*/{n}")]
    found += [f"nspawn pid {p}" for p in machine.stray_nspawns(paths)]
    found += [f"cgroup {d}" for h in cgroups for d in h if Path(d).exists()]
    for d in Path("/proc").glob("[0-9]*"):  # anything still rooted in a lab host's filesystem
        try:
            if os.readlink(d / "root").startswith(str(paths.run)):
                found.append(f"process {d.name} rooted in the lab")
        except OSError:
            pass
    if paths.run.exists():
        found.append(f"{paths.run} still exists")
    return found


def test_down_leaves_nothing_and_up_works_again(lab: Any) -> None:
    state = LabState.load(lab.paths)
    assert state is not None
    names = list(state.hosts)  # ct129, ct200 and any extra hosts an earlier test booted
    pids = [p for h in state.hosts.values() for p in [h.nspawn_pid or 0, *machine.descendants(h.nspawn_pid or 0)]]
    assert len(pids) > 10  # nspawn, systemd, journald, sshd, the stand-in, ... per host
    cgroups = [h.cgroups for h in state.hosts.values()]
    assert all(cgroups), "each host boots in cgroups of its own"
    took = api.down(lab.paths, log=lambda _m: None)
    assert took < 30
    assert leftovers(lab, names, pids, cgroups) == []
    api.up(lab.paths, hosts=hosts.HOSTS, log=lambda _m: None)  # what the session's own `up` boots
    assert api.is_up(lab.paths, hosts.HOSTS) and lab.hosts == list(hosts.HOSTS)
    for name in lab.hosts:
        with lab.connect(name) as h:
            assert h.run(["systemctl", "is-active", "sglang.service"]).stdout.strip() == "active"
