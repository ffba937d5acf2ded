"""`ddtree-ops smoke` and the timer against the lab hosts: real sshd, real systemd, the SGLang stand-in.

Uses the session fixture `lab` from tests/conftest.py (`lab.ssh_config`, `lab.fault(host, name)`,
`lab.restore(host)`). Faults take effect at the next start of the service, so each test restarts
the unit itself and, whatever happens, clears the fault and brings the NEXTN service back before it
ends, so the next test finds a healthy host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from ddtree_ops import remote, schedule
from ddtree_ops.host import HttpUnavailable
from ddtree_ops.profile import load_profile
from ddtree_ops.ssh import connect

pytestmark = pytest.mark.lab
DDTREE_OPS = str(Path(sys.executable).parent / "ddtree-ops")


@pytest.fixture(scope="module")
def lab_(request: pytest.FixtureRequest) -> Any:
    """The session `lab`, or a skip while it does not exist yet (not an error in `make test`)."""
    try:
        return request.getfixturevalue("lab")
    except pytest.FixtureLookupError:
        pytest.skip("the lab fixture (tests/conftest.py) is not available")


def smoke(lab: Any, tmp_path: Path, *args: str, ssh_config: str | None = None) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [DDTREE_OPS, "smoke", *args, "--json", "--ssh-config", ssh_config or str(lab.ssh_config),
         "--lock-file", str(tmp_path / "smoke.lock"), "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, timeout=180, env={**os.environ, "NO_COLOR": "1"})
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def host_doc(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(h for h in doc["hosts"] if h["host"] == name)


def wait_for(what: str, pred: Callable[[], bool], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.5)


def answers(host: Any, port: int) -> int | None:
    try:
        return host.http("GET", port, "/health_generate", timeout=3).status
    except HttpUnavailable:
        return None


def restart(lab: Any, name: str, *, until: str = "active") -> None:
    """Restart the service (so an injected fault applies) and wait until the NEW process is
    `active` (ready: its readiness probe passed) or merely `listening` (answers HTTP at all)."""
    p = load_profile(name)
    unit = p.service.unit

    def invocation(host: Any) -> str:
        return host.run(["systemctl", "show", "-p", "InvocationID", "--value", unit]).stdout.strip()

    with connect(p, ssh_config=str(lab.ssh_config)) as host:
        old = invocation(host)
        host.run(remote.reset_failed(unit), sudo=True)
        host.run(remote.restart(unit), sudo=True).check("restarting the service")
        wait_for(f"{name}: a new start of {unit}", lambda: invocation(host) not in ("", old))
        if until == "active":
            wait_for(f"{name}: {unit} active", lambda: host.run(["systemctl", "is-active", unit]).stdout.strip()
                     == "active")
        else:
            wait_for(f"{name}: the new server answering HTTP", lambda: answers(host, p.service.port) is not None)


@pytest.fixture()
def faulty(lab_: Any) -> Iterator[Callable[[str, str], None]]:
    """Inject a fault on a host (applied by a restart); always cleared and restored afterwards."""
    touched: list[str] = []

    def inject(name: str, fault: str) -> None:
        touched.append(name)
        lab_.fault(name, fault)

    yield inject
    for name in touched:
        lab_.restore(name)  # clears the faults and brings the NEXTN service back, healthy


def test_healthy_hosts_are_ok(lab_: Any, tmp_path: Path) -> None:
    rc, doc, err = smoke(lab_, tmp_path, "--all")
    assert rc == 0, (doc["summary"], err)
    assert doc["result"] == "ok"
    for h in doc["hosts"]:
        assert h["mode"] == "nextn"
        assert h["metrics"]["accept_len"] > 1.5
        assert {c["name"]: c["status"] for c in h["checks"]}["health"] == "ok"


def test_accept_collapse_is_critical_with_the_reason(lab_: Any, tmp_path: Path, faulty: Any) -> None:
    faulty("ct129", "accept-collapse")
    restart(lab_, "ct129")
    rc, doc, _ = smoke(lab_, tmp_path, "ct129", "ct200")
    assert rc == 2
    assert "draft path broken" in " ".join(host_doc(doc, "ct129")["reasons"])
    assert doc["summary"].startswith("DDTREE-SMOKE CRITICAL - ct129: accept_len")
    assert host_doc(doc, "ct200")["result"] == "ok"


@pytest.mark.hosts("ct129")
def test_hang_is_critical(lab_: Any, tmp_path: Path, faulty: Any) -> None:
    faulty("ct129", "hang")
    restart(lab_, "ct129", until="listening")
    t0 = time.monotonic()
    rc, doc, _ = smoke(lab_, tmp_path, "ct129", "--set", "gate.http_timeout_s=3")
    assert rc == 2, doc["summary"]
    assert host_doc(doc, "ct129")["result"] == "critical"
    assert time.monotonic() - t0 < 30  # a hung server costs one health timeout, not one per probe


@pytest.mark.hosts("ct129")
def test_stopped_unit_is_critical(lab_: Any, tmp_path: Path) -> None:
    p = load_profile("ct129")
    with connect(p, ssh_config=str(lab_.ssh_config)) as host:
        host.run(["systemctl", "stop", "--", p.service.unit], sudo=True, timeout=120).check("stopping")
    try:
        rc, doc, _ = smoke(lab_, tmp_path, "ct129")
        assert rc == 2
        # SGLang's launcher ends a stop by SIGKILLing itself (kill_process_tree), which systemd
        # records as a failed stop (Result=signal) rather than inactive
        assert host_doc(doc, "ct129")["reasons"][0].startswith(("unit failed", "unit inactive"))
    finally:
        lab_.restore("ct129")


@pytest.mark.hosts()  # ct129's profile at an address nobody answers: no lab host is touched
def test_unreachable_host_is_unknown(lab_: Any, tmp_path: Path) -> None:
    cfg = tmp_path / "ssh_config"
    # an address nobody answers (TEST-NET-1), reached under an alias of its own
    cfg.write_text(Path(lab_.ssh_config).read_text() + "\nHost ct-gone\n  HostName 192.0.2.1\n  ConnectTimeout 1\n")
    rc, doc, _ = smoke(lab_, tmp_path, "ct129", "--set", "host.ssh_host=ct-gone", ssh_config=str(cfg))
    assert rc == 3
    assert host_doc(doc, "ct129")["reasons"][0].startswith("unreachable: ")


@pytest.mark.hosts("ct200")
def test_timer_installed_in_a_lab_host_fires(lab_: Any) -> None:
    """The rendered timer + oneshot service under a real systemd: installed through the same plan
    `schedule install` uses, it fires, the run's output lands in the journal, and it comes out again."""
    p = load_profile("ct200")
    spec = schedule.Spec(every=schedule.parse_every("10s"), executable="/bin/echo", user="root")
    with connect(p, ssh_config=str(lab_.ssh_config)) as host:
        try:
            schedule.apply(schedule.plan(spec), host)
            assert host.run(["systemctl", "is-active", schedule.TIMER]).stdout.strip() == "active"

            def fired() -> bool:
                out = host.run(["journalctl", "-u", schedule.SERVICE, "--no-pager", "-o", "cat"]).stdout
                return "smoke --all" in out

            wait_for("the timer to fire the service", fired, timeout=40)
            show = host.run(["systemctl", "show", "-p", "Result,Type", schedule.SERVICE]).stdout
            assert "Type=oneshot" in show and "Result=success" in show
        finally:
            host.run(["systemctl", "disable", "--now", schedule.TIMER])
            host.run(remote.remove(f"{schedule.UNIT_DIR}/{schedule.SERVICE}", f"{schedule.UNIT_DIR}/{schedule.TIMER}"))
            host.run(remote.daemon_reload())
