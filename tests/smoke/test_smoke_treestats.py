"""smoke on DDTree hosts from the plugin's /metrics counters: the paired figures over the check's own
window (its counters minus those the last check kept), on a shadow host and on a tree-serving one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from smoke_fakes import FakeHost, metrics, ok, server_info

from ddtree_ops import smoke
from ddtree_ops.status import NagiosExit

SHADOW_UNIT = "# ddtree-ops release=ddtree-shadow-0123456789ab profile_sha256=abcd mode=ddtree-shadow host=ct200\n[Unit]\n"
TREE_UNIT = "# ddtree-ops release=ddtree-0123456789ab profile_sha256=abcd mode=ddtree host=ct200\n[Unit]\n"


def counters_exposition(mode: str, pairs: list[tuple[int, int]], *, verify: dict[tuple[str, str], tuple[float, int]],
                        ratio: tuple[str, float] = ("engine-bench-h200-qwen3-8b", 1.06),
                        silent: str | None = None, unpaired: int = 0) -> bytes:
    """/metrics as the plugin writes its counters (prometheus_client, a fresh registry, the contract's
    names), for the rounds `pairs` (chain tokens, tree tokens)."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

    reg = CollectorRegistry()

    def counter(name: str, value: float, labels: dict[str, str]) -> None:
        c = Counter(name, name, list(labels), registry=reg)
        c.labels(**labels).inc(value)

    m = {"mode": mode}
    counter("ddtree_rounds", len(pairs) + unpaired, m)
    counter("ddtree_exact_rounds", len(pairs), m)
    counter("ddtree_chain_tokens", sum(c for c, _ in pairs), m)
    counter("ddtree_tree_tokens", sum(t for _, t in pairs), m)
    counter("ddtree_chain_tokens_sq", sum(c * c for c, _ in pairs), m)
    counter("ddtree_tree_tokens_sq", sum(t * t for _, t in pairs), m)
    counter("ddtree_tree_chain_tokens", sum(c * t for c, t in pairs), m)
    counter("ddtree_dropped_rounds", unpaired, {"mode": mode, "reason": "not-greedy"})
    secs = Counter("ddtree_verify_seconds", "s", ["arm", "bs"], registry=reg)
    n = Counter("ddtree_verify_rounds", "n", ["arm", "bs"], registry=reg)
    for (arm, bs), (s, k) in verify.items():
        secs.labels(arm=arm, bs=bs).inc(s)
        n.labels(arm=arm, bs=bs).inc(k)
    Gauge("ddtree_cost_ratio", "r", ["source"], registry=reg).labels(source=ratio[0]).set(ratio[1])
    if silent:
        Gauge("ddtree_silent", "s", ["reason"], registry=reg).labels(reason=silent).set(1)
    return metrics() + generate_latest(reg)


def host(unit: str, exposition: bytes) -> FakeHost:
    return FakeHost(name="ct200", unit_text=unit, routes={"GET /server_info": ok(server_info("DDTREE")),
                                                          "GET /metrics": ok(exposition)})


GAIN = [(4, 5), (5, 7), (3, 3), (4, 6)] * 100            # tau_chain 4.0, tau_tree 5.25
EVEN = [(4, 4), (5, 5), (3, 4), (4, 4)] * 100            # tau_chain 4.0, tau_tree 4.25
COST_2 = {("chain", "2"): (0.5, 50), ("tree", "2"): (11.5, 500)}   # 10 ms a chain round, 23 ms a tree round


def check(profiles: dict[str, Any], fake: FakeHost, state: smoke.StateStore | None = None) -> smoke.HostResult:
    return smoke.check_host(smoke.Target("ct200", profiles["ct200"]), lambda p: _ctx(fake), state=state)


class _ctx:
    def __init__(self, fake: FakeHost) -> None:
        self.fake = fake

    def __enter__(self) -> FakeHost:
        return self.fake

    def __exit__(self, *exc: Any) -> None:
        self.fake.close()


def test_a_tree_host_reports_the_served_tree_and_the_paired_chain(profiles: dict[str, Any]) -> None:
    r = check(profiles, host(TREE_UNIT, counters_exposition("tree", GAIN, verify={("chain", "2"): (0.5, 50),
                                                                                  ("tree", "2"): (5.5, 500)})))
    tree = next(c for c in r.checks if c.name == "tree")
    assert r.mode == "ddtree" and tree.state is NagiosExit.OK and r.state is NagiosExit.OK
    assert tree.detail.startswith("400 exact rounds since the server started: tau_tree 5.25, paired tau_chain 4.00, "
                                  "r 1.10 (measured), projected speedup 1.193")
    assert tree.detail.endswith(": promote-tree")
    assert (r.value("tau_tree"), r.value("tau_chain"), r.value("cost_ratio")) == (5.25, 4.0, 1.1)
    assert "shadow" not in {c.name for c in r.checks}


def test_a_served_tree_that_does_not_pay_is_a_warning(profiles: dict[str, Any]) -> None:
    r = check(profiles, host(TREE_UNIT, counters_exposition("tree", EVEN, verify=COST_2)))
    tree = next(c for c in r.checks if c.name == "tree")
    assert tree.state is NagiosExit.WARNING and "r 2.30 (measured)" in tree.detail and "keep-chain" in tree.detail
    assert r.reasons == ["the served tree does not pay for its verify cost"]


def test_a_shadow_host_reports_the_same_figures_from_its_counters(profiles: dict[str, Any]) -> None:
    r = check(profiles, host(SHADOW_UNIT, counters_exposition("shadow", GAIN, verify={}, unpaired=37)))
    shadow = next(c for c in r.checks if c.name == "shadow")
    assert shadow.state is NagiosExit.OK
    assert shadow.detail.startswith("400 exact rounds since the server started: tau_tree 5.25, paired tau_chain 4.00, "
                                    "r 1.06 (engine-bench-h200-qwen3-8b)")
    silent = check(profiles, host(SHADOW_UNIT, counters_exposition("shadow", [], verify={},
                                                                   silent="DDTREE_SHADOW_SHARE is 0")))
    assert silent.state is NagiosExit.WARNING and silent.reasons == ["shadow accounting not running"]


def test_the_window_is_the_checks_own(profiles: dict[str, Any], tmp_path: Path) -> None:
    """Two runs with a state file: the second reports only the rounds served between them; a server
    that restarted in between (its counters went down) is reported since its start."""
    store = smoke.StateStore(tmp_path)
    first = check(profiles, host(TREE_UNIT, counters_exposition("tree", EVEN, verify=COST_2)), store)
    store.update([first], 1000.0)
    store = smoke.StateStore(tmp_path)                   # as the next timer run reads it
    second = check(profiles, host(TREE_UNIT, counters_exposition("tree", EVEN + GAIN, verify=COST_2)), store)
    tree = next(c for c in second.checks if c.name == "tree")
    assert tree.detail.startswith("400 exact rounds since the last check: tau_tree 5.25, paired tau_chain 4.00")
    # over this window no verify round was timed: the configured ratio stands in
    assert "(engine-bench-h200-qwen3-8b)" in tree.detail
    store.update([second], 2000.0)
    store = smoke.StateStore(tmp_path)
    restarted = check(profiles, host(TREE_UNIT, counters_exposition("tree", GAIN[:40], verify={})), store)
    detail = next(c for c in restarted.checks if c.name == "tree").detail
    assert detail.startswith("40 exact rounds since the server started")
    # another start of the unit whose counters have already passed the last check's: still its own start
    store.update([restarted], 3000.0)
    store = smoke.StateStore(tmp_path)
    again = host(TREE_UNIT, counters_exposition("tree", GAIN + EVEN, verify={}))
    again.systemctl = again.systemctl.replace("InvocationID=abc", "InvocationID=def")
    detail = next(c for c in check(profiles, again, store).checks if c.name == "tree").detail
    assert detail.startswith("800 exact rounds since the server started")


@pytest.mark.parametrize("text", [b"", metrics()])
def test_no_counters_skip_the_tree_check(profiles: dict[str, Any], text: bytes) -> None:
    r = check(profiles, host(TREE_UNIT, text))
    assert next(c for c in r.checks if c.name == "tree").status == "skipped"
