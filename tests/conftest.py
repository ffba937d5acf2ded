"""Session fixtures shared by every test directory, and what the suite pins about the machine.

`lab`: the lab hosts ct129 and ct200 (real systemd + journald + sshd in nspawn containers, the SGLang
stand-in), brought up once per session if they are not already up, reused if they are, and taken down
at the end only when this session started them and DDTREE_LAB_KEEP is not set. Mark tests that use it
`@pytest.mark.lab`. API (ddtree_ops.lab.api.Lab): `lab.ssh_config`, `lab.hosts`, `lab.grow(n)` (more hosts:
the fleet tests use six), `lab.inventory`, `lab.connect(host)`, `lab.fault(host, name)`, `lab.clear(host)`,
`lab.restore(host)`, `lab.exec(host, argv)`, `lab.env`.

The machine and the day (issue 29): the suite's answer must not depend on who runs it where. Before any
test module is imported, `pin_environment` gives this process and every process it starts the same
environment on every machine: no DDTREE_*/SGLANG_* settings of the operator's own (an exported
DDTREE_OPS_INVENTORY or SGLANG_PLUGINS changed what the CLI and the plugin tests saw), a HOME of its own
(smoke kept NRestarts and golden outputs under ~/.local/state between runs; the tool reads ~/.ssh/config),
an 80-column terminal without colour, UTC and the C.UTF-8 locale. The lab's home and the engine's model
cache are computed from the real HOME first and passed on by name, so their content-keyed caches are kept.
`environment_as_found` hands each test the environment the one before it found (the plugin's check()
left SGLANG_PLUGINS set for the rest of the process); `fixed_control_host` gives the tests that run the
tool in this process one control-host name (a lock taken "on ops1" was judged by pid on a machine called
ops1). The pins are in tests/hermetic.py;
tests/unit/test_hermetic.py holds each one.

`make test` runs the suite in two pytest-xdist workers: every lab test in one group (one worker drives
the lab, in file order), every other file a group of its own (a module's fixtures are built once), the lab
group first so the other worker runs everything else beside it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import tempfile
import time
from typing import Iterator

import labkit
import pytest
from hermetic import CONTROL_HOST, pin_environment


def _carried() -> dict[str, str]:
    """Caches keyed by their content stay where they are: the lab's (its tree is rebuilt only when its
    recipe changes) and the engine's converted model (models.cache_root, under XDG_CACHE_HOME)."""
    from ddtree_ops.lab.paths import lab_home  # reason: the lab's home, read before HOME moves

    return {"DDTREE_LAB_HOME": str(lab_home()),
            "XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")}


def _session_home() -> str:
    home = tempfile.mkdtemp(prefix="ddtree-tests-home-")
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    return home


pin_environment(os.environ, _session_home(), _carried())
time.tzset()


@pytest.fixture(autouse=True)
def environment_as_found() -> Iterator[None]:
    """Each test leaves the next the environment it found. A test that writes os.environ itself (the
    plugin's check() sets SGLANG_PLUGINS for the whole process) changed what every later test in the same
    process, and every process those start, saw: which ran before it, in which worker, decided."""
    before = dict(os.environ)
    yield
    if os.environ != before:
        for name in set(os.environ) - set(before):
            del os.environ[name]
        for name, value in before.items():
            if os.environ.get(name) != value:
                os.environ[name] = value


@pytest.fixture(autouse=True)
def fixed_control_host(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tool's control host (locks, audit lines, operator strings) has one name in every test that
    runs it in this process. Lab tests keep the machine's own: the CLI they start in other processes
    reads it too, and a lock must name the machine its pid lives on."""
    if request.node.get_closest_marker("lab") is None:
        monkeypatch.setattr(socket, "gethostname", lambda: CONTROL_HOST)


# --------------------------------------------------------------------------- scheduling (pytest-xdist)

LAB_GROUP = "lab"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every lab test in one xdist group, in file order, ahead of the rest; every other test in the
    group of its file. Runs before xdist reads the groups (it does so in its own hook, later)."""
    lab = [i for i in items if i.get_closest_marker("lab") is not None]
    rest = [i for i in items if i.get_closest_marker("lab") is None]
    for item in lab:
        item.add_marker(pytest.mark.xdist_group(LAB_GROUP))
    for item in rest:
        item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
    items[:] = lab + rest


_PRIORITY: list[str] = []


def pytest_runtest_setup(item: pytest.Item) -> None:
    """The lab is the run's critical path and mostly waits on processes in its hosts (the stand-in's
    start is CPU work: the real SGLang and torch imports). The worker whose first test is not a lab test
    runs at a lower priority, so those starts are not slowed by the CPU-bound tests beside them."""
    if _PRIORITY or not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    _PRIORITY.append("lab" if item.get_closest_marker("lab") is not None else "beside the lab")
    if _PRIORITY[0] != "lab":
        os.nice(10)


# --------------------------------------------------------------------------- the lab


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
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    reason = _lab_unavailable()
    if reason:
        pytest.skip(reason)
    # the run's own directory, shared by its xdist workers
    split = labkit.second_lab_worker(tmp_path_factory.getbasetemp().parent, os.environ.get("PYTEST_XDIST_WORKER"))
    if split:
        pytest.fail(split, pytrace=False)
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
