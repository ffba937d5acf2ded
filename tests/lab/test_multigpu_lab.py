"""Several GPUs per host and several hosts per model, against lab hosts (real systemd, journald,
sshd; the SGLang stand-in with one rank process per card and a real TCP rendezvous between hosts),
through the CLI an operator types.

ct201 and ct202 are the lab's two-card RTX PRO 6000 hosts (group pro6000x2). A TP=2 service on one
host: ct201's own sglang.service over cards 0 and 1 (the keys of profiles/groups/tp2.yaml, given
with --set). A two-node service: profiles/services/pro6000-pair.yaml, card 1 of ct201 (rank 0)
and of ct202 (rank 1), its own unit sglang-pair.service beside each host's own.

Every fault ends with the whole service on a known-good release, healthy, nothing pending: the
tool itself (history, smoke, and each node's state in the JSON) must say so.
"""

from __future__ import annotations

import json
import secrets
from typing import Any, Iterator

import pytest
from labkit import tool

pytestmark = [pytest.mark.lab, pytest.mark.hosts("ct201", "ct202")]
RUN = secrets.token_hex(3)  # a lab kept up between runs holds the last run's releases
TP2 = ["--set", "parallel.tp_size=2", "--set", "gpus=[0, 1]"]
PAIR = "pro6000-pair"
NODES = ["ct201", "ct202"]



# the deploys' stay-healthy window is 1 s (the window is test_deploy_lab's to hold) but where a node dies
# after ready, inside it
def tag(test: str) -> list[str]:
    """A release of its own for each test of each run."""
    return ["--set", f"service.env.DDTREE_MULTIGPU_TEST={test}-{RUN}"]


def on_host(lab: Any, host: str, *argv: str) -> str:
    with lab.connect(host) as c:
        return c.run(list(argv), timeout=60).stdout


@pytest.fixture(scope="module")
def lab6(request: pytest.FixtureRequest) -> Iterator[Any]:
    lab = request.getfixturevalue("lab")
    hosts = lab.grow(6)
    assert set(NODES) <= set(hosts)
    for h in NODES:
        lab.clear(h)
    yield lab
    for h in NODES:
        lab.clear(h)
        on_host(lab, h, "systemctl", "stop", "sglang-pair.service")


def gpu_apps(lab: Any, host: str) -> list[tuple[int, int]]:
    """(card index, pid) of every process nvidia-smi lists on the host."""
    uuids = dict(line.split(", ") for line in on_host(
        lab, host, "nvidia-smi", "--query-gpu=uuid,index", "--format=csv,noheader").splitlines())
    apps = on_host(lab, host, "nvidia-smi", "--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader")
    return sorted((int(uuids[u]), int(p)) for u, p in (line.split(", ") for line in apps.splitlines()))


def service_state(lab: Any) -> dict[str, Any]:
    rc, doc, err = tool(lab, "history", PAIR, "--json")
    assert rc == 0, err
    return doc


def assert_pair_on_known_good(lab: Any, doc: dict[str, Any]) -> None:
    """Every node on the same release, that release known-good, healthy, nothing pending."""
    nodes = doc["nodes"]
    assert [n["node"] for n in nodes] == NODES
    assert len({n["current"] for n in nodes}) == 1 and all(n["current"] == n["known_good"] for n in nodes), nodes
    assert all(n["healthy"] and not n["pending"] and not n["error"] for n in nodes), nodes
    rc, out, err = tool(lab, "smoke", PAIR)
    assert rc == 0, out + err


# ------------------------------------------------------------------ TP=2 on one host


def test_tp2_a_stray_on_card_1_only_is_refused_naming_that_card(lab6: Any) -> None:
    """ct201 serves on card 0 alone; a process left over holds card 1: the TP=2 deploy that needs
    card 1 too is refused, naming the card, and nothing changes."""
    rc, _doc, err = tool(lab6, "deploy", "ct201", "--mode", "nextn", "--yes", "--json", "--set",
                         "gate.stay_healthy_s=1")
    assert rc == 0, err
    before = on_host(lab6, "ct201", "systemctl", "show", "-p", "InvocationID", "--value", "sglang.service")
    lab6.fault("ct201", "stray-gpu-card1")
    try:
        rc, doc, err = tool(lab6, "deploy", "ct201", "--mode", "nextn", "--yes", "--json", *TP2, *tag("stray1"))
    finally:
        lab6.clear("ct201")
    # run 26: exit 3 once with no preflight in the document; show what it was next time
    assert rc == 3 and doc.get("preflight"), (doc, err[-3000:])
    checks = {c["name"]: c for c in doc["preflight"]["checks"]}
    # issue 21: the stray holds what the pool needs (it fits without it), so it is a refusal naming it
    procs = checks["gpu-processes"]
    assert procs["status"] == "fail" and "card 1 (" in procs["detail"] and "): pid " in procs["detail"]
    assert "card 0 (" not in procs["detail"]
    assert checks["memory"]["status"] == "fail" and "the least of 2 cards" in checks["memory"]["detail"]
    cards = {c["index"]: c for c in doc["preflight"]["cards"]}
    assert cards[1]["others_mib"] > 80000 and cards[0]["others_mib"] < 1000
    after = on_host(lab6, "ct201", "systemctl", "show", "-p", "InvocationID", "--value", "sglang.service")
    assert after == before  # nothing changed


def test_tp2_on_one_host_one_rank_per_card_and_the_per_card_preflight_table(lab6: Any) -> None:
    rc, out, err = tool(lab6, "preflight", "ct201", "--mode", "nextn", *TP2)
    assert rc == 0, err
    # the table: one row per card, with the rank SGLang puts there and its free memory
    rows = [ln.split() for ln in err.splitlines() if ln.strip().startswith(("0 ", "1 "))]
    assert [r[:2] for r in rows] == [["0", "TP0"], ["1", "TP1"]], err
    assert "CARD" in err and "FOR IT" in err and "per rank:" in err

    rc, doc, err = tool(lab6, "deploy", "ct201", "--mode", "nextn", "--yes", "--json", *TP2, *tag("tp2"),
                        "--set", "gate.stay_healthy_s=1")
    assert rc == 0, err
    pf = doc["preflight"]
    assert [(c["index"], c["rank"]) for c in pf["cards"]] == [(0, "TP0"), (1, "TP1")]
    assert pf["memory"]["tp"] == 2 and pf["memory"]["cards"] == 2
    apps = gpu_apps(lab6, "ct201")
    assert [card for card, _ in apps] == [0, 1] and apps[0][1] != apps[1][1]  # two rank processes
    journal = on_host(lab6, "ct201", "journalctl", "-u", "sglang.service", "-n", "300", "--no-pager", "-o", "cat")
    assert " TP1] Load weight end." in journal and " TP0] Load weight end." in journal


def test_tp2_one_rank_out_of_memory_rolls_back_to_the_tp2_known_good(lab6: Any) -> None:
    rc, doc, err = tool(lab6, "deploy", "ct201", "--mode", "nextn", "--yes", "--json", *TP2, *tag("tp2"),
                        "--set", "gate.stay_healthy_s=1")
    assert rc == 0 and doc["result"] in ("ok", "no-change"), err
    good = doc["release_id"]
    lab6.fault("ct201", "rank-oom")
    rc, doc, err = tool(lab6, "deploy", "ct201", "--mode", "nextn", "--yes", "--json", *TP2, *tag("tp2-oom"))
    assert rc == 1, err
    assert doc["result"] == "rolled-back" and doc["diagnosis"]["root_cause"]["label"] == "cuda_oom"
    assert any(" TP1] Scheduler hit an exception" in ln for ln in doc["evidence"]), doc["evidence"]
    assert doc["known_good"] == good
    rc, doc, err = tool(lab6, "rollback", "ct201*", "--json")  # the tool finds nothing left to do
    assert (rc, doc["hosts"]) == (0, []), err


def test_ct201_back_to_one_card(lab6: Any) -> None:
    """The two-node service below owns card 1 of ct201: its own service goes back to card 0 alone."""
    rc, doc, err = tool(lab6, "deploy", "ct201", "--mode", "nextn", "--yes", "--json", "--set",
                        "gate.stay_healthy_s=1")
    assert rc == 0, err
    assert [card for card, _ in gpu_apps(lab6, "ct201")] == [0]


# ------------------------------------------------------------------ a service over two hosts


def pair_deploy(lab: Any, test: str, mode: str = "nextn", *extra: str) -> tuple[int, Any, str]:
    return tool(lab, "deploy", PAIR, "--mode", mode, "--yes", "--json", "--set", "gate.stay_healthy_s=1",
                *tag(test), *extra)


def pair_known_good(lab: Any) -> None:
    """The pair's NEXTN release passed, the one a failure rolls back to: test_two_node_service_deploys_as_one's
    (the same release, so a no-op after it), or deployed here when a test runs without it (alone, in
    another order), which otherwise found nothing to roll back to and exited 2."""
    rc, _, err = pair_deploy(lab, "pair")
    assert rc == 0, err


def test_two_node_service_deploys_as_one(lab6: Any) -> None:
    rc, doc, err = pair_deploy(lab6, "pair")
    assert rc == 0, err
    assert doc["service"] == PAIR and doc["node_names"] == NODES
    ranks = [n["node"] for n in doc["preflight"]["nodes"]]
    assert ranks == NODES
    rdzv = [c for c in doc["preflight"]["nodes"][1]["checks"] if c["name"] == "rendezvous"]
    assert rdzv and rdzv[0]["status"] == "ok"
    assert_pair_on_known_good(lab6, doc)
    # one rank per node, each on card 1, and rank 1 found rank 0 over the lab network
    for h in NODES:
        assert 1 in [card for card, _ in gpu_apps(lab6, h)]
    j1 = on_host(lab6, "ct202", "journalctl", "-u", "sglang-pair.service", "-n", "200", "--no-pager", "-o", "cat")
    assert " TP1] Load weight end." in j1
    hist = service_state(lab6)
    row = next(r for r in hist["releases"] if r["release_id"] == doc["release_id"])
    assert all("rollback-target" in row["per_node"][h] for h in NODES)


def test_rendezvous_unreachable_from_one_node_is_refused_before_any_change(lab6: Any) -> None:
    pair_known_good(lab6)
    before = {h: on_host(lab6, h, "systemctl", "show", "-p", "InvocationID", "--value", "sglang-pair.service")
              for h in NODES}
    lab6.fault("ct202", "rendezvous-unreachable")
    try:
        rc, doc, err = pair_deploy(lab6, "cut")
    finally:
        lab6.clear("ct202")
    assert rc == 3, err
    assert "ct202: rendezvous: ct202 cannot reach rank 0's rendezvous ct201:20000 (timed out" in doc["reason"]
    after = {h: on_host(lab6, h, "systemctl", "show", "-p", "InvocationID", "--value", "sglang-pair.service")
             for h in NODES}
    assert after == before
    assert_pair_on_known_good(lab6, tool(lab6, "deploy", PAIR, "--mode", "nextn", "--dry-run", "--json")[1])


def test_one_rank_out_of_memory_rolls_every_node_back_and_diagnose_names_it(lab6: Any) -> None:
    pair_known_good(lab6)
    lab6.fault("ct202", "rank-oom")
    rc, doc, err = pair_deploy(lab6, "oom")
    assert rc == 1, err
    assert doc["result"] == "rolled-back"
    first = doc["first_failed"]
    assert (first["node"], first["rank"], first["label"], first["symptom"]) == ("ct202", 1, "cuda_oom", False)
    assert first["tp_rank"] == "TP1"
    assert_pair_on_known_good(lab6, doc)
    rc, diag, err = tool(lab6, "diagnose", PAIR, "--json")
    assert diag["first_failed"]["node"] == "ct202" and diag["first_failed"]["label"] == "cuda_oom", err
    assert diag["first_failed"]["tp_rank"] == "TP1"


def test_a_node_that_dies_after_ready_fails_the_service_and_every_node_rolls_back(lab6: Any) -> None:
    pair_known_good(lab6)
    lab6.fault("ct202", "crash-after-ready", seconds=5)  # after rank 0 is ready, inside the 10 s window
    rc, doc, err = tool(lab6, "deploy", PAIR, "--mode", "nextn", "--yes", "--json", "--set",
                        "gate.stay_healthy_s=10", *tag("died"))
    assert rc == 1, err
    assert doc["first_failed"]["node"] == "ct202" and doc["first_failed"]["label"] == "illegal_memory_access"
    assert_pair_on_known_good(lab6, doc)
