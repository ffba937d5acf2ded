"""Fleet deploys against six lab hosts of their own (real systemd as PID 1, real sshd, real journald;
the SGLang stand-in), through the CLI an operator types, with an inventory of those six written the
way `lab up` writes the lab's (groups lab, a6000, pro6000, pro6000x2). The hosts are the lab's
third to eighth (ct130, ct201, ct131, ct202, ct132, ct203): the tests of ct129 and ct200 run beside
these in other workers, and a fleet test never waits for them, nor they for it.

Waves over `lab` with `--batch 2`: canary ct130, then [ct201, ct131], [ct202, ct132], [ct203].
Every test deploys a release of its own (`--set service.env.DDTREE_FLEET_TEST=<test>`; NEXTN, so
the hosts stay on the known-good mode for the tests after these) and ends by asking the tool
itself whether any host needs a rollback: none may (each serves its known-good release, healthy,
nothing pending). Faults are cleared on the hosts that have one left, not on all six.
"""

from __future__ import annotations

import json
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from labkit import SUITE_HOSTS, lab_profiles, start, tool

from ddtree_ops.config.inventory import ENV_INVENTORY
from ddtree_ops.lab import hosts as lab_hosts

LAB = list(SUITE_HOSTS)
HOSTS = LAB[2:]  # ct130, ct201, ct131, ct202, ct132, ct203
pytestmark = [pytest.mark.lab, pytest.mark.hosts(*HOSTS)]
WAVES = [["ct130"], ["ct201", "ct131"], ["ct202", "ct132"], ["ct203"]]
A6000 = ["ct130", "ct131", "ct132"]
RUN = secrets.token_hex(3)  # a release of its own for each test of each run (a lab kept up sees the last run's)
SLOW_S = 8  # the slow-start faults' length: the wave is still gated when it is interrupted (~16 s from its pending record)


class FleetLab:
    """The lab as the fleet tests see it: every call goes to the lab, but the tool they run knows the
    fleet's six hosts and no other: its own inventory (the lab's names every host up) and the shipped
    profiles without ct129.yaml and ct200.yaml (a host file is a host too: `rollback` with no HOST
    would read, and act on, the hosts other workers' tests are changing)."""

    def __init__(self, lab: Any, inventory: Path, profiles: Path) -> None:
        self.lab, self.inventory, self.profiles = lab, inventory, profiles

    def __getattr__(self, name: str) -> Any:
        return getattr(self.lab, name)

    @property
    def env(self) -> dict[str, str]:
        return {**self.lab.env, ENV_INVENTORY: str(self.inventory), "DDTREE_OPS_PROFILES": str(self.profiles)}


@pytest.fixture(scope="module")
def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    lab = request.getfixturevalue("lab")
    assert lab.grow(len(LAB))[:len(LAB)] == LAB
    home = tmp_path_factory.mktemp("fleet")
    profiles = shutil.copytree(lab_profiles(), home / "profiles")
    for h in LAB[:2]:
        (profiles / f"{h}.yaml").unlink()
    (home / "fleet.yml").write_text(lab_hosts.inventory_text(HOSTS, "test_fleet_lab"))
    yield FleetLab(lab, home / "fleet.yml", profiles)


@pytest.fixture(autouse=True)
def known_good_at_the_end(fleet: Any) -> Iterator[None]:
    """Every test ends with every host serving a known-good release: the tool itself must find
    nothing to roll back (pending record, not on known-good, or unhealthy)."""
    try:
        yield
    finally:
        for h in HOSTS:
            if fleet.faults(h):  # a fault still set (a process, or a file fault no start used up)
                fleet.clear(h)
    rc, doc, err = tool(fleet, "rollback", "lab", "--json")
    assert (rc, doc["hosts"]) == (0, []), err



# each host's stay-healthy window: these tests are about waves, budgets and interrupts, not the window
# (test_deploy_lab holds that); the slow starts keep a wave running long enough to interrupt
def deploy_args(test: str, *extra: str) -> list[str]:
    return ["deploy", *extra, "--mode", "nextn", "--yes", "--set", "gate.stay_healthy_s=1",
            "--set", f"service.env.DDTREE_FLEET_TEST={test}-{RUN}"]


def by_host(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["host"]: h for h in doc["hosts"]}


def results(doc: dict[str, Any]) -> dict[str, str]:
    return {h["host"]: h["result"] for h in doc["hosts"]}


def invocations(lab: Any, hosts: list[str]) -> dict[str, str]:
    out = {}
    for h in hosts:
        with lab.connect(h) as c:
            out[h] = c.run(["systemctl", "show", "-p", "InvocationID", "--value", "sglang.service"]).stdout.strip()
    return out


def audit_tail(lab: Any, host: str) -> str:
    with lab.connect(host) as c:
        return c.run(["sh", "-c", "tail -n 3 /var/lib/ddtree-ops/sglang/audit.log 2>/dev/null"]).stdout


def assert_untouched(lab: Any, hosts: list[str], before: dict[str, str], doc: dict[str, Any]) -> None:
    """Same start of the service, no lock, not a word of this run's release in the audit log."""
    assert invocations(lab, hosts) == {h: before[h] for h in hosts}
    rc, locks, _ = tool(lab, "lock", "status", *hosts, "--json")
    assert rc == 0 and not any(x["held"] for x in locks["hosts"])
    for h in hosts:
        release = by_host(doc)[h]["target_release"]
        assert release and release not in audit_tail(lab, h)


# ------------------------------------------------------------------ the tests of issue 13, item 6


def test_a_failed_canary_touches_nothing_else(fleet: Any) -> None:
    others = HOSTS[1:]
    before = invocations(fleet, others)
    fleet.fault("ct130", "libcuda-missing")
    rc, doc, err = tool(fleet, *deploy_args("canary", "lab", "--batch", "2", "--max-fail", "100%", "--json"))
    assert rc == 1, err
    assert doc["waves"] == WAVES
    got = by_host(doc)
    assert got["ct130"]["result"] == "rolled-back" and got["ct130"]["wave"] == 0
    assert got["ct130"]["root_cause"]["label"] == "cuda_lib_load"
    assert got["ct130"]["release"] == got["ct130"]["known_good"] != got["ct130"]["target_release"]
    assert {h: got[h]["result"] for h in others} == {h: "skipped" for h in others}
    assert all(got[h]["cause"] == "not started: the canary failed" for h in others)
    assert doc["stopped"] == "the canary failed: nothing else was touched"
    assert_untouched(fleet, others, before, doc)


def test_one_failure_with_max_fail_0_ends_the_rollout_after_its_wave(fleet: Any) -> None:
    later = [*WAVES[2], *WAVES[3]]
    before = invocations(fleet, later)
    fleet.fault("ct131", "libcuda-missing")
    rc, doc, err = tool(fleet, *deploy_args("budget0", "lab", "--batch", "2", "--max-fail", "0", "--json"))
    assert rc == 1, err
    assert results(doc) == {"ct130": "ok", "ct201": "ok", "ct131": "rolled-back", "ct202": "skipped",
                            "ct132": "skipped", "ct203": "skipped"}
    assert doc["stopped"] == "failure budget spent: 1 failed, --max-fail 0 allows 0"
    assert by_host(doc)["ct131"]["deploy"]["rollback_gate"]["passed"] is True
    assert_untouched(fleet, later, before, doc)


def test_max_fail_34_percent_goes_on_past_one_failure(fleet: Any) -> None:
    fleet.fault("ct131", "libcuda-missing")
    rc, doc, err = tool(fleet, *deploy_args("budget34", "lab", "--batch", "2", "--max-fail", "34%", "--json"))
    assert rc == 1, err
    assert doc["rollout"]["allowed_failures"] == 2 and doc["stopped"] is None
    assert results(doc) == {"ct130": "ok", "ct201": "ok", "ct131": "rolled-back", "ct202": "ok", "ct132": "ok",
                            "ct203": "ok"}
    assert doc["counts"] == {"ok": 5, "rolled-back": 1}
    assert "cause cuda_lib_load: ct131" in err


def _start(lab: Any, *args: str) -> subprocess.Popen[str]:
    return start(lab, *args)


def _changed(lab: Any, host: str) -> bool:
    """The host's change has begun: its pending record is written before the unit is touched."""
    with lab.connect(host) as c:
        return c.run(["test", "-f", "/var/lib/ddtree-ops/sglang/pending.json"]).rc == 0


def _wait_changed(lab: Any, proc: subprocess.Popen[str], hosts: list[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not all(_changed(lab, h) for h in hosts):
        assert proc.poll() is None, "".join(s or "" for s in proc.communicate())  # the whole output, not a cut repr
        assert time.monotonic() < deadline, "the wave never began"
        time.sleep(0.3)


def test_ctrl_c_in_a_wave_lets_its_hosts_finish_and_starts_no_other(fleet: Any) -> None:
    later = [*WAVES[2], *WAVES[3]]
    before = invocations(fleet, later)
    for h in WAVES[1]:
        fleet.fault(h, "slow-start", seconds=SLOW_S)  # time to interrupt the wave
    proc = _start(fleet, *deploy_args("ctrlc", "lab", "--batch", "2", "--json"))
    _wait_changed(fleet, proc, WAVES[1])
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err
    doc = json.loads(out)
    assert results(doc) == {"ct130": "ok", "ct201": "ok", "ct131": "ok", "ct202": "skipped", "ct132": "skipped",
                            "ct203": "skipped"}
    assert "SIGINT: no new host will start. Running: ct131, ct201" in err
    assert doc["stopped"] == "interrupted (Ctrl-C / SIGTERM): no new host started"
    assert_untouched(fleet, later, before, doc)


def test_sigterm_twice_rolls_the_running_wave_back(fleet: Any) -> None:
    for h in WAVES[1]:
        fleet.fault(h, "slow-start", seconds=SLOW_S)
    proc = _start(fleet, *deploy_args("term2", "lab", "--batch", "2", "--json"))
    _wait_changed(fleet, proc, WAVES[1])
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err
    got = by_host(json.loads(out))
    assert [got[h]["result"] for h in WAVES[1]] == ["rolled-back", "rolled-back"]
    assert all("interrupted" in got[h]["reason"] for h in WAVES[1])
    assert [got[h]["result"] for h in (*WAVES[2], *WAVES[3])] == ["skipped"] * 3


def test_a_third_interrupt_abandons_and_rollback_finds_the_pending_hosts(fleet: Any) -> None:
    for h in WAVES[1]:
        fleet.fault(h, "slow-start", seconds=SLOW_S)
    proc = _start(fleet, *deploy_args("abandon", "lab", "--batch", "2"))
    _wait_changed(fleet, proc, WAVES[1])
    for _ in range(3):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    left = [h for h in WAVES[1] if _changed(fleet, h)]
    assert left, "an abandoned wave leaves its pending records"
    rc, doc, err = tool(fleet, "rollback", "--yes", "--json")  # no HOST: every host whose last change did not pass
    assert rc == 0, err
    # the hosts with a pending record, and no host outside the abandoned wave; a wave host whose record the
    # second interrupt's rollback had already closed may be caught restarting (not healthy), and is repaired too
    repaired = {h["host"] for h in doc["hosts"]}
    assert set(left) <= repaired <= set(WAVES[1]), (left, repaired)
    assert all(f"{h}: an unfinished" in err for h in left)


def test_two_fleet_deploys_that_share_a_host_the_lock_decides(fleet: Any) -> None:
    fleet.fault("ct201", "slow-start", seconds=SLOW_S)
    first = _start(fleet, *deploy_args("overlap-a", "ct201", "ct202", "--canary", "2", "--json"))
    try:
        _wait_changed(fleet, first, ["ct201"])
        # the second fleet deploy overlaps on ct201: its preflight finds ct201's lock and stops there
        rc, table, err = tool(fleet, *deploy_args("overlap-b", "ct201", "ct131"))
        assert rc == 3, err
        rows = {line.split()[0]: line for line in table.splitlines()[1:]}
        assert rows["ct201"].split()[1:3] == ["-", "refused"]
        assert "deploy lock held by" in rows["ct201"] and "for `deploy ct201 --mode nextn`" in rows["ct201"]
        assert rows["ct131"].split()[2] == "skipped"
        # with --skip-refused it deploys to the other host; the lock still keeps it off ct201
        rc, doc, err = tool(fleet, *deploy_args("overlap-c", "ct201", "ct131", "--skip-refused", "--json"))
        assert rc == 1, err
        assert results(doc) == {"ct201": "refused", "ct131": "ok"}
    finally:
        out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert results(json.loads(out)) == {"ct201": "ok", "ct202": "ok"}


@pytest.mark.parametrize("name,text,problem", [
    ("typo.ini", "[a6000]\nct129\nct130\n\n[lab:chidren]\na6000\n",
     "typo.ini:5 [lab:chidren]: unknown section type (did you mean 'children'?)"),
    ("typo.yml", "all:\n  children:\n    lab:\n      hostz:\n        ct129:\n",
     "typo.yml:4 all.children.lab.hostz: unknown key (did you mean 'hosts'?)"),
])
def test_an_inventory_with_a_typo_is_refused_with_file_and_line(fleet: Any, tmp_path: Path, name: str, text: str,
                                                               problem: str) -> None:
    before = invocations(fleet, HOSTS)
    (tmp_path / name).write_text(text)
    rc, _, err = tool(fleet, *deploy_args("typo", "lab", "--inventory", str(tmp_path / name)))
    assert rc == 64
    assert problem in " ".join(err.split())
    assert invocations(fleet, HOSTS) == before


# ------------------------------------------------------------------ the lab's extra hosts, and every command across a group


def test_the_lab_grows_hosts_of_both_classes_each_in_its_own_namespace(fleet: Any) -> None:
    # the whole lab's status: its exit is 1 while another worker restarts ct129's or ct200's service
    _, status, err = tool(fleet, "lab", "status", "--json")
    rows = {r["name"]: r for r in status["hosts"]}
    assert list(rows)[:len(LAB)] == LAB and status["inventory"] == str(fleet.lab.inventory)
    assert len({r["address"] for r in rows.values()}) == len(rows)
    for h in HOSTS:
        assert Path(f"/run/netns/{h}").exists() and rows[h]["service"] == "active"
        assert rows[h]["pss_mib"] < 400, rows[h]  # cheap: the tree is shared, each host's overlay is small
        # the operator's own ssh, through the one ssh_config `lab up` wrote
        name = subprocess.run(["ssh", "-F", str(fleet.ssh_config), "-o", "BatchMode=yes", h, "hostname"],
                              capture_output=True, text=True, timeout=30)
        assert name.stdout.strip() == h, name.stderr
    # ct203 is one of the lab's two-card hosts (group pro6000x2, for tensor-parallel services)
    for h, cards in (("ct132", ["NVIDIA RTX A6000"]), ("ct203", ["NVIDIA RTX PRO 6000 Blackwell Workstation Edition"] * 2)):
        with fleet.connect(h) as c:
            assert c.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]).stdout.splitlines() == cards
    fleet.fault("ct203", "hang")
    rc, status, _ = tool(fleet, "lab", "status", "--json")
    assert {r["name"]: r["faults"] for r in status["hosts"] if r["name"] in HOSTS} == \
        {h: (["hang"] if h == "ct203" else []) for h in HOSTS}
    rc, doc, err = tool(fleet, "profile", "show", "lab", "--json")
    assert rc == 0 and doc["hosts"] == HOSTS, err
    assert {doc["differs"][h]["gpu.arch"] for h in HOSTS} == {"sm_86", "sm_120"}
    assert doc["origin"]["ct132"]["gpu.arch"].endswith("profiles/groups/a6000.yaml:15")


def test_every_command_across_a_group(fleet: Any, tmp_path: Path) -> None:
    for h in ("ct131", "ct132"):
        fleet.fault(h, "libcuda-missing")
    rc, doc, err = tool(fleet, *deploy_args("across", "a6000", "--canary", "0", "--batch", "100%", "--max-fail", "100%",
                                            "--json"))
    assert rc == 1, err
    assert results(doc) == {"ct130": "ok", "ct131": "rolled-back", "ct132": "rolled-back"}
    rc, diag, err = tool(fleet, "diagnose", "a6000", "--json")
    assert rc == 0, err  # healthy again on known-good; the start before failed: its own line, grouped by cause
    assert [(c["verdict"], c["cause"], c["hosts"]) for c in diag["causes"]] == [
        ("healthy", "previous start: cuda_lib_load", ["ct131", "ct132"]), ("healthy", "-", ["ct130"])]
    assert "libcuda.so.1" in diag["causes"][0]["evidence"]
    rc, hist, err = tool(fleet, "history", "a6000", "--json")
    assert rc == 0, err
    rows = {h["host"]: h for h in hist["hosts"]}
    assert rows["ct130"]["current"] == by_host(doc)["ct130"]["target_release"]
    for h in ("ct131", "ct132"):
        target = rows[h]["rollback_target"]
        assert rows[h]["current"] == target["release_id"] == by_host(doc)[h]["release"]
        assert target["mode"] == "nextn" and rows[h]["last_change"]["outcome"] == "passed"
        assert rows[h]["last"].startswith(f"rollback {target['release_id']} passed")
    # smoke's memory of NRestarts of its own: one left in /tmp by an earlier run would be read
    rc, smoke, err = tool(fleet, "smoke", "a6000", "--json", "--lock-file", str(tmp_path / "smoke.lock"),
                          "--state-dir", str(tmp_path / "smoke-state"))
    assert rc == 0 and [h["host"] for h in smoke["hosts"]] == A6000, err
    rc, table, err = tool(fleet, "lock", "status", "a6000")
    assert rc == 0 and [ln.split()[:2] for ln in table.splitlines()[1:]] == [[h, "free"] for h in A6000]
