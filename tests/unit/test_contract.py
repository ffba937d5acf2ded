"""The deploy and rollback contract of DESIGN.md, held without root: exit codes and the `--json`
document, through the CLI an operator types, against a fake Host injected as the command's `obj`.

    deploy/rollback exit: 0 serving the new release and healthy; 1 failed, rolled back, healthy on
    known-good; 2 failed and degraded; 3 refused before any change; Ctrl-C before any change: 130.

The transaction under test is the real one (lock, preflight, release records, install, gate,
rollback); only the host is a fake (tests/unit/fakehost.py): files, one systemd unit, its journal
and HTTP in memory. The same commands against real systemd and sshd are the lab suite's
(tests/deploy/test_deploy_lab.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fakehost import FakeHost, cli_runner, records, shipped_profiles

from ddtree_ops.profile import Profile, load_profile
from ddtree_ops.render import render

HOST = "ct129"
UNIT = "/etc/systemd/system/sglang.service"
# every deploy or rollback document carries these (DESIGN.md "Contracts"; cli/_show renders them)
FIELDS = {"schema_version", "command", "host", "mode", "release_id", "result", "exit_code", "reason", "known_good",
          "attempt", "plan", "preflight", "gate", "rollback_gate", "diagnosis", "evidence", "timings_s",
          "ssh_round_trips", "events"}


@pytest.fixture
def profiles(tmp_path: Path) -> Path:
    """The shipped profiles, with ct129's stay-healthy window at 0 s: holding a window is the lab's
    to test; here what counts is which way each outcome goes."""
    return shipped_profiles(tmp_path / "profiles", HOST, "\ngate:\n  stay_healthy_s: 0\n")


@pytest.fixture
def profile(profiles: Path) -> Profile:
    return load_profile(HOST, directory=profiles)


@pytest.fixture
def host(profile: Profile) -> FakeHost:
    """ct129 as it was before the tool: the NEXTN service installed by hand, running, healthy."""
    return FakeHost.serving(profile, "nextn")


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], profiles: Path, host: FakeHost) -> Any:
    """`ddtree-ops ARGS --profiles DIR` with the fake host injected as the command's obj; returns
    (exit code, the JSON document or None, stderr)."""

    return cli_runner(capsys, profiles, host)


def deploy(cli: Any, mode: str, *extra: str) -> tuple[int, Any, str]:
    return cli("deploy", HOST, "--mode", mode, "--yes", "--json", *extra)


def rollback(cli: Any, *extra: str) -> tuple[int, dict[str, Any], str]:
    rc, doc, err = cli("rollback", HOST, "--json", "--yes", *extra)
    assert doc["schema_version"] == 1 and doc["command"] == "rollback" and len(doc["hosts"]) == 1, doc
    assert doc["exit_code"] == rc
    return rc, doc["hosts"][0], err


def release_of(p: Profile, mode: str) -> str:
    return render(p, mode).release_id


def contract(doc: dict[str, Any], rc: int, result: str) -> None:
    """The document's shape, and its exit code the process's (a rollback's host entry sits in a
    document whose schema_version `rollback()` checked)."""
    fields = FIELDS - {"schema_version"} if doc.get("command") == "rollback" else FIELDS
    assert doc["command"] in ("deploy", "rollback")
    assert fields <= set(doc), fields - set(doc)
    assert doc.get("schema_version", 1) == 1
    assert (rc, doc["exit_code"], doc["result"]) == (rc, rc, result), (doc["result"], doc["reason"])


# ------------------------------------------------------------------ deploy


def test_a_deploy_that_passes_exits_0_and_the_rollback_target_stays_the_nextn_baseline(
        cli: Any, host: FakeHost, profile: Profile) -> None:
    rc, doc, _ = deploy(cli, "dflash")
    contract(doc, rc, "ok")
    assert rc == 0
    rid = release_of(profile, "dflash")
    assert (doc["command"], doc["host"], doc["mode"], doc["release_id"]) == ("deploy", HOST, "dflash", rid)
    assert doc["gate"]["passed"] is True and doc["rollback_gate"] is None
    assert doc["preflight"]["ok"] is True and doc["diagnosis"] is None
    # an experimental release that passed its gate is recorded as passed, but what a failure (or
    # `rollback`) returns to stays the NEXTN release that passed: the adopted baseline
    rec = records(host)
    assert rec["current"] == rid and rec["pending"] is None
    assert rec["known_good"] == doc["known_good"] and rec["known_good"].startswith("baseline-")
    assert [(a.action, a.release_id, a.outcome) for a in rec["attempts"]] == [
        ("adopt", rec["known_good"], "adopted"), ("deploy", rid, "passed")]
    assert rec["attempts"][-1].id == doc["attempt"] and rec["attempts"][-1].mode_source == "--mode"
    assert host.text(UNIT) == render(profile, "dflash").unit_text


def test_a_deploy_whose_gate_fails_is_rolled_back_and_exits_1_healthy_on_known_good(
        cli: Any, host: FakeHost, profile: Profile) -> None:
    host.broken = {"dflash"}
    rc, doc, err = deploy(cli, "dflash")
    contract(doc, rc, "rolled-back")
    assert rc == 1
    baseline = doc["known_good"]
    assert baseline.startswith("baseline-")  # the service installed by hand, adopted on the first deploy
    assert doc["gate"]["passed"] is False and doc["rollback_gate"]["passed"] is True
    assert doc["diagnosis"]["root_cause"]["label"] == "cuda_lib_load"
    assert any("libcuda.so.1" in line for line in doc["evidence"])
    assert "which is healthy again" in doc["reason"]
    # the host serves the known-good unit again, recorded as current, with nothing pending
    rec = records(host)
    assert (rec["known_good"], rec["current"], rec["pending"]) == (baseline, baseline, None)
    assert [(a.action, a.outcome) for a in rec["attempts"]] == [("adopt", "adopted"), ("deploy", "failed"),
                                                                 ("rollback", "passed")]
    assert "cuda" in rec["attempts"][1].cause.lower() or "libcuda" in rec["attempts"][1].cause
    assert host.text(UNIT) == render(profile, "nextn").unit_text and host.unit.running
    assert "rolling back to" in err


def test_a_deploy_whose_rollback_fails_too_exits_2_degraded(
        cli: Any, host: FakeHost) -> None:
    host.broken = {"dflash", "nextn"}  # the baseline serves now; its next start fails as well
    rc, doc, err = deploy(cli, "dflash")
    contract(doc, rc, "degraded")
    assert rc == 2
    assert doc["gate"]["passed"] is False and doc["rollback_gate"]["passed"] is False
    assert "ALSO FAILED" in doc["reason"]
    assert not host.unit.running
    assert "IS DEGRADED" not in err  # --json: the document alone on stdout; stderr has the progress only


def test_a_deploy_refused_by_preflight_exits_3_and_changes_nothing(
        cli: Any, host: FakeHost) -> None:
    host.flags_refused = "launch_server.py: error: unrecognized arguments: --speculative-ddtree-budget 32"
    before = dict(host.files)
    rc, doc, _ = deploy(cli, "dflash")
    contract(doc, rc, "refused")
    assert rc == 3
    assert doc["gate"] is None and doc["preflight"]["ok"] is False
    assert [c["name"] for c in doc["preflight"]["checks"] if c["status"] == "fail"] == ["launch-flags"]
    assert "unrecognized arguments" in doc["reason"]
    assert host.changed_files(before) == [] and host.starts == 1  # nothing written, nothing restarted


def test_a_deploy_refused_by_a_held_lock_exits_3_and_changes_nothing(
        cli: Any, host: FakeHost) -> None:
    lock = "/var/lib/ddtree-ops/sglang/lock/info.json"
    host.files[lock] = json.dumps({"by": "alice@ops1", "pid": 4242, "since": "2026-12-01T10:00:00Z",
                                   "command": "deploy ct129 --mode dflash", "control_host": "ops1"}).encode()
    before = dict(host.files)
    rc, doc, err = deploy(cli, "dflash")
    # refused before the transaction began: the error's own document, with the contract's keys
    assert rc == 3 and (doc["command"], doc["exit_code"], doc["schema_version"]) == ("deploy", 3, 1)
    assert "deploy lock held by alice@ops1 (pid 4242)" in err and "--lock-wait" in err
    assert host.changed_files(before) == [] and host.starts == 1


def test_ctrl_c_while_the_new_release_is_gated_rolls_back_and_exits_1(
        cli: Any, host: FakeHost) -> None:
    host.interrupt = "gate"
    rc, doc, err = deploy(cli, "dflash")
    contract(doc, rc, "rolled-back")
    assert rc == 1
    assert doc["reason"].startswith("interrupted (Ctrl-C) after the unit was changed")
    assert doc["rollback_gate"]["passed"] is True
    rec = records(host)
    assert rec["pending"] is None and host.unit.running
    assert [(a.action, a.outcome) for a in rec["attempts"]][-2:] == [("deploy", "interrupted"), ("rollback", "passed")]
    assert "interrupted" in host.text("/var/lib/ddtree-ops/sglang/audit.log").lower()
    assert "rolling back to the known-good release" in err


def test_ctrl_c_before_any_change_exits_130_and_changes_nothing(
        cli: Any, host: FakeHost) -> None:
    host.interrupt = "preflight"
    before = dict(host.files)
    rc, doc, _ = deploy(cli, "dflash")
    assert (rc, doc) == (130, None)
    # the lock it took is released again, and the host is as it was
    assert host.changed_files(before) == [] and host.starts == 1
    assert any(c.startswith("rm -rf -- /var/lib/ddtree-ops/sglang/lock") for c in host.commands)


def test_a_deploy_cut_off_mid_change_is_finished_by_the_next_one(
        cli: Any, host: FakeHost, profile: Profile) -> None:
    """A deploy that died after installing its release (its pending record left on the host) is
    resolved first by the next deploy: its attempt ends interrupted, and a resume attempt gates it."""
    assert deploy(cli, "nextn", "--force-restart")[0] == 0  # records the baseline as known-good
    rid = release_of(profile, "dflash")
    r = render(profile, "dflash")
    host.files[r.unit_path], host.files[r.env_path] = r.unit_text.encode(), r.env_text.encode()
    root = "/var/lib/ddtree-ops/sglang"
    host.files[f"{root}/releases/{rid}/unit"], host.files[f"{root}/releases/{rid}/env"] = (
        r.unit_text.encode(), r.env_text.encode())
    host.files[f"{root}/releases/{rid}/meta.json"] = json.dumps({"release_id": rid, "mode": "dflash"}).encode()
    host.files[f"{root}/attempts.jsonl"] += (json.dumps(
        {"event": "start", "attempt": "a-cut", "action": "deploy", "release_id": rid, "mode": "dflash",
         "by": "bob@ops1", "at": "2026-12-01T10:00:00Z"}) + "\n").encode()
    host.files[f"{root}/pending.json"] = json.dumps({"release_id": rid, "action": "deploy", "by": "bob@ops1",
                                                    "attempt": "a-cut", "pid": 7,
                                                    "started_at": "2026-12-01T10:00:00Z"}).encode()
    rc, doc, err = deploy(cli, "dflash")
    assert rc == 0 and "did not finish" in err
    assert doc["events"] == [f"finished the interrupted deploy: {rid} passed the gate"]
    rec = records(host)
    assert (rec["current"], rec["pending"]) == (rid, None)
    by_id = {a.id: a for a in rec["attempts"]}
    assert by_id["a-cut"].outcome == "interrupted"
    assert [(a.action, a.release_id, a.outcome) for a in rec["attempts"]][-1] == ("resume", rid, "passed")


# ------------------------------------------------------------------ rollback


def test_a_rollback_that_passes_exits_0_on_the_known_good_release(
        cli: Any, host: FakeHost, profile: Profile) -> None:
    deploy(cli, "dflash")
    baseline = next(k.split("/")[-2] for k in host.files if "/releases/baseline-" in k and k.endswith("/unit"))
    rc, doc, _ = rollback(cli, "--to", baseline)
    contract(doc, rc, "ok")
    assert rc == 0 and doc["release_id"] == baseline and doc["mode"] == "nextn" and doc["gate"]["passed"] is True
    rec = records(host)
    assert (rec["known_good"], rec["current"], rec["pending"]) == (baseline, baseline, None)
    assert host.text(UNIT) == render(profile, "nextn").unit_text


def test_a_target_whose_files_were_put_back_by_hand_is_rolled_back_not_trusted(
        cli: Any, host: FakeHost, profile: Profile) -> None:
    """The NEXTN files written back by hand over a passing experiment: the files match the target, but the
    record says another release is current, and the process serving may still be that release's (files
    are read at the next start). `rollback` restarts and gates the target, and the record then names it;
    a no-op here left `current` on the experiment for every later command."""
    from ddtree_ops.transaction import env_path_of

    deploy(cli, "dflash")
    baseline = next(k.split("/")[-2] for k in host.files if "/releases/baseline-" in k and k.endswith("/unit"))
    stored = next(k for k in host.files if k.endswith(f"/releases/{baseline}/unit")).removesuffix("/unit")
    host.files[UNIT], host.files[env_path_of(profile)] = host.files[f"{stored}/unit"], host.files[f"{stored}/env"]
    starts = host.starts
    rc, doc, _ = rollback(cli)
    contract(doc, rc, "ok")
    assert doc["release_id"] == baseline and doc["gate"]["passed"] is True and host.starts == starts + 1
    assert records(host)["current"] == baseline
    rc, doc, _ = rollback(cli)  # now the record and the files agree: nothing to do
    contract(doc, rc, "no-change")
    assert host.starts == starts + 1


def test_a_rollback_that_fails_its_gate_exits_2_degraded(cli: Any, host: FakeHost) -> None:
    deploy(cli, "dflash")
    host.broken = {"nextn"}  # the rollback target (the NEXTN baseline) fails its next start
    rc, doc, _ = rollback(cli)
    contract(doc, rc, "degraded")
    assert rc == 2
    assert doc["gate"]["passed"] is False and doc["diagnosis"]["root_cause"]["label"] == "cuda_lib_load"
    assert doc["reason"].startswith("rollback to baseline-")


def test_a_rollback_with_nothing_to_return_to_is_refused_with_exit_3(
        cli: Any, host: FakeHost) -> None:
    before = dict(host.files)
    rc, doc, _ = rollback(cli)
    contract(doc, rc, "refused")
    assert rc == 3 and "no release has passed on this host" in doc["reason"]
    assert host.changed_files(before) == [] and host.starts == 1


def test_the_human_output_names_the_outcome_on_stderr_and_keeps_stdout_empty(
        cli: Any, host: FakeHost) -> None:
    host.broken = {"dflash", "nextn"}
    rc, doc, err = cli("deploy", HOST, "--mode", "dflash", "--yes")
    assert (rc, doc) == (2, None)
    assert "DEGRADED ct129 dflash:" in err and "ct129 IS DEGRADED:" in err
    assert "root cause: cuda_lib_load" in err


# ------------------------------------------------------------------ a refusal changes nothing


@pytest.mark.parametrize("setup, args, why", [
    (None, ("deploy", HOST, "--json"), "pass --yes"),  # off a terminal: the first contact adopts nothing
    ("flags", ("deploy", HOST, "--yes", "--json"), "preflight"),
    ("lock", ("deploy", HOST, "--yes", "--json"), "deploy lock held"),
    (None, ("deploy", HOST, "--dry-run", "--json"), "dry run"),
    (None, ("rollback", HOST, "--yes", "--json"), "no release has passed"),
    ("passed", ("rollback", HOST, "--json"), "pass --yes"),  # a rollback asks as a deploy does
    ("passed", ("rollback", HOST, "--dry-run", "--json"), "dry run"),
    ("passed", ("deploy", HOST, "--mode", "nextn", "--json"), "pass --yes"),
    ("legacy", ("deploy", HOST, "--json"), "pass --yes"),  # older records are migrated only by a change
])
def test_every_refusal_leaves_the_hosts_files_byte_identical(cli: Any, host: FakeHost, setup: str | None,
                                                             args: tuple[str, ...], why: str) -> None:
    root = "/var/lib/ddtree-ops/sglang"
    if setup == "flags":
        host.flags_refused = "launch_server.py: error: unrecognized arguments: --bogus"
    elif setup == "lock":
        host.files[f"{root}/lock/info.json"] = json.dumps({"by": "alice@ops1", "pid": 4242, "since": "x",
                                                          "command": "deploy", "control_host": "ops1"}).encode()
    elif setup == "passed":
        assert deploy(cli, "dflash")[0] == 0
    elif setup == "legacy":  # what ddtree-ops wrote before attempts: a status in meta.json, a known-good marker
        host.files[f"{root}/releases/baseline-0/meta.json"] = json.dumps(
            {"release_id": "baseline-0", "mode": "nextn", "status": "good", "created_at": "2026-11-30T00:00:00Z"}
        ).encode()
        host.files[f"{root}/known-good"] = b"baseline-0\n"
    before, starts = dict(host.files), host.starts
    rc, doc, err = cli(*args)
    expect = 0 if "--dry-run" in args else 3
    assert rc == expect and doc["exit_code"] == rc, err[-1500:]
    assert why in err + json.dumps(doc), err[-1500:]
    assert host.changed_files(before) == [] and host.starts == starts  # not a byte written, nothing restarted


def test_older_records_are_read_as_attempts_and_written_with_the_first_change(
        cli: Any, host: FakeHost, profile: Profile) -> None:
    root = "/var/lib/ddtree-ops/sglang"
    r = render(profile, "nextn")  # what runs is the NEXTN release the older version recorded as good
    for name, data in (("unit", r.unit_text), ("env", r.env_text), ("meta.json", json.dumps(
            {"release_id": r.release_id, "mode": "nextn", "status": "good", "created_at": "2026-11-30T00:00:00Z"}))):
        host.files[f"{root}/releases/{r.release_id}/{name}"] = data.encode()
    host.files[f"{root}/known-good"] = (r.release_id + "\n").encode()
    host.files[f"{root}/current"] = (r.release_id + "\n").encode()
    host.broken = {"dflash"}
    rc, doc, _ = deploy(cli, "dflash")
    assert rc == 1 and doc["known_good"] == r.release_id  # the migrated NEXTN release is the rollback target
    rec = records(host)
    assert [(a.action, a.release_id, a.outcome, a.migrated) for a in rec["attempts"]][:1] == [
        ("deploy", r.release_id, "passed", True)]
    assert host.text(f"{root}/known-good") == r.release_id + "\n"  # the old files stay as they were


def test_a_connection_dropped_during_preflight_is_read_again_on_a_new_one(cli: Any, host: FakeHost) -> None:
    """Nothing has changed when the connection drops while the host is read (its state, the preflight):
    the tool reconnects and reads again, and the deploy goes on; it does not refuse the host for an answer
    it never got (a lab fleet run refused a host for "no GPU visible" when the GPU probe's connection
    dropped)."""
    from ddtree_ops.gpu import PROBE

    host.drops.append(PROBE)
    rc, doc, err = deploy(cli, "ddtree-shadow")
    assert (rc, doc["result"], host.reconnects) == (0, "ok", 1), err
    assert "SSH connection lost while running" in err and "reconnected, reading the host again" in err


def test_a_second_drop_while_reading_is_not_read_around(cli: Any, host: FakeHost) -> None:
    """Reading again is once: a host whose connections keep dropping is refused (exit 3), unchanged."""
    from ddtree_ops.gpu import PROBE

    host.drops += [PROBE, PROBE]
    rc, doc, err = deploy(cli, "ddtree-shadow")
    assert (rc, host.reconnects, host.starts) == (3, 1, 1)     # refused before any change: the start it had
    assert doc["error"] == "ct129: SSH connection lost while running sh"
