"""Session fixtures shared by every test directory, and what the suite pins about the machine.

`lab`: the lab hosts (real systemd + journald + sshd in nspawn containers, the SGLang stand-in): ct129
and ct200, booted once if they are not up (the tests that need more grow the lab: `lab.grow(6)`),
reused if they are, and taken down by the last process of the run that booted them unless
DDTREE_LAB_KEEP is set (labkit.LabUse). Mark tests that use it `@pytest.mark.lab`, and
`@pytest.mark.hosts(...)` where they touch other hosts than ct129 and ct200 or only one of them: the
test holds those hosts while it runs. API (ddtree_ops.lab.api.Lab): `lab.ssh_config`, `lab.hosts`,
`lab.grow(n)`, `lab.inventory`, `lab.connect(host)`, `lab.fault(host, name)`, `lab.clear(host)`,
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

`make test` runs the suite in four pytest-xdist workers: the lab tests in three groups, by the hosts they
hold (ct129's, ct200's, the grown hosts': `labkit.lab_group`; each test holds the lab hosts it touches,
`hosts` mark), every other file a group of its own (a module's fixtures are built once; the files with
slow tests first), the lab groups first so the fourth worker runs everything else beside them (and the
lab workers too, once their groups are done).
"""

from __future__ import annotations

import atexit
import gc
import json
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
# Collecting imports every test module and makes an item per test, objects that live the whole session,
# and Python's cyclic collector walked them again and again: paused until collection ends, which each
# worker pays (bench/gc_pause_cpu.py, `collect`). The tests themselves run with it on.
gc.disable()


def pytest_collection_finish(session: pytest.Session) -> None:
    gc.enable()


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

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The lab tests ahead of the rest, each in the xdist group of the hosts it holds (`labkit.lab_group`); every
    other test in the group of its file, the files with slow tests first (`labkit.slow_files_first`). Runs
    before xdist reads the groups (it does so in its own hook, later)."""
    lab = [i for i in items if i.get_closest_marker("lab") is not None]
    rest = [i for i in items if i.get_closest_marker("lab") is None]
    place = {id(i): labkit.lab_group(labkit.lab_hosts_of(i), i.get_closest_marker("whole_lab") is not None)
             for i in lab}
    lab.sort(key=lambda i: (labkit.LAB_GROUPS.index(place[id(i)][0]), place[id(i)][1]))  # stable: file order kept
    for item in lab:
        item.add_marker(pytest.mark.xdist_group(place[id(item)][0]))
    files = [item.nodeid.split("::", 1)[0] for item in rest]
    for item, file in zip(rest, files):
        item.add_marker(pytest.mark.xdist_group(file))
    order = labkit.slow_files_first(files, [i.get_closest_marker("slow") is not None for i in rest])
    items[:] = lab + [rest[i] for i in order]


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


# --------------------------------------------------------------------------- where the time went


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--timeline", metavar="PATH", default=None,
                     help="append one JSON line per test phase (worker, test, phase, start, stop, outcome) to "
                          "PATH: bench/make_test_timeline.py reads it (make test PYTEST_ARGS=--timeline=PATH)")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _timeline_line(report.nodeid, report.when, report.start, report.stop, report.outcome)


def _timeline_line(nodeid: str, when: str, start: float, stop: float, outcome: str) -> None:
    if _TIMELINE:
        path, worker = _TIMELINE
        line = json.dumps({"w": worker, "id": nodeid, "when": when, "start": start, "stop": stop, "outcome": outcome})
        with open(path, "a") as fh:  # one short append per line: the workers' lines do not interleave
            fh.write(line + "\n")


_TIMELINE: list[str] = []  # [path, worker] in a process that runs tests and was given --timeline


def pytest_configure(config: pytest.Config) -> None:
    """Only the processes that run tests write: an xdist worker (its id from xdist, not from the
    environment, which a pytest run inside a worker's test inherits) or a run without xdist, never an
    xdist controller, which receives a copy of every report."""
    path = config.getoption("--timeline")
    workerinput = getattr(config, "workerinput", None)
    controller = workerinput is None and getattr(config.option, "dist", "no") != "no"
    if path and not controller:
        _TIMELINE[:] = [os.path.abspath(path), workerinput["workerid"] if workerinput else "main"]


# --------------------------------------------------------------------------- the lab


def _lab_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the lab needs root (network namespaces, mounts, systemd-nspawn)"
    from ddtree_ops.lab import _sys

    missing = _sys.missing_packages()
    if missing:  # `make test` installs them first (python -m ddtree_ops.lab._sys packages)
        return f"the lab needs Debian packages {' '.join(missing)}: apt-get install -y {' '.join(missing)}"
    return None


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The lab, shared by every process of every session that uses it (labkit.LabUse): its first two
    hosts booted once (the tests that need more grow it: the fleet's and the multi-GPU ones, while the
    other worker goes on with the first two), taken down by the last process of the run that booted it."""
    reason = _lab_unavailable()
    if reason:
        pytest.skip(reason)
    from ddtree_ops.lab import api
    from ddtree_ops.lab.hosts import HOSTS

    handle = api.Lab()
    base = tmp_path_factory.getbasetemp()
    # the run's own directory, shared by its xdist workers (a plain run: its own base directory)
    run_dir = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    use = labkit.LabUse(run_dir)
    use.bring_up(lambda: api.is_up(handle.paths), lambda count: api.up(handle.paths, count=count, log=lambda _m: None),
                 len(HOSTS))
    try:
        yield handle
    finally:
        use.leave(lambda: api.down(handle.paths, log=lambda _m: None), keep=bool(os.environ.get("DDTREE_LAB_KEEP")))


_LAB_TESTS = labkit.LabTests()


@pytest.fixture(autouse=True)
def lab_hosts_held(request: pytest.FixtureRequest) -> Iterator[None]:
    """A lab test holds the lab hosts it touches (its `hosts` mark) from before its first fixture to
    after its last: a test of another worker, or of another session, that needs one of them waits. A
    `whole_lab` test first waits until no other process has lab tests left (before any host lock:
    holding those while waiting would stop the tests it waits for)."""
    if request.node.get_closest_marker("lab") is None:
        yield
        return
    if request.node.get_closest_marker("whole_lab") is not None:
        with _LAB_TESTS.alone(), labkit.hosts_held(labkit.lab_hosts_of(request.node)):
            yield
        return
    _LAB_TESTS.running()
    start = time.time()
    with labkit.hosts_held(labkit.lab_hosts_of(request.node)):
        # inside its setup: how long the test waited for another worker's test on its hosts
        _timeline_line(request.node.nodeid, "hostwait", start, time.time(), "passed")
        yield


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """This process's lab tests have run out (pytest-xdist hands a worker a lab group at once, so the
    next item is known): a whole-lab test elsewhere may start."""
    if nextitem is None or nextitem.get_closest_marker("lab") is None:
        _LAB_TESTS.done()
