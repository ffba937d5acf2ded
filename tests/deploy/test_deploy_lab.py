"""deploy / rollback against the lab hosts: real sshd, real systemd as PID 1, real journald.

Every scenario ends with a known-good unit serving; each test leaves the host on its NEXTN
rollback target with no fault set, so the order of tests does not matter. The fixture returns a
host to that state with `rollback HOST`, which does nothing when the host is already there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from labkit import back_to_baseline, run, wait_for

from ddtree_ops.deploy import deploy
from ddtree_ops.host import HostKeyError, HostUnreachable, SudoPasswordRequired
from ddtree_ops.lab.hosts import HOSTS, inventory_text
from ddtree_ops.observe import unit_state
from ddtree_ops.profile import load_profile
from ddtree_ops.releases import Layout, read_state
from ddtree_ops.ssh import connect
from ddtree_ops.status import DeployExit

pytestmark = [pytest.mark.lab, pytest.mark.hosts("ct129")]
REPO = Path(__file__).resolve().parents[2]
FAST = ["gate.stay_healthy_s=2"]
STATE = "/var/lib/ddtree-ops/sglang"  # the service's state directory on the host (its lock, pending.json)


def prof(host: str, *extra: str) -> Any:
    return load_profile(host, overrides=[*FAST, *extra], directory=REPO / "profiles")


def cli(lab: Any, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return run(lab, *args, timeout=timeout)


def layout_of(p: Any) -> Layout:
    return Layout.for_service(p.service.state_dir, p.service.unit)


def assert_known_good_serving(lab: Any, host: str) -> None:
    """NEXTN serves healthy with nothing pending, and, once anything passed there, it is the
    rollback target that is installed."""
    p = prof(host)
    with connect(p, ssh_config=str(lab.ssh_config)) as h:
        u = unit_state(h, p.service.unit)
        assert u.running, u.describe()
        assert h.http("GET", p.service.port, "/health_generate", timeout=10).status == 200
        state = read_state(h, layout_of(p))
        target = state.target(p)
        assert target is None or state.current == target.release_id, (state.current, target)
        assert state.pending is None
        info = h.http("GET", p.service.port, "/server_info", timeout=10).json()
        assert info["speculative_algorithm"] in ("NEXTN", "EAGLE"), info["speculative_algorithm"]


@pytest.fixture
def ct129(lab: Any) -> Any:
    """ct129 on its NEXTN rollback target before and after the test, whatever the test did. Checked
    before each test, not only after the last one of this module: the other lab worker's tests use
    ct129 between two of these (each leaves it healthy, not necessarily on the tool's release)."""
    back_to_baseline(lab, "ct129")
    yield "ct129"
    back_to_baseline(lab, "ct129")
    assert_known_good_serving(lab, "ct129")


def test_story_attempt_1_refused_by_preflight_and_nothing_changes(lab: Any, ct129: str) -> None:
    p = prof(ct129, "memory.context_length=131072", "memory.mem_fraction_static=0.88")
    with connect(p, ssh_config=str(lab.ssh_config)) as h:
        before = h.get(f"/etc/systemd/system/{p.service.unit}")
        pid = unit_state(h, p.service.unit).main_pid
        out = deploy(h, p, "ddtree-shadow", assume_yes=True)
        assert out.exit_code == DeployExit.REFUSED
        mem = next(c for c in out.preflight.checks if c.name == "memory")
        assert mem.status == "fail" and "524,288" in mem.detail and "memory.context_length=" in mem.detail
        assert h.get(f"/etc/systemd/system/{p.service.unit}") == before
        assert unit_state(h, p.service.unit).main_pid == pid
        assert read_state(h, layout_of(p)).pending is None


def test_crash_at_start_fails_fast_names_the_cause_and_rolls_back(lab: Any, ct129: str) -> None:
    lab.fault(ct129, "libcuda-missing")
    res = cli(lab, "deploy", ct129, "--mode", "ddtree-shadow", "--yes", "--json", *sum((["--set", s] for s in FAST), []))
    assert res.returncode == DeployExit.ROLLED_BACK, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert doc["schema_version"] == 1 and doc["result"] == "rolled-back"
    assert doc["diagnosis"]["root_cause"]["label"] == "cuda_lib_load"
    assert "libcuda.so.1" in doc["diagnosis"]["root_cause"]["evidence"]
    assert doc["gate"]["elapsed_s"] < 30  # failed on the crash line, not at the 900 s deadline
    assert doc["rollback_gate"]["passed"]
    # the human report names the cause and the remedy on stderr
    lab.fault(ct129, "libcuda-missing")
    human = cli(lab, "deploy", ct129, "--mode", "ddtree-shadow", "--yes", *sum((["--set", s] for s in FAST), []))
    assert human.returncode == DeployExit.ROLLED_BACK
    assert "root cause: cuda_lib_load" in human.stderr and "remedy:" in human.stderr


def test_crash_after_ready_inside_the_stay_window(lab: Any, ct129: str) -> None:
    lab.fault(ct129, "crash-after-ready", seconds=4)  # dies 4 s after it is ready: inside a 10 s window
    p = prof(ct129, "gate.stay_healthy_s=10")
    with connect(p, ssh_config=str(lab.ssh_config)) as h:
        out = deploy(h, p, "dflash", assume_yes=True)
    assert out.exit_code == DeployExit.ROLLED_BACK, out.reason
    assert out.gate.state.ready_at is not None  # it was ready, then died inside the window
    lab.clear(ct129)


def test_never_ready_fails_at_the_deadline(lab: Any, ct129: str) -> None:
    lab.fault(ct129, "hang")
    p = prof(ct129, "gate.startup_deadline_s=12")
    with connect(p, ssh_config=str(lab.ssh_config)) as h:
        out = deploy(h, p, "dflash", assume_yes=True)
    assert out.exit_code == DeployExit.ROLLED_BACK, out.reason
    assert "not ready after 12s" in out.reason


def test_rollback_whose_own_gate_fails_exits_2_and_says_so(lab: Any, ct129: str) -> None:
    lab.fault(ct129, "libcuda-missing", every_start=True)  # breaks the NEXTN baseline's start too
    p = prof(ct129)
    with connect(p, ssh_config=str(lab.ssh_config)) as h:
        out = deploy(h, p, "dflash", assume_yes=True)
    assert out.exit_code == DeployExit.DEGRADED
    assert "ALSO FAILED" in out.reason
    assert out.rollback_gate is not None and not out.rollback_gate.passed


def test_two_deploys_at_once_one_is_refused(lab: Any, ct129: str) -> None:
    env = {**os.environ, "DDTREE_OPS_SSH_CONFIG": str(lab.ssh_config)}
    args = [sys.executable, "-m", "ddtree_ops", "deploy", ct129, "--mode", "dflash", "--yes",
            "--set", "gate.stay_healthy_s=3"]
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    # the second starts once the first holds the lock (it holds it through the restart, start-up and window)
    wait_for("the first deploy's lock", lambda: first.poll() is None and lab.exec(
        ct129, ["test", "-e", f"{STATE}/lock/info.json"]).returncode == 0, timeout=60, step=0.2)
    second = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    first_out = first.communicate(timeout=240)
    assert second.returncode == DeployExit.REFUSED, second.stderr
    assert "deploy lock held by" in second.stderr
    assert first.returncode == DeployExit.OK, first_out[1][-2000:]


# `rollback` with no HOST reads every host it knows: here an inventory of ct129 and ct200 (the lab's own names
# every host up, the fleet's too, whose tests run beside these), and the test holds both
@pytest.mark.hosts("ct129", "ct200")
def test_control_process_killed_mid_gate_is_resolved_by_the_next_rollback(lab: Any, ct129: str, tmp_path: Path) -> None:
    env = {**os.environ, "DDTREE_OPS_SSH_CONFIG": str(lab.ssh_config)}
    lab.fault(ct129, "slow-start", seconds=4)  # the rollback below gates this start to its end: not 16 s more
    proc = subprocess.Popen([sys.executable, "-m", "ddtree_ops", "deploy", ct129, "--mode", "dflash", "--yes"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    # killed once the gate waits on the new start: its pending record written, the unit activating
    wait_for("the deploy to be gated", lambda: proc.poll() is None and lab.exec(ct129, ["sh", "-c", (
        f"test -e {STATE}/pending.json && systemctl is-active sglang.service; true")]).stdout.strip() == "activating",
        timeout=120, step=0.2)
    proc.send_signal(signal.SIGKILL)  # the control machine "dies": no cleanup at all
    proc.wait()
    p = prof(ct129)
    with connect(p, ssh_config=str(lab.ssh_config)) as h:
        pending = read_state(h, layout_of(p)).pending
        assert pending and pending["action"] == "deploy"
    lab.clear(ct129)
    (tmp_path / "two.yml").write_text(inventory_text(HOSTS, "test_deploy_lab"))
    # no HOST: acts on the host whose deploy did not finish, and on no other
    res = cli(lab, "rollback", "--yes", "--inventory", str(tmp_path / "two.yml"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "ct129: rolling back" in res.stderr and "did not finish" in res.stderr
    assert "ct200: rolling back" not in res.stderr


class DroppingHost:
    """A real SSH host whose connection is cut once, right after the step that writes the unit
    file into place and before systemd is told (the middle of the install)."""

    def __init__(self, inner: Any, unit_path: str) -> None:
        import base64

        self._inner, self.name, self._cut = inner, inner.name, True
        self._marker = b"W " + base64.b64encode(unit_path.encode())

    def run(self, argv: Any, *, stdin: bytes | None = None, **kw: Any) -> Any:
        res = self._inner.run(argv, stdin=stdin, **kw)
        if self._cut and stdin and self._marker in stdin:
            self._cut = False
            self._inner._client.close()  # a real drop: the transport goes away
        return res

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_ssh_drop_mid_install_reconnects_and_rolls_back(lab: Any, ct129: str) -> None:
    p = prof(ct129)
    unit_path = f"/etc/systemd/system/{p.service.unit}"
    with connect(p, ssh_config=str(lab.ssh_config)) as h:
        pid = unit_state(h, p.service.unit).main_pid
        out = deploy(DroppingHost(h, unit_path), p, "dflash", assume_yes=True)
    assert out.exit_code == DeployExit.ROLLED_BACK, out.reason
    assert "connection dropped while installing" in out.reason
    with connect(p, ssh_config=str(lab.ssh_config)) as h:
        assert read_state(h, layout_of(p)).pending is None
        assert b"mode=nextn" in h.get(unit_path)  # the known-good unit is back in place
        assert unit_state(h, p.service.unit).main_pid != pid  # the rollback restarted the known-good unit
    assert_known_good_serving(lab, ct129)


def test_full_disk_while_writing_the_unit_leaves_no_partial_file(lab: Any, ct129: str) -> None:
    unit_dir = "/etc/systemd/system"
    # a 2 MiB filesystem holding a copy of the unit directory, filled up, mounted over it
    lab.exec(ct129, ["sh", "-c", f"mkdir -p /run/full && mount -t tmpfs -o size=2m tmpfs /run/full && "
                                 f"cp -a {unit_dir}/. /run/full/ && "
                                 "dd if=/dev/zero of=/run/full/.filler bs=64k 2>/dev/null; "
                                 f"mount --bind /run/full {unit_dir}"])
    try:
        p = prof(ct129)
        with connect(p, ssh_config=str(lab.ssh_config)) as h:
            before = h.get(f"{unit_dir}/{p.service.unit}")
            out = deploy(h, p, "dflash", assume_yes=True)
            assert out.exit_code == DeployExit.ROLLED_BACK, out.reason
            assert "No space left" in out.reason or "failed" in out.reason
            assert h.get(f"{unit_dir}/{p.service.unit}") == before
            assert h.get(f"{unit_dir}/{p.service.unit}.ddtree-new") is None
    finally:
        lab.exec(ct129, ["sh", "-c", f"umount {unit_dir}; umount /run/full"])


@pytest.mark.hosts()  # refused at the SSH handshake: the host's service is not touched
def test_changed_host_key_is_refused_before_anything(lab: Any, tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    text = Path(lab.ssh_config).read_text()
    orig_kh = next(line.split(None, 1)[1] for line in text.splitlines() if "UserKnownHostsFile" in line)
    lines = Path(orig_kh.strip()).read_text().splitlines()
    # same names, someone else's key
    other = next(ln for ln in lines if ln.startswith("ct200") or "10.200.0.200" in ln).split()
    forged = [f"{ln.split()[0]} {other[1]} {other[2]}" if ("ct129" in ln.split()[0] or "10.200.0.129" in ln.split()[0])
              else ln for ln in lines]
    kh.write_text("\n".join(forged) + "\n")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(text.replace(orig_kh.strip(), str(kh)))
    with pytest.raises(HostKeyError, match="HOST KEY CHANGED"):
        connect(prof("ct129"), ssh_config=str(cfg))
    res = cli(lab, "deploy", "ct129", "--yes", "--ssh-config", str(cfg))
    assert res.returncode == 3 and "HOST KEY CHANGED" in res.stderr


def test_sudo_that_needs_a_password_is_refused_before_any_change(lab: Any, ct129: str) -> None:
    lab.exec("ct129", ["sh", "-c", "id deploy >/dev/null 2>&1 || useradd -m deploy; "
                                   "mkdir -p ~deploy/.ssh && cp /root/.ssh/authorized_keys ~deploy/.ssh/ && "
                                   "chown -R deploy ~deploy/.ssh; echo 'deploy ALL=(ALL) ALL' > /etc/sudoers.d/deploy"])
    p = prof("ct129", "host.sudo=true")
    cfg = Path(lab.ssh_config).read_text().replace("User root", "User deploy")
    alt = Path(lab.ssh_config).with_name("ssh_config.deploy-user")
    alt.write_text(cfg)
    with connect(p, ssh_config=str(alt)) as h:
        with pytest.raises(SudoPasswordRequired, match="sudo needs a password"):
            deploy(h, p, "dflash", assume_yes=True)
    assert_known_good_serving(lab, "ct129")


@pytest.mark.hosts()  # an address no lab host has
def test_unreachable_host_is_refused_with_exit_3(lab: Any, tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.write_text("Host ct129\n  HostName 10.200.0.250\n  ConnectTimeout 2\n")
    res = cli(lab, "deploy", "ct129", "--yes", "--ssh-config", str(cfg), timeout=60)
    assert res.returncode == 3 and "cannot connect" in res.stderr
    with pytest.raises(HostUnreachable):
        connect(prof("ct129"), ssh_config=str(cfg))


# ct200's: last in this file, so that at the start of `make test` this worker drives ct129 while another drives ct200
@pytest.mark.hosts("ct200")
def test_deploy_ddtree_shadow_passes_then_is_a_no_op(lab: Any) -> None:
    res = cli(lab, "deploy", "ct200", "--mode", "nextn", "--yes", "--set", "gate.stay_healthy_s=2")
    assert res.returncode == 0, res.stderr[-2000:]
    p = prof("ct200")
    with connect(p, ssh_config=str(lab.ssh_config)) as h:
        out = deploy(h, p, "ddtree-shadow", assume_yes=True)
        assert out.exit_code == DeployExit.OK, out.reason
        assert out.gate is not None and out.gate.passed and out.gate.state.smoke.accept_len > 1
        pid = unit_state(h, p.service.unit).main_pid
        state = read_state(h, layout_of(p))
        # it passed and is recorded so; the rollback target stays the NEXTN release that passed
        assert out.release_id in state.passed and state.current == out.release_id
        assert state.target(p) is not None and state.target(p).mode == "nextn"
        again = deploy(h, p, "ddtree-shadow", assume_yes=True)
        assert again.result == "no-change" and again.exit_code == 0
        assert unit_state(h, p.service.unit).main_pid == pid  # not restarted
        info = h.http("GET", p.service.port, "/server_info").json()
        assert info["speculative_algorithm"] == "DDTREE"
    # back to the NEXTN baseline the way an operator would: roll back to it
    res = cli(lab, "rollback", "ct200", "--yes")
    assert res.returncode == 0, res.stderr[-2000:]
    assert_known_good_serving(lab, "ct200")
