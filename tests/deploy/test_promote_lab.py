"""`ddtree-ops promote HOST` on the lab hosts, as an operator types it (issue 28): the shadow's verdict
read from the host's own /metrics, a served tree proven live or rolled back to the shadow.

Real sshd, systemd and journald; the plugin is the real one inside the stand-in, on its simulated tree
(docs/lab.md: the RTX PRO 6000 class's verify cost lets the tree pay, the A6000 class's does not);
`lab load` puts greedy traffic on the service from inside the host, through the switch's restart.
Each test starts from, and leaves, its host on the NEXTN rollback target with no fault or load.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from labkit import back_to_baseline, snapshot, tool

from ddtree_ops.lab.api import LoadPlan

pytestmark = pytest.mark.lab
QUICK = ["--set", "gate.stay_healthy_s=2"]
# the lab's shadow gathers about a thousand exact rounds in half a minute (test_standin_lab_tree): 600
# before the switch and again live keep each step well under a minute, and well above what the verdict
# needs to resolve
BAR = ["--min-rounds", "600", "--live-deadline", "150"]
SHADOW_LOAD = LoadPlan(seconds=25)
# runs through the switch, held back while /health says the service is stopping or starting (as a load
# balancer holds it: lab load); stopped once the command returns
LIVE_LOAD = LoadPlan(seconds=300)


@pytest.fixture
def on_shadow(lab: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """HOST deployed to its profile's mode (ddtree-shadow), with a shadow window of lab load behind it."""
    host = request.param
    back_to_baseline(lab, host)
    rc, doc, err = tool(lab, "deploy", host, "--yes", "--json", *QUICK, timeout=600)
    assert rc == 0 and doc["mode"] == "ddtree-shadow", err[-3000:]
    said = lab.load(host, SHADOW_LOAD, wait=True)
    assert " 0 failed" in said, said
    yield host
    lab.stop_load(host)
    back_to_baseline(lab, host)


def history(lab: Any, host: str) -> tuple[str, list[tuple[str, str, str]], dict[str, str]]:
    """(the current release, the attempts newest first as (action, release, outcome), each release's mode)."""
    rc, doc, err = tool(lab, "history", host, "--json")
    assert rc == 0, err
    return (doc["current"], [(a["action"], a["release_id"], a["outcome"]) for a in doc["attempts"]],
            {r["release_id"]: r["mode"] for r in doc["releases"]})


def promote(lab: Any, host: str, *extra: str) -> tuple[int, dict[str, Any], str]:
    rc, doc, err = tool(lab, "promote", host, "--json", *BAR, *QUICK, *extra, timeout=600)
    assert doc is not None and doc["command"] == "promote" and doc["exit_code"] == rc, err[-3000:]
    return rc, doc, err


@pytest.mark.parametrize("on_shadow", [pytest.param("ct200", marks=pytest.mark.hosts("ct200"))], indirect=True)
def test_ct200_promotes_a_tree_that_keeps_its_promise_and_rolls_back_one_that_does_not(
        lab: Any, on_shadow: str) -> None:
    host = on_shadow
    shadow = history(lab, host)[0]
    # --dry-run: the decision and the plan, and the host byte-identical
    before = snapshot(lab, host)
    rc, doc, err = promote(lab, host, "--dry-run")
    assert (rc, doc["result"], doc["decision"]) == (0, "dry-run", "promote"), doc["reason"]
    assert doc["verdict"]["exact_rounds"] >= 600 and doc["verdict"]["lower"] >= 1.05
    assert doc["plan"]["rollback_target"]["release_id"] == shadow
    assert snapshot(lab, host) == before

    # a tree whose mask is broken off the spine (the tree-attention bug the live check exists for):
    # it serves, passes its start gate, and accepts well below the shadow's prediction
    lab.fault(host, "tree-mask")
    lab.load(host, LIVE_LOAD)
    rc, doc, err = promote(lab, host, "--yes")
    lab.stop_load(host)
    assert (rc, doc["result"]) == (1, "rolled-back"), (doc["reason"], err[-3000:])
    assert doc["gate"]["passed"] is True and doc["live"]["passed"] is False, (doc["gate"], doc["live"], err[-3000:])
    assert "below the prediction" in doc["live"]["reason"] and doc["live"]["tau_tree_ratio"] < 0.97
    assert doc["rollback_gate"]["passed"] is True
    current, attempts, _ = history(lab, host)
    assert current == shadow and attempts[:2] == [("rollback", shadow, "passed"), ("promote", doc["release_id"],
                                                                                      "rolled-back")]

    # the shadow starts counting again after its restart; with its rounds back, the sound tree is
    # promoted and holds the prediction live
    said = lab.load(host, SHADOW_LOAD, wait=True)
    assert " 0 failed" in said, said
    lab.load(host, LIVE_LOAD)
    rc, doc, err = promote(lab, host, "--yes")
    lab.stop_load(host)
    assert (rc, doc["result"], doc["decision"]) == (0, "ok", "promote"), (doc["reason"], err[-3000:])
    assert doc["live"]["passed"] is True and doc["live"]["tau_tree_ratio"] >= 0.97
    assert doc["live"]["verdict"]["exact_rounds"] >= 600
    current, attempts, modes = history(lab, host)
    assert current == doc["release_id"] and modes[current] == "ddtree"
    assert attempts[0] == ("promote", current, "passed")


@pytest.mark.parametrize("on_shadow", [pytest.param("ct129", marks=pytest.mark.hosts("ct129"))], indirect=True)
def test_ct129s_shadow_does_not_clear_the_bar_so_promote_holds_and_changes_nothing(lab: Any, on_shadow: str) -> None:
    """The A6000 class: the tree's verify costs more than its extra tokens bring (docs/lab.md)."""
    host = on_shadow
    before = snapshot(lab, host)
    rc, doc, err = promote(lab, host, "--yes")
    assert (rc, doc["decision"]) == (3, "hold"), (doc["reason"], err[-3000:])
    assert doc["verdict"]["exact_rounds"] >= 600 and doc["verdict"]["lower"] < 1.05
    assert doc["decision_reason"].startswith(("verdict: keep-chain", "bound:")), doc["decision_reason"]
    assert snapshot(lab, host) == before
