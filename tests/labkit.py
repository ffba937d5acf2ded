"""Helpers every lab test shares (tests/lab, tests/fleet, tests/deploy): the CLI run the way an
operator runs it against the lab, and the lab hosts read through the tool's own Host (real SSH).

Imported as `labkit` (tests/ is on sys.path: pytest puts the directory of tests/conftest.py there).
Everything a test reads is inside this repository (test data lives under tests/data).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ddtree_ops.host import HttpUnavailable
from ddtree_ops.lab.hosts import lab_hosts

REPO = Path(__file__).resolve().parents[1]

UNIT = "sglang.service"
PORT = 30000


# --------------------------------------------------------------------------- the CLI against the lab


# The gate's stay-healthy window in the lab: the shipped profiles' 30 s made every rollback the CLI ran
# (`rollback` takes no --set) wait half a minute. The window's own behaviour is tested with the lengths
# each test gives (test_deploy_lab's crash inside the window); elsewhere a restart only needs to settle.
LAB_STAY_S = 2
# ... and its poll: the shipped 0.25 s costs each watched host a systemctl, a journalctl and a health request
# four times a second, for a start the stand-in makes in about 4 s: a ddtree-shadow deploy on ct129 took
# 4.05-4.16 CPU-s at 0.25 s and 3.24-3.49 at 1 s (bench/results/make_test/lab_poll_cpu.txt)
LAB_POLL_S = 1


def lab_profiles() -> Path:
    """The shipped profiles, byte for byte but the window and the poll in defaults.yaml (so every file:line a message
    cites is the shipped one's); made once per process."""
    global _LAB_PROFILES
    if _LAB_PROFILES is None:
        import atexit
        import shutil
        import tempfile

        root = Path(tempfile.mkdtemp(prefix="ddtree-lab-profiles-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        shutil.copytree(REPO / "profiles", root / "profiles")
        defaults = root / "profiles" / "defaults.yaml"
        text, n = re.subn(r"(?m)^(  stay_healthy_s: )30$", rf"\g<1>{LAB_STAY_S}", defaults.read_text())
        assert n == 1, "defaults.yaml's gate.stay_healthy_s is no longer 30: revisit LAB_STAY_S"
        text, n = re.subn(r"(?m)^(  poll_interval_s: )0\.25$", rf"\g<1>{LAB_POLL_S}", text)
        assert n == 1, "defaults.yaml's gate.poll_interval_s is no longer 0.25: revisit LAB_POLL_S"
        defaults.write_text(text)
        _LAB_PROFILES = root / "profiles"
    return _LAB_PROFILES


_LAB_PROFILES: Path | None = None


def env(lab: Any) -> dict[str, str]:
    """The operator's environment for the lab: its ssh_config and inventory, the shipped profiles (with
    the lab's stay window) unless the lab's own env names others."""
    return {**os.environ, "DDTREE_OPS_PROFILES": str(lab_profiles()), **lab.env, "NO_COLOR": "1"}


COMMAND = [sys.executable, "-m", "ddtree_ops"]  # `ddtree-ops`, from the tree under test


def run(lab: Any, *args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    """`ddtree-ops ARGS...` in a process of its own, as an operator types it."""
    return subprocess.run([*COMMAND, *args], capture_output=True, text=True, timeout=timeout, env=env(lab))


def start(lab: Any, *args: str) -> subprocess.Popen[str]:
    """`ddtree-ops ARGS...` started and left running (to be interrupted, or waited for). Its SIGINT is
    the terminal's default, as an operator's is: a pytest-xdist worker ignores SIGINT, and a child
    inherits an ignored signal, so Python would never raise KeyboardInterrupt in it."""
    return subprocess.Popen([*COMMAND, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env(lab), preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def tool(lab: Any, *args: str, timeout: float = 400) -> tuple[int, Any, str]:
    """(exit code, stdout: the one JSON document with --json, else its text, stderr)."""
    proc = run(lab, *args, timeout=timeout)
    try:
        doc = json.loads(proc.stdout) if "--json" in args else proc.stdout
    except json.JSONDecodeError:
        raise AssertionError(f"not one JSON document on stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}") from None
    return proc.returncode, doc, proc.stderr


# --------------------------------------------------------------------------- a lab host, read through Host


def show(host: Any, *props: str, unit: str = UNIT) -> dict[str, str]:
    out = host.run(["systemctl", "show", "-p", ",".join(props), unit], timeout=30).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def restart(host: Any, unit: str = UNIT) -> str:
    """Restart without waiting for readiness; returns the new activation's InvocationID."""
    old = show(host, "InvocationID", unit=unit).get("InvocationID", "")
    host.run(["systemctl", "reset-failed", unit], timeout=30)
    host.run(["systemctl", "restart", "--no-block", unit], timeout=30).check("restart")
    return wait_for("a new invocation", lambda: (inv := show(host, "InvocationID", unit=unit).get("InvocationID", ""))
                    not in ("", old) and inv, timeout=30)


def journal(host: Any, invocation: str) -> str:
    return host.run(["journalctl", f"_SYSTEMD_INVOCATION_ID={invocation}", "-o", "cat", "--no-pager"],
                    timeout=30).stdout


def unit_journal(host: Any, unit: str = UNIT, lines: int = 400) -> str:
    return host.run(["journalctl", "-u", unit, "-n", str(lines), "-o", "cat", "--no-pager"], timeout=30).stdout


def wait_for(what: str, pred: Callable[[], Any], timeout: float = 60.0, step: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(step)


def wait_journal(host: Any, invocation: str, text: str, timeout: float = 60.0) -> str:
    def seen() -> str:
        j = journal(host, invocation)
        return j if text in j else ""

    try:
        return wait_for(f"{text!r} in the journal", seen, timeout=timeout)
    except AssertionError as exc:
        tail = "\n".join(journal(host, invocation).splitlines()[-25:])
        raise AssertionError(f"{exc}; invocation {invocation} ended with:\n{tail}") from None


def health(host: Any, path: str = "/health_generate") -> int | None:
    try:
        return host.http("GET", PORT, path, timeout=5).status
    except HttpUnavailable:
        return None


def generate(host: Any, prompt: str = "The capital of France is", max_new_tokens: int = 32) -> dict[str, Any]:
    resp = host.http("POST", PORT, "/generate", body={"text": prompt, "sampling_params": {
        "temperature": 0, "max_new_tokens": max_new_tokens}}, timeout=20)
    assert resp.status == 200, resp.text
    return resp.json()


# --------------------------------------------------------------------------- a host's own files, and its baseline


# what ddtree-ops keeps or installs on a host: its state directory, the env file and the unit
TOOL_FILES = ("/var/lib/ddtree-ops", "/etc/ddtree-ops", f"/etc/systemd/system/{UNIT}")


def snapshot(lab: Any, host: str) -> dict[str, str]:
    """sha256 of every file the tool keeps or installs on the host, by path: two snapshots equal
    means byte-identical files, none added and none removed."""
    res = lab.exec(host, ["sh", "-c", 'find "$@" -type f -print0 2>/dev/null | sort -z | xargs -0r sha256sum', "sh",
                          *TOOL_FILES])
    return {path: digest for digest, path in (line.split(None, 1) for line in res.stdout.splitlines() if line.strip())}


def back_to_baseline(lab: Any, host: str) -> None:
    """The host on its NEXTN rollback target, healthy, no fault set. `rollback HOST` does nothing
    when it is there already (the common case) and reinstalls it otherwise; a host where nothing
    ever passed (still the lab's hand-made NEXTN unit) is brought there by a NEXTN deploy."""
    lab.clear(host)
    res = run(lab, "rollback", host, "--yes")
    if res.returncode != 0 and f"(pid {os.getpid()})" in res.stderr and "deploy lock held by" in res.stderr:
        # an in-process deploy of an earlier test in this very process lost its connection before it could
        # release the lock (it said so); nothing of ours runs now, so that lock is dead: one failed test
        # must not fail every later test on the host
        run(lab, "lock", "release", host)
        res = run(lab, "rollback", host, "--yes")
    if res.returncode == 3 and "no release has passed" in res.stderr:
        res = run(lab, "deploy", host, "--mode", "nextn", "--yes", "--set", "gate.stay_healthy_s=2")
    assert res.returncode == 0, res.stderr[-3000:]


# --------------------------------------------------------------------------- the lab shared by processes


# every host the suite's lab has once the fleet tests grew it: ct129 and ct200, then the fleet's six
SUITE_HOSTS = tuple(lab_hosts(8))
LOCKS = Path("/run/lock")  # the lab's hosts (netns, machine names) are global to the machine: so are its locks


def _lock_dir() -> Path:
    return LOCKS if LOCKS.is_dir() else Path("/tmp")


def lab_hosts_of(item: Any) -> tuple[str, ...]:
    """The lab hosts a lab test (a pytest item) touches: its (or its module's) `hosts` mark, else the
    first two."""
    from ddtree_ops.lab.hosts import HOSTS

    mark = item.get_closest_marker("hosts")
    return tuple(mark.args) if mark is not None else HOSTS


# The lab tests' pytest-xdist groups follow the hosts the tests hold. A host runs one test at a time
# (`hosts_held`), and ct129 and ct200 each carry about 720 s of tests in a run, the grown hosts (ct130 to ct203:
# the fleet's, the multi-GPU ones) about 550 s (run 37's timeline, waits left out). Grouped by file, the worker
# whose files were all on ct129 waited 304 s of its 812 for the other workers' tests there. So one worker runs
# ct129's tests, one ct200's, and one those on the grown hosts or on none. A test on both ct129 and ct200 needs
# both workers' host: those come after ct129's own, when ct200's group (about 590 s against ct129's 600) is
# done or nearly, so neither waits long for the other; the whole-lab test (it waits for every other worker's
# lab tests) ends ct129's group, the longest.
LAB_GROUPS = ("lab-ct129", "lab-ct200", "lab-grown")


def lab_group(hosts: Sequence[str], whole_lab: bool = False) -> tuple[str, int]:
    """(xdist group, rank in it) of a lab test that holds `hosts`: a group of LAB_GROUPS; in a group, lower
    ranks run first, and tests of one rank keep the order pytest collected them in."""
    held = set(hosts)
    if whole_lab:
        return "lab-ct129", 2
    if held == {"ct129"}:
        return "lab-ct129", 0
    if held == {"ct129", "ct200"}:
        return "lab-ct129", 1
    if held == {"ct200"}:
        return "lab-ct200", 1
    return "lab-grown", 1


def slow_files_first(files: Sequence[str], slow: Sequence[bool]) -> list[int]:
    """The order of the tests beside the lab (given as each test's file and whether it is marked slow), a
    group per file: the files that have a slow test first, then the others, each in collection order.
    xdist hands the groups out in that order, so the long ones start early and the run does not end on one
    that started late (run 44: the stand-in's bench runs, 122 s, started last on the worker beside the lab,
    which ended 34 s after the lab)."""
    heavy = {f for f, s in zip(files, slow) if s}
    return sorted(range(len(files)), key=lambda i: files[i] not in heavy)


def one_host(name: str) -> Any:
    """A parameter naming the one lab host its test touches, which that test holds (and no other)."""
    import pytest

    return pytest.param(name, marks=pytest.mark.hosts(name))


@contextlib.contextmanager
def hosts_held(hosts: Sequence[str], lock_dir: Path | None = None) -> Iterator[None]:
    """Hold the named lab hosts (one flock each, taken in name order so two holders never wait on each
    other crosswise) until the block ends: a test driving a host's service, its faults or its load
    must not meet another test's on the same host, from another worker or another session."""
    held = []
    try:
        for name in sorted(set(hosts)):
            fh = open((lock_dir or _lock_dir()) / f"ddtree-ops-lab-host-{name}.lock", "w")
            held.append(fh)
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield
    finally:
        for fh in reversed(held):
            fh.close()


class LabTests:
    """Lab tests of this process against a test that takes the whole lab down and up (`whole_lab` mark:
    the lifecycle test). A process holds a shared lock from its first lab test until its lab tests run
    out (`running`, `done`); a whole-lab test takes it exclusively, so it starts once no other worker,
    nor another session, has a lab test left to run. Host locks alone cannot say that: a worker holds
    none between two of its tests."""

    def __init__(self, lock_dir: Path | None = None) -> None:
        self.path = (lock_dir or _lock_dir()) / "ddtree-ops-lab-tests.lock"
        self.shared: Any = None

    def running(self) -> None:
        if self.shared is None:
            self.shared = open(self.path, "w")
            fcntl.flock(self.shared, fcntl.LOCK_SH)

    def done(self) -> None:
        if self.shared is not None:
            self.shared.close()
            self.shared = None

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        """The whole lab, once every other process's lab tests are done (this one's own shared hold is
        let go first: a whole-lab test is the last lab test of its group)."""
        self.done()
        with open(self.path, "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield


class LabUse:
    """One process's use of the lab, shared with every other process using it (the run's xdist workers,
    another session): each user holds a shared lock for as long as it uses the lab; the lab is booted
    under an exclusive one (once; a later `up` only boots what is missing); and the run that booted it takes it down
    when its last user leaves, never while another process still uses it."""

    def __init__(self, run_dir: Path, lock_dir: Path | None = None) -> None:
        self.run_dir = run_dir
        locks = lock_dir or _lock_dir()
        self.boot_lock = locks / "ddtree-ops-lab-boot.lock"
        self.users = open(locks / "ddtree-ops-lab-users.lock", "w")
        fcntl.flock(self.users, fcntl.LOCK_SH)

    @property
    def booted_by_this_run(self) -> Path:
        return self.run_dir / "lab-booted-by-this-run"

    def bring_up(self, is_up: Callable[[], bool], up: Callable[[int], Any], count: int) -> None:
        """`up(count)` under the boot lock (it boots only the hosts that are missing); the run that
        found no lab at all is the one that booted it."""
        with open(self.boot_lock, "w") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            if not is_up():
                self.booted_by_this_run.touch()
            up(count)

    def leave(self, down: Callable[[], Any], keep: bool = False) -> bool:
        """Stop using the lab; take it down if this run booted it, `keep` is not set and no other
        process uses it (the last user of the run gets here with nobody else holding the lock).
        Returns whether it went down."""
        try:
            if keep or not self.booted_by_this_run.exists():
                return False
            try:
                fcntl.flock(self.users, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # another user: the last one of this run takes it down
            with open(self.boot_lock, "w") as guard:
                fcntl.flock(guard, fcntl.LOCK_EX)
                down()
                self.booted_by_this_run.unlink(missing_ok=True)
            return True
        finally:
            self.users.close()
