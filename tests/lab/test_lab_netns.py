"""Lab host names are global to the machine: a network namespace of a host's name may be left by a
lab that is gone, or belong to a lab that is running under another DDTREE_LAB_HOME (a CI run on a
machine where a developer's lab is up). `up` removes the first and refuses the second; `down`
(also the cleanup of a failed `up`) never removes the second.

Real network namespaces (iproute2, as root), under a name no lab host uses; no containers.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from ddtree_ops.lab import machine
from ddtree_ops.lab._sys import LabError
from ddtree_ops.lab.paths import Paths

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")

NAME = "ddt-nstest"


def _host(tmp_path: Path) -> machine.HostState:
    return machine.HostState(name=NAME, address="10.254.254.9", netns=NAME, veth="vh-ddt-nstest",
                             root=str(tmp_path / "root"))


def _exists() -> bool:
    return Path(f"/run/netns/{NAME}").exists()


@pytest.fixture
def namespace() -> Iterator[None]:
    subprocess.run(["ip", "netns", "add", NAME], check=True, capture_output=True)
    yield
    subprocess.run(["ip", "netns", "del", NAME], check=False, capture_output=True)


@pytest.fixture
def occupant(namespace: None) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["ip", "netns", "exec", NAME, "sleep", "120"])
    try:
        for _ in range(50):  # until `ip netns pids` sees it
            if machine.netns_pids(NAME):
                break
            subprocess.run(["sleep", "0.1"])
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_namespace_left_by_a_lab_that_is_gone_is_removed_before_boot(namespace: None, tmp_path: Path) -> None:
    assert _exists() and machine.netns_pids(NAME) == []
    machine.claim_netns(_host(tmp_path))
    assert not _exists()


def test_a_namespace_another_running_lab_uses_is_refused_and_left_alone(occupant: subprocess.Popen[bytes],
                                                                         tmp_path: Path) -> None:
    with pytest.raises(LabError) as err:
        machine.claim_netns(_host(tmp_path))
    assert "another lab on this machine is running this host" in str(err.value)
    assert str(occupant.pid) in str(err.value) or "pids" in str(err.value)
    assert _exists()


def test_down_never_removes_a_running_labs_namespace(occupant: subprocess.Popen[bytes], tmp_path: Path) -> None:
    paths = Paths(home=tmp_path)
    problems = machine.stop_host(paths, _host(tmp_path))  # never booted here: nspawn_pid is None
    assert problems == []
    assert _exists() and occupant.poll() is None


def test_down_removes_its_own_namespace(namespace: None, tmp_path: Path) -> None:
    h = _host(tmp_path)
    h.nspawn_pid = 2 ** 22 + 1  # booted by this lab once; the process is gone
    assert machine.stop_host(Paths(home=tmp_path), h) == []
    assert not _exists()
