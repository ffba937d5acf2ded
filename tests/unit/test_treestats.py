"""treestats: the ddtree counters of a /metrics scrape, the window between two scrapes, the verdict.

The verdict is checked against the same figures computed another way (per-round lists through the
statistics module), never against itself; the plugin's own answer is held to a verdict recomputed
from two scrapes in tests/engine/test_engine_shadow_counters.py."""

from __future__ import annotations

import math
import random
import statistics
from statistics import NormalDist

import pytest

from ddtree_ops.treestats import (FROM_ENV, FROM_GIVEN, FROM_MEASURED, INCONCLUSIVE, KEEP_CHAIN, PROMOTE, Counters,
                                  ModeSums, bs_bucket, measured_ratio, parse_metrics, verdict, window)

SCRAPE = """\
# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{model_name="qwen3-8b"} 3.2
# HELP ddtree_rounds_total rounds accounted
# TYPE ddtree_rounds_total counter
ddtree_rounds_total{mode="shadow"} 120.0
ddtree_rounds_created{mode="shadow"} 1.7e+09
ddtree_exact_rounds_total{mode="shadow"} 100.0
ddtree_dropped_rounds_total{mode="shadow",reason="request-ended"} 3.0
ddtree_dropped_rounds_total{mode="shadow",reason="not-greedy"} 17.0
ddtree_chain_tokens_total{mode="shadow"} 300.0
ddtree_tree_tokens_total{mode="shadow"} 360.0
ddtree_chain_tokens_sq_total{mode="shadow"} 1000.0
ddtree_tree_tokens_sq_total{mode="shadow"} 1400.0
ddtree_tree_chain_tokens_total{mode="shadow"} 1150.0
ddtree_verify_seconds_total{arm="chain",bs="4"} 2.0
ddtree_verify_rounds_total{arm="chain",bs="4"} 100.0
ddtree_verify_seconds_total{arm="tree",bs="4"} 0.6
ddtree_verify_rounds_total{arm="tree",bs="4"} 25.0
ddtree_cost_ratio{source="engine-bench-h200-qwen3-8b"} 1.06
ddtree_silent{reason="no sampled round yet"} 0.0
ddtree_shadow_rounds 120.0
"""


def test_parse_reads_the_counters_by_mode_and_leaves_the_rest() -> None:
    c = parse_metrics(SCRAPE)
    assert c is not None
    s = c.modes["shadow"]
    assert (s.rounds, s.exact, s.chain, s.tree, s.chain_sq, s.tree_sq, s.tree_chain) == (
        120, 100, 300, 360, 1000, 1400, 1150)
    assert s.dropped == {"request-ended": 3, "not-greedy": 17}
    assert c.verify == {("chain", "4"): (2.0, 100.0), ("tree", "4"): (0.6, 25.0)}
    assert c.cost_ratios == {"engine-bench-h200-qwen3-8b": 1.06}
    assert c.silent is None                     # the silent gauge at 0 says nothing
    assert parse_metrics(SCRAPE.replace('"no sampled round yet"} 0.0', '"no top-K"} 1.0')).silent == "no top-K"


def test_a_scrape_without_ddtree_counters_is_none() -> None:
    assert parse_metrics("") is None
    assert parse_metrics("ddtree_shadow_rounds 12.0\nsglang:num_requests_total 3\n") is None   # gauges only


def test_window_subtracts_and_a_counter_that_went_down_is_a_restart() -> None:
    before = parse_metrics(SCRAPE)
    after = parse_metrics(SCRAPE.replace('ddtree_rounds_total{mode="shadow"} 120.0', 'ddtree_rounds_total{mode="shadow"} 170.0')
                          .replace('ddtree_exact_rounds_total{mode="shadow"} 100.0',
                                   'ddtree_exact_rounds_total{mode="shadow"} 140.0')
                          .replace('reason="not-greedy"} 17.0', 'reason="not-greedy"} 27.0'))
    assert before is not None and after is not None
    w = window(before, after)
    assert not w.restarted
    assert (w.modes["shadow"].rounds, w.modes["shadow"].exact) == (50, 40)
    assert w.modes["shadow"].dropped == {"request-ended": 0, "not-greedy": 10}
    assert w.verify[("tree", "4")] == (0.0, 0.0)
    # the server restarted between the scrapes: its counters start again from 0
    fresh = parse_metrics('ddtree_rounds_total{mode="shadow"} 30.0\nddtree_exact_rounds_total{mode="shadow"} 20.0\n')
    assert fresh is not None
    w = window(after, fresh)
    assert w.restarted and w.modes["shadow"].rounds == 30 and w.modes["shadow"].exact == 20
    assert all(getattr(w.modes["shadow"], f) >= 0 for f in ("rounds", "exact", "chain", "tree"))
    assert window(None, fresh) == fresh


def sums(pairs: list[tuple[int, int]], mode: str = "shadow") -> Counters:
    return Counters(modes={mode: ModeSums(
        rounds=len(pairs), exact=len(pairs), chain=sum(c for c, _ in pairs), tree=sum(t for _, t in pairs),
        chain_sq=sum(c * c for c, _ in pairs), tree_sq=sum(t * t for _, t in pairs),
        tree_chain=sum(t * c for c, t in pairs))})


def reference(pairs: list[tuple[int, int]], r: float, alpha: float) -> tuple[float, float]:
    """Speedup and its delta-method lower bound from the per-round lists."""
    cs, ts = [c for c, _ in pairs], [t for _, t in pairs]
    big_r = statistics.fmean(ts) / statistics.fmean(cs)
    resid = [t - big_r * c for c, t in pairs]
    se = statistics.stdev(resid) / math.sqrt(len(pairs)) / statistics.fmean(cs)
    return big_r / r, (big_r - NormalDist().inv_cdf(1 - alpha) * se) / r


def test_verdict_is_the_delta_method_on_the_paired_rounds() -> None:
    rng = random.Random(3)
    pairs = [(c, c + (rng.random() < 0.4) + (rng.random() < 0.2)) for c in (rng.randint(1, 6) for _ in range(1500))]
    for r, alpha in ((1.05, 0.05), (1.3, 0.01)):
        v = verdict(sums(pairs), r=r, alpha=alpha)
        want_s, want_lower = reference(pairs, r, alpha)
        assert v.speedup == pytest.approx(want_s, rel=1e-12)
        assert v.lower == pytest.approx(want_lower, rel=1e-9)
        assert v.tau_chain == pytest.approx(statistics.fmean(c for c, _ in pairs))
        assert v.tau_tree == pytest.approx(statistics.fmean(t for _, t in pairs))
        assert (v.r, v.r_source, v.exact_rounds) == (r, FROM_GIVEN, 1500)


def test_recommendation_promote_keep_or_inconclusive_with_a_reason() -> None:
    rng = random.Random(1)
    gain = [(c, c + (1 if rng.random() < 0.3 else 0)) for c in (rng.randint(1, 5) for _ in range(2000))]
    # +0.3 tokens on ~3 a round is +10%: worth a 1.05x verify, not a 1.2x one
    assert verdict(sums(gain), r=1.05).recommendation == PROMOTE
    costly = verdict(sums(gain), r=1.2)
    assert costly.recommendation == KEEP_CHAIN and "does not pay" in costly.reason
    assert costly.upper is not None and costly.upper < 1
    close = verdict(sums(gain), r=1.10)            # speedup ~1.0: not told apart
    assert close.recommendation == INCONCLUSIVE and "not told apart" in close.reason
    few = verdict(sums(gain[:10]), r=1.05)
    assert few.recommendation == INCONCLUSIVE and "10 exact rounds; need at least 20" in few.reason
    # promote's own bar: a lower bound of ~1.097 clears 1.05 but not 1.10
    v = verdict(sums(gain), r=1.0)
    assert v.lower is not None and 1.05 < v.lower < 1.10
    assert verdict(sums(gain), r=1.0, bar=1.05).recommendation == PROMOTE
    assert verdict(sums(gain), r=1.0, bar=1.10).recommendation == INCONCLUSIVE
    # the mean decides, not the median: most rounds tie while the tree still pays
    assert verdict(sums([(3, 3)] * 1600 + [(3, 6)] * 400), r=1.1).recommendation == PROMOTE


def test_no_rounds_no_ratio_and_silence_are_inconclusive() -> None:
    assert verdict(Counters()).recommendation == INCONCLUSIVE
    v = verdict(sums([(3, 4)] * 50))
    assert v.recommendation == INCONCLUSIVE and v.r is None and "no tree/chain verify cost ratio" in v.reason
    silent = Counters(modes={"shadow": ModeSums(rounds=0)}, silent="the draft head never ran")
    assert verdict(silent, r=1.0).reason == "silent: the draft head never ran"


def test_the_ratio_in_force_env_then_measured_then_default() -> None:
    base = sums([(3, 4), (2, 2), (5, 6)] * 20)
    cost = {("chain", "4"): (2.0, 100.0), ("tree", "4"): (0.6, 25.0),       # 20 ms chain, 24 ms tree
            ("chain", "1"): (1.0, 100.0), ("tree", "1"): (0.1, 5.0)}        # too few tree forwards at bs 1
    with_cost = Counters(modes=base.modes, verify=cost, cost_ratios={"engine-bench-h200-qwen3-8b": 1.06})
    assert measured_ratio(with_cost) == pytest.approx(0.024 / 0.020)
    v = verdict(with_cost)
    assert (v.r, v.r_source) == (pytest.approx(1.2), FROM_MEASURED)
    assert verdict(Counters(modes=base.modes, cost_ratios={"engine-bench-h200-qwen3-8b": 1.06})).r_source == \
        "engine-bench-h200-qwen3-8b"
    env = Counters(modes=base.modes, verify=cost, cost_ratios={FROM_ENV: 1.4})
    assert (verdict(env).r, verdict(env).r_source) == (1.4, FROM_ENV)
    assert verdict(env, r=0.9).r == 0.9


def test_measured_ratio_compares_alike_batches() -> None:
    """Tree forwards at bs 8 are weighed against chain forwards at bs 8, not at bs 1: a share of
    chain rounds that happened to run small batches does not make the tree look dear."""
    cost = {("chain", "1"): (1.0, 100.0), ("chain", "8"): (3.0, 100.0),
            ("tree", "8"): (3.3 * 9, 900.0)}
    assert measured_ratio(Counters(verify=cost)) == pytest.approx(1.1)


@pytest.mark.parametrize("bs,bucket", [(1, "1"), (2, "2"), (3, "4"), (4, "4"), (5, "8"), (8, "8"), (9, "16"), (33, "64")])
def test_batch_size_buckets(bs: int, bucket: str) -> None:
    assert bs_bucket(bs) == bucket
