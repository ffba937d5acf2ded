"""`ddtree-ops promote HOST`: its contract through the CLI an operator types, against a fake Host.

    exit 0 promoted and verified live; 1 missed live and back on the ddtree-shadow release, healthy;
    3 held or refused before any change (the host byte-identical: no lock, no record, no restart).

The transaction is the real one (lock, preflight, records, install, gate, live window, rollback);
only the host is a fake (tests/unit/fakehost.py). Its /metrics carries the plugin's counters as the
plugin writes them (sums over exact greedy rounds of the chain's and the tree's committed tokens and
their second moments), made here from lists of (chain, tree) rounds, so the figures can be worked by
hand. The lab runs the same command against real systemd and the stand-in's plugin
(tests/deploy/test_promote_lab.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import pytest
from fakehost import FakeHost, cli_runner, records, shipped_profiles

from ddtree_ops.profile import Profile, load_profile
from ddtree_ops.render import render
from ddtree_ops.treestats import FROM_ENV

HOST = "ct129"
# a good draft: the chain commits 3 or 4 tokens a round, the tree 4 or 5 (tau 3.5 against 4.5; at a
# cost ratio of 1.06 the projected speedup is 1.286 / 1.06 = 1.21, its lower bound well above 1.05)
GOOD = [(3, 4), (4, 5)] * 600
# a served tree that accepts only what its spine does: tau_tree 3.5 against the 4.5 predicted
NO_GAIN = [(3, 3), (4, 4)] * 300


def exposition(mode: str, pairs: Sequence[tuple[int, int]], r: float = 1.06) -> str:
    """The plugin's counters for these rounds, as its /metrics prints them."""
    sums = {"rounds": len(pairs), "exact_rounds": len(pairs), "chain_tokens": sum(c for c, _ in pairs),
            "tree_tokens": sum(t for _, t in pairs), "chain_tokens_sq": sum(c * c for c, _ in pairs),
            "tree_tokens_sq": sum(t * t for _, t in pairs), "tree_chain_tokens": sum(c * t for c, t in pairs)}
    lines = [f'ddtree_{k}_total{{mode="{mode}"}} {float(v)}' for k, v in sums.items()]
    return "\n".join([*lines, f'ddtree_cost_ratio{{source="{FROM_ENV}"}} {r}', ""])


class Traffic:
    """What the service's /metrics says over time: the shadow's rounds, and after a switch to the
    tree, `per_scrape` more of the served tree's rounds at every scrape (traffic flowing)."""

    def __init__(self, shadow: Sequence[tuple[int, int]] | None, served: Sequence[tuple[int, int]] = GOOD,
                 per_scrape: int = 600) -> None:
        self.shadow, self.served, self.per_scrape, self.tree_scrapes = shadow, served, per_scrape, 0

    def __call__(self, mode: str) -> str | None:
        if mode == "ddtree-shadow":
            return None if self.shadow is None else exposition("shadow", self.shadow)
        if mode == "ddtree":
            n = self.per_scrape * self.tree_scrapes
            self.tree_scrapes += 1
            return exposition("tree", (list(self.served) * (1 + n // max(1, len(self.served))))[:n])
        return None


@pytest.fixture
def profiles(tmp_path: Path) -> Path:
    """The shipped profiles; ct129 holds no stay window (the lab holds windows) and polls its live
    window every 0.1 s."""
    return shipped_profiles(tmp_path / "profiles", HOST, "\ngate:\n  stay_healthy_s: 0\npromote:\n  poll_s: 0.1\n")


@pytest.fixture
def profile(profiles: Path) -> Profile:
    return load_profile(HOST, directory=profiles)


@pytest.fixture
def host(profile: Profile) -> FakeHost:
    """ct129 serving NEXTN by hand, with a tree verify backend declared for its SGLang."""
    h = FakeHost.serving(profile, "nextn")
    h.tree_backends = {h.sglang: "example_backend:TreeVerify"}
    return h


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], profiles: Path, host: FakeHost) -> Any:
    return cli_runner(capsys, profiles, host)


@pytest.fixture
def shadowing(cli: Any, host: FakeHost, profile: Profile) -> str:
    """ct129 deployed to its ddtree-shadow release (the plugin installed), healthy: promote's start."""
    rc, doc, err = cli("deploy", HOST, "--mode", "ddtree-shadow", "--yes", "--json")
    assert rc == 0, (doc or {}).get("reason", err)
    assert host.plugin is not None
    return render(profile, "ddtree-shadow").release_id


def promote(cli: Any, *extra: str) -> tuple[int, dict[str, Any], str]:
    rc, doc, err = cli("promote", HOST, "--json", *extra)
    assert doc["command"] == "promote" and doc["exit_code"] == rc and doc["schema_version"] == 1, doc
    return rc, doc, err


def test_a_shadow_that_clears_the_bar_is_promoted_and_verified_live(
        cli: Any, host: FakeHost, profile: Profile, shadowing: str) -> None:
    host.metrics = Traffic(GOOD)
    rc, doc, _ = promote(cli, "--yes")
    tree = render(profile, "ddtree").release_id
    assert (rc, doc["result"], doc["decision"], doc["release_id"]) == (0, "ok", "promote", tree), doc["reason"]
    v = doc["verdict"]
    assert (v["exact_rounds"], v["tau_chain"], v["tau_tree"]) == (1200, 3.5, 4.5)
    assert doc["live"]["passed"] is True and doc["live"]["verdict"]["exact_rounds"] >= 1000
    assert doc["known_good"] == shadowing  # the step's own rollback target: the shadow release
    rec = records(host)
    assert rec["current"] == tree and rec["pending"] is None
    assert [(a.action, a.release_id, a.outcome) for a in rec["attempts"][-2:]] == [
        ("deploy", shadowing, "passed"), ("promote", tree, "passed")]
    assert host.text(f"/etc/systemd/system/{profile.service.unit}") == render(profile, "ddtree").unit_text


def test_a_served_tree_that_misses_its_prediction_goes_back_to_the_shadow_exit_1(
        cli: Any, host: FakeHost, profile: Profile, shadowing: str) -> None:
    host.metrics = Traffic(GOOD, served=NO_GAIN)
    rc, doc, _ = promote(cli, "--yes")
    tree = render(profile, "ddtree").release_id
    assert (rc, doc["result"]) == (1, "rolled-back"), doc["reason"]
    assert doc["live"]["passed"] is False and "below" in doc["live"]["reason"]
    assert doc["rollback_gate"]["passed"] is True
    rec = records(host)
    assert rec["current"] == shadowing and rec["pending"] is None
    assert [(a.action, a.release_id, a.outcome) for a in rec["attempts"][-2:]] == [
        ("promote", tree, "rolled-back"), ("rollback", shadowing, "passed")]
    assert host.unit.mode == "ddtree-shadow" and host.unit.running


def test_no_traffic_after_the_switch_is_a_miss_at_the_deadline_never_a_pass(
        cli: Any, host: FakeHost, profile: Profile, shadowing: str) -> None:
    host.metrics = Traffic(GOOD, per_scrape=0)
    rc, doc, _ = promote(cli, "--yes", "--live-deadline", "1")
    assert (rc, doc["result"]) == (1, "rolled-back"), doc["reason"]
    assert doc["live"]["passed"] is False and records(host)["current"] == shadowing


@pytest.mark.parametrize("shadow,decision,why", [
    (GOOD[:500], "hold", "rounds: 500 exact greedy rounds of the 1000 needed"),
    (None, "refuse", "no data: /metrics answered HTTP 404"),
])
def test_hold_and_refuse_exit_3_and_leave_the_host_byte_identical(
        cli: Any, host: FakeHost, shadowing: str, shadow: Any, decision: str, why: str) -> None:
    host.metrics = Traffic(shadow)
    before, starts = dict(host.files), host.starts
    rc, doc, _ = promote(cli, "--yes")
    assert (rc, doc["decision"]) == (3, decision) and doc["decision_reason"].startswith(why), doc["reason"]
    assert host.changed_files(before) == [] and host.starts == starts


def test_a_host_not_on_its_shadow_release_is_refused(cli: Any, host: FakeHost) -> None:
    host.metrics = Traffic(GOOD)
    before = dict(host.files)
    rc, doc, _ = promote(cli, "--yes")
    assert (rc, doc["decision"]) == (3, "refuse") and "promote starts from a ddtree-shadow release" in doc["reason"]
    assert host.changed_files(before) == []


def test_dry_run_decides_and_plans_and_changes_nothing(cli: Any, host: FakeHost, profile: Profile,
                                                       shadowing: str) -> None:
    host.metrics = Traffic(GOOD)
    before, starts = dict(host.files), host.starts
    rc, doc, _ = promote(cli, "--dry-run")
    assert (rc, doc["result"], doc["decision"]) == (0, "dry-run", "promote")
    plan = doc["plan"]
    assert plan["release_id"] == render(profile, "ddtree").release_id and plan["rollback_target"]["release_id"] == shadowing
    assert host.changed_files(before) == [] and host.starts == starts


def test_no_tree_backend_on_the_host_is_refused_by_preflight(cli: Any, host: FakeHost, shadowing: str) -> None:
    host.metrics, host.tree_backends = Traffic(GOOD), {}
    before = dict(host.files)
    rc, doc, _ = promote(cli, "--yes")
    assert (rc, doc["decision"]) == (3, "refuse") and "preflight: tree:" in doc["reason"]
    assert host.changed_files(before) == []
