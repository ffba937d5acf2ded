"""The plugin's /metrics counters: a verdict recomputed from two scrapes is the plugin's own answer.

The worker mixin serves greedy requests against a known target (`dflash_fakes.GreedyDFlash`); at each
report line the real prometheus_client registry is scraped, as SGLang's /metrics would be. The
window between the first scrape and the last, through `treestats`, gives the same recommendation and
figures the plugin printed, and the counters hold the sums of the rounds the fake actually served."""

from __future__ import annotations

import re
from typing import Any

import pytest
from dflash_fakes import FakeBatch, FakeRequest, GreedyDFlash, shadow_env
from test_engine_shadow_exact import go_on, serve

from ddtree_ops.treestats import FROM_ENV, parse_metrics, verdict, window

pytestmark = pytest.mark.engine

LINE = re.compile(r"DDTREE shadow: rounds=(\d+) sampled=(\d+) tau_chain=([\d.]+) tau_tree=([\d.]+|n/a) .*"
                  r"recommendation=(\S+) cost_from=(\S+) dropped=(\d+)$")


def scrape() -> str:
    from prometheus_client import REGISTRY, generate_latest

    return generate_latest(REGISTRY).decode()


@pytest.mark.parametrize("ratio", ["1.02", "1.5"])
def test_two_scrapes_give_the_plugins_own_verdict(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
                                                  ratio: str) -> None:
    from ddtree_ops.engine.sglang_shadow import ShadowWorkerMixin

    shadow_env(monkeypatch, DDTREE_SHADOW_SHARE="1.0", DDTREE_BUDGET="8", DDTREE_SHADOW_REPORT_EVERY="30",
               DDTREE_VERIFY_COST_RATIO=ratio)

    class Worker(ShadowWorkerMixin, GreedyDFlash):
        pass

    before = parse_metrics(scrape())          # what earlier tests in this process left: the window's start
    w = Worker(budget=8, seed=5)
    st = w._ddtree()
    scrapes: list[tuple[Any, str]] = []
    real_report = st._report
    monkeypatch.setattr(st.acct, "on_report", lambda rep: (real_report(rep), scrapes.append((rep, scrape()))))
    reqs = [FakeRequest([1, 2, 3]), FakeRequest([4, 5]), FakeRequest([6, 7, 8, 9])]
    with caplog.at_level("INFO", logger="ddtree_ops.engine.sglang"):
        serve(w, reqs, rounds=120, lag=1)
        go_on(w, reqs)
        st.drain(wait=True)
        for _ in range(30 - st.acct.rounds % 30):         # rounds past the last report: one more line
            w.forward_batch_generation(FakeBatch("decode", reqs, [len(w.seqs[id(r)]) - 1 for r in reqs]))
        st.drain(wait=True)
    assert len(scrapes) >= 10
    rep, text = scrapes[-1]
    after = parse_metrics(text)
    assert after is not None
    v = verdict(window(before, after))
    line = [m for m in (LINE.search(r.getMessage()) for r in caplog.records) if m][-1]
    assert v.recommendation == rep.recommendation == line.group(5)
    assert v.exact_rounds == rep.sampled_rounds == int(line.group(2)) >= 300
    assert f"{v.tau_tree:.3f}" == line.group(4) and v.tau_chain == pytest.approx(rep.tau_chain_sampled)
    assert (v.r, v.r_source) == (float(ratio), FROM_ENV) and line.group(6) == FROM_ENV
    assert (v.speedup, v.lower) == (rep.projected_speedup, rep.speedup_lower)
    # the counters are the served rounds' sums, not figures the plugin made up
    truth = w.truth[:v.exact_rounds]
    win = window(before, after).modes["shadow"]
    assert win.chain == sum(c for c, _ in truth) and win.tree == sum(t for _, t in truth)
    assert win.tree_chain == sum(c * t for c, t in truth) and win.chain_sq == sum(c * c for c, _ in truth)


def test_both_ratios_give_both_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake's tree gains about 32% on the chain: a 1.02 verify cost is paid, 1.5 is not (so the
    test above sees both a promote and a keep-chain come through the counters)."""
    from ddtree_ops.engine.sglang_shadow import ShadowWorkerMixin

    calls = {}
    for ratio in ("1.02", "1.5"):
        shadow_env(monkeypatch, DDTREE_SHADOW_SHARE="1.0", DDTREE_BUDGET="8", DDTREE_SHADOW_REPORT_EVERY="1000000",
                   DDTREE_VERIFY_COST_RATIO=ratio)

        class Worker(ShadowWorkerMixin, GreedyDFlash):
            pass

        w = Worker(budget=8, seed=5)
        reqs = [FakeRequest([1, 2, 3]), FakeRequest([4, 5]), FakeRequest([6, 7, 8, 9])]
        serve(w, reqs, rounds=120, lag=1)
        go_on(w, reqs)
        w._ddtree().drain(wait=True)
        calls[ratio] = w._ddtree().acct.report().recommendation
    assert calls == {"1.02": "promote-tree", "1.5": "keep-chain"}


def test_rows_without_a_pair_are_counted_by_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddtree_ops.engine.sglang_shadow import ShadowWorkerMixin

    shadow_env(monkeypatch, DDTREE_SHADOW_SHARE="1.0", DDTREE_BUDGET="8")

    class Worker(ShadowWorkerMixin, GreedyDFlash):
        pass

    w = Worker(budget=8, seed=2)
    greedy, sampled = FakeRequest([1, 2, 3], max_new=25), FakeRequest([4, 5], greedy=False)
    serve(w, [greedy, sampled], rounds=40)
    st = w._ddtree()
    st.drain(wait=True)
    c = st.acct.counters().modes["shadow"]
    assert c.dropped["not-greedy"] >= 10                  # every row of the sampled request
    assert c.dropped.get("request-ended", 0) >= 1        # the greedy one ended with walks undecided
    assert c.rounds == c.exact + sum(c.dropped.values()) + st.accountant.book.pending
