"""The reference decoder on a tiny random Llama: lossless greedy and sampling, shadow == chain,
captured hidden features, and a distribution test that a wrong walk fails."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from ddtree_ops.engine.decoder import Decoder
from ddtree_ops.engine.drafters import NGramDrafter, OracleDrafter, RandomDrafter
from ddtree_ops.engine.verify import MultinomialSampler, PositionalSampler, SamplingParams

pytestmark = pytest.mark.engine

PROMPT = [5, 17, 42, 8, 5, 17, 42, 9, 61, 5, 17]


@pytest.fixture(scope="module")
def ar_greedy(tiny) -> list[int]:
    return Decoder(tiny).generate(PROMPT, 48, "ar").tokens


@pytest.mark.parametrize("builder", ["heap", "vector"])
def test_greedy_chain_tree_shadow_equal_ar(tiny, ar_greedy, builder: str) -> None:
    oracle = OracleDrafter(PROMPT + ar_greedy, 96, horizon=6, swap=0.35, seed=1)
    out = {m: Decoder(tiny, oracle, budget=24, builder=builder).generate(PROMPT, 48, m) for m in ("chain", "tree", "shadow")}
    for mode, res in out.items():
        assert res.tokens == ar_greedy, mode
    # the oracle's swaps put the truth at rank 1: only the tree can take it, through a sibling
    assert out["tree"].tau > out["chain"].tau
    assert out["tree"].compactions > 0                     # paths with gaps were compacted
    assert out["chain"].compactions == 0                   # a chain's path is always in place
    assert out["shadow"].round_tokens == out["chain"].round_tokens


@pytest.mark.parametrize("drafter", ["random", "ngram"])
def test_greedy_lossless_with_real_drafters(tiny, ar_greedy, drafter: str) -> None:
    d: Any = RandomDrafter(96, horizon=5, seed=3) if drafter == "random" else NGramDrafter(96, horizon=5)
    for mode in ("chain", "tree"):
        assert Decoder(tiny, d, budget=16).generate(PROMPT, 48, mode).tokens == ar_greedy


def test_shadow_ledger_bounds_and_figures(tiny, ar_greedy) -> None:
    oracle = OracleDrafter(PROMPT + ar_greedy, 96, horizon=6, swap=0.35, seed=2)
    res = Decoder(tiny, oracle, budget=24).generate(PROMPT, 48, "shadow")
    recs = res.ledger.records
    assert recs and all(r.tree_tokens is not None for r in recs)
    assert all(r.chain_tokens <= r.tree_lower <= r.tree_tokens for r in recs)   # bound is a bound
    assert any(r.tree_lower > r.chain_tokens for r in recs)
    rep = res.ledger.report()
    assert rep.tau_tree >= rep.tau_tree_lower >= rep.tau_chain
    assert sum(rep.sibling_hits) == sum(len(r.sibling_depths) for r in recs) > 0
    assert res.target_forwards == 2 * res.rounds


@pytest.mark.parametrize("builder", ["heap", "vector"])
def test_every_round_the_spine_tree_commits_at_least_the_chain(tiny, ar_greedy, builder: str) -> None:
    """End to end: the shadow commits the chain and verifies the tree from the same draft on every
    round, so each record pairs the two on one round. Two near-equal candidates a depth make a
    best-first tree of 10 bushy and 3 deep; the spine tree still holds the 6-deep chain."""
    flat = OracleDrafter(PROMPT + ar_greedy, 96, horizon=6, swap=0.2, seed=4, margin=0.1)
    res = Decoder(tiny, flat, budget=10, builder=builder).generate(PROMPT, 48, "shadow")
    assert res.tokens == ar_greedy
    pairs = [(r.tree_tokens, r.chain_tokens) for r in res.ledger.records]
    assert pairs and all(t is not None and t >= c for t, c in pairs), pairs
    assert any(t > c for t, c in pairs)                            # and gains through siblings
    plain = Decoder(tiny, flat, budget=10, builder=builder, spine=False).generate(PROMPT, 48, "shadow")
    assert any(r.tree_tokens < r.chain_tokens for r in plain.ledger.records)   # what the spine prevents


def test_shadow_share_zero_verifies_no_tree(tiny, ar_greedy) -> None:
    oracle = OracleDrafter(PROMPT + ar_greedy, 96, horizon=6, swap=0.35)
    res = Decoder(tiny, oracle, budget=24, shadow_share=0.0).generate(PROMPT, 48, "shadow")
    assert res.tokens == ar_greedy and res.target_forwards == res.rounds
    assert all(r.tree_tokens is None for r in res.ledger.records)


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(0.7, top_k=12, top_p=0.9)])
def test_sampling_tree_reproduces_ar_with_shared_draws(tiny, params: SamplingParams) -> None:
    """One uniform per absolute position: AR, chain and tree must emit the same tokens. A walk that
    used the wrong node's logits, or drew from the draft, would desynchronise at once."""
    ar = Decoder(tiny, sampling=params, sampler=PositionalSampler(11)).generate(PROMPT, 40, "ar").tokens
    oracle = OracleDrafter(PROMPT + ar, 96, horizon=5, swap=0.4)
    for mode in ("chain", "tree", "shadow"):
        got = Decoder(tiny, oracle, budget=20, sampling=params, sampler=PositionalSampler(11)).generate(PROMPT, 40, mode)
        assert got.tokens == ar, mode
    other = Decoder(tiny, sampling=params, sampler=PositionalSampler(12)).generate(PROMPT, 40, "ar").tokens
    assert other != ar                                     # the coupling is what makes them equal


def chi_square_p(a: list[int], b: list[int]) -> float:
    """Two-sample chi-square homogeneity test p-value (Wilson-Hilferty approximation)."""
    cats = sorted(set(a) | set(b))
    na, nb = len(a), len(b)
    stat = 0.0
    for c in cats:
        oa, ob = a.count(c), b.count(c)
        tot = oa + ob
        ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
        stat += (oa - ea) ** 2 / ea + (ob - eb) ** 2 / eb
    k = max(1, len(cats) - 1)
    z = ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


def test_sampling_distribution_matches_ar_with_independent_draws() -> None:
    """Independent per-node draws (as in production): the tree's third token has AR's distribution.
    The same test rejects a decoder that samples at a higher temperature, so it has teeth."""
    from ddtree_ops.engine.models import tiny_llama

    model = tiny_llama(vocab_size=12, hidden=32, layers=1, heads=2, kv_heads=1, seed=5)
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)        # peaked conditionals: random init is near uniform
    prompt = [1, 2, 3]
    params = SamplingParams(temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    drafter = RandomDrafter(12, horizon=3, seed=0, scale=2.0)
    runs = 300

    def third(mode: str, p: SamplingParams) -> list[int]:
        dec = Decoder(model, drafter, budget=8, sampling=p, sampler=MultinomialSampler(gen))
        return [dec.generate(prompt, 3, mode).tokens[2] for _ in range(runs)]

    ar, tree = third("ar", params), third("tree", params)
    assert chi_square_p(ar, tree) > 1e-3
    hot = third("tree", SamplingParams(temperature=3.0))
    assert chi_square_p(ar, hot) < 1e-3


def test_drafter_sees_hidden_features_of_committed_tokens(tiny, ar_greedy) -> None:
    seen: list[tuple[int, torch.Tensor]] = []

    class Probe(OracleDrafter):
        hidden_layers = (1, 2)

        def draft(self, context: list[int], hidden: torch.Tensor | None = None) -> torch.Tensor:
            assert hidden is not None
            seen.append((len(context), hidden.clone()))
            return super().draft(context, hidden)

    Decoder(tiny, Probe(PROMPT + ar_greedy, 96, horizon=5, swap=0.4), budget=16).generate(PROMPT, 40, "tree")
    assert seen
    for n_ctx, hidden in seen:
        assert hidden.shape == (n_ctx - 1, 2 * 64)       # every committed token but the root
    n_ctx, hidden = seen[-1]
    ids = torch.tensor((PROMPT + ar_greedy)[: n_ctx - 1])
    out = tiny(input_ids=ids.view(1, -1), output_hidden_states=True)
    ref = torch.cat([out.hidden_states[1][0], out.hidden_states[2][0]], dim=-1)
    torch.testing.assert_close(hidden, ref, rtol=1e-4, atol=1e-4)


def test_decoder_rejects_bad_input(tiny) -> None:
    with pytest.raises(ValueError, match="mode"):
        Decoder(tiny).generate(PROMPT, 4, "beam")
    with pytest.raises(ValueError, match="drafter"):
        Decoder(tiny).generate(PROMPT, 4, "tree")
    with pytest.raises(ValueError, match="max_new_tokens"):
        Decoder(tiny).generate(PROMPT, 0, "ar")
    with pytest.raises(ValueError, match="share"):
        Decoder(tiny, shadow_share=2.0)


def test_eos_stops_every_mode_at_the_same_place(tiny, ar_greedy) -> None:
    eos = ar_greedy[20]
    ar = Decoder(tiny, eos_token_id=eos).generate(PROMPT, 48, "ar").tokens
    assert ar[-1] == eos and len(ar) <= 21
    oracle = OracleDrafter(PROMPT + ar_greedy, 96, horizon=6, swap=0.3)
    for mode in ("chain", "tree", "shadow"):
        assert Decoder(tiny, oracle, budget=16, eos_token_id=eos).generate(PROMPT, 48, mode).tokens == ar
