"""The operator's contract (issue 32) against the lab hosts, as an operator types it: rollback lands
on the NEXTN release the docs promise, every attempt stays in the record, a refusal changes nothing
on the host, and a plan shows the change before it happens.

Real sshd, systemd and journald; the commands run in processes of their own, off a terminal (so
`--yes` is what an operator passes from a script). Each test starts from, and leaves, its host on
the NEXTN rollback target with no fault set.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest
from labkit import back_to_baseline, snapshot, start, tool, wait_for

pytestmark = [pytest.mark.lab, pytest.mark.hosts("ct200")]
QUICK = ["--set", "gate.stay_healthy_s=2"]


@pytest.fixture
def ct200(lab: Any) -> Any:
    back_to_baseline(lab, "ct200")
    yield "ct200"
    back_to_baseline(lab, "ct200")


def algorithm(lab: Any, host: str) -> str:
    with lab.connect(host) as h:
        return h.http("GET", 30000, "/server_info", timeout=10).json()["speculative_algorithm"]


def main_pid(lab: Any, host: str) -> str:
    return lab.exec(host, ["systemctl", "show", "-p", "MainPID", "--value", "sglang.service"]).stdout.strip()


def test_a_failed_deploy_after_a_passed_experiment_lands_on_nextn_and_rollback_then_does_nothing(
        lab: Any, ct200: str) -> None:
    # the profile's own mode (ct200 says ddtree-shadow): no --mode
    rc, doc, err = tool(lab, "deploy", ct200, "--yes", "--json", *QUICK)
    assert rc == 0, err[-3000:]
    assert (doc["mode"], doc["plan"]["mode_source"]) == ("ddtree-shadow", "profile")
    shadow = doc["release_id"]
    # a later experiment fails its gate: the host goes back to NEXTN, not to the ddtree-shadow release
    lab.fault(ct200, "libcuda-missing")
    rc, doc, err = tool(lab, "deploy", ct200, "--mode", "dflash", "--yes", "--json", *QUICK)
    assert rc == 1, err[-3000:]
    assert doc["plan"]["mode_source"] == "--mode" and doc["plan"]["rollback_target"]["mode"] == "nextn"
    assert doc["known_good"] != shadow and "(nextn)" in doc["reason"]
    assert algorithm(lab, ct200) == "NEXTN"
    # `rollback` now has nothing to do, says so, and restarts nothing
    pid = main_pid(lab, ct200)
    rc, doc, err = tool(lab, "rollback", ct200, "--json")
    host = doc["hosts"][0]
    assert (rc, host["result"]) == (0, "no-change"), err[-2000:]
    assert "nextn" in host["reason"] and "serving and healthy" in host["reason"]
    assert main_pid(lab, ct200) == pid
    # history: the shadow release passed, the dflash one failed, the rollback target is NEXTN
    rc, hist, _ = tool(lab, "history", ct200, "--json")
    status = {r["release_id"]: r["status"] for r in hist["releases"]}
    assert status[shadow] == "passed" and status[doc["hosts"][0]["release_id"]] == "passed"
    assert hist["rollback_target"]["mode"] == "nextn" and hist["current"] == hist["rollback_target"]["release_id"]
    assert [a["outcome"] for a in hist["attempts"][:3]] == ["passed", "failed", "passed"]  # newest first


def test_an_interrupted_redeploy_keeps_the_passing_attempt_of_its_release(lab: Any, ct200: str) -> None:
    rc, doc, err = tool(lab, "deploy", ct200, "--yes", "--json", *QUICK)
    assert rc == 0, err[-3000:]
    rid = doc["release_id"]
    # the same release again, cut off with Ctrl-C while its slow start is gated
    lab.fault(ct200, "slow-start")
    proc = start(lab, "deploy", ct200, "--yes", "--force-restart", *QUICK)
    wait_for("the redeploy to be gated", lambda: '"action": "deploy"' in lab.exec(
        ct200, ["sh", "-c", "tail -n 1 /var/lib/ddtree-ops/sglang/attempts.jsonl"]).stdout, timeout=60)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 1, err[-3000:]
    rc, hist, _ = tool(lab, "history", ct200, "--json")
    row = next(r for r in hist["releases"] if r["release_id"] == rid)
    outcomes = [a["outcome"] for a in hist["attempts"] if a["release_id"] == rid and a["action"] == "deploy"]
    assert row["status"] == "passed" and row["passed"] and row["last"] == "interrupted", (row, hist["attempts"][:5])
    assert outcomes[:2] == ["interrupted", "passed"], outcomes  # newest first: the cut-off one rewrote nothing
    assert hist["pending"] is None
    # the text says the same as the JSON
    rc, text, _ = tool(lab, "history", ct200)
    line = next(ln for ln in text.splitlines() if ln.startswith(rid))
    assert line.split()[2] == "passed"
    assert any(" interrupted " in f" {ln} " and rid in ln for ln in text.splitlines())
    audit = lab.exec(ct200, ["cat", "/var/lib/ddtree-ops/sglang/audit.log"]).stdout
    assert "result=INTERRUPTED" in audit


def test_refusals_leave_every_file_of_the_host_as_it_was(lab: Any, ct200: str) -> None:
    # first contact: no records yet, so a deploy that went ahead would adopt the running unit
    lab.exec(ct200, ["rm", "-rf", "/var/lib/ddtree-ops"])
    before = snapshot(lab, ct200)
    refusals = [
        (("deploy", ct200), "pass --yes"),  # off a terminal, without --yes
        (("deploy", ct200, "--yes", "--set", "memory.context_length=131072", "--set",
          "memory.mem_fraction_static=0.88"), "preflight"),
        (("rollback", ct200, "--yes"), "no release has passed"),
        (("rollback", ct200, "--dry-run"), "no release has passed"),
    ]
    for args, why in refusals:
        rc, doc, err = tool(lab, *args, "--json")
        assert rc == 3, (args, err[-2000:])
        assert doc["exit_code"] == 3 and doc["schema_version"] == 1, doc
        assert why in (err + str(doc)), (args, err[-1500:])
        assert snapshot(lab, ct200) == before, args
    # a dry run plans the whole change and changes nothing
    rc, doc, err = tool(lab, "deploy", ct200, "--dry-run", "--json")
    assert rc == 0, err[-2000:]
    plan = doc["plan"]
    assert plan["changes"] and plan["summary"].startswith(f"{ct200}: would change: deploy ")
    assert plan["adopt"].startswith("baseline-") and plan["rollback_target"]["policy"] == "adopted"
    # the plugin line names a version only where the host's SGLang lacks it (an earlier test may have put it there)
    assert "plugin" in plan and plan["restart"] and plan["gate"]["stay_healthy_s"] > 0
    assert "+ --speculative-algorithm DDTREE" in plan["launch_diff"]
    assert "- --speculative-algorithm NEXTN" in plan["launch_diff"] and plan["diff"]
    assert snapshot(lab, ct200) == before
