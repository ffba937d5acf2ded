"""The shadow's exact tree acceptance under greedy decoding, and the verdict made from it.

Under greedy decoding the committed tokens are the target's greedy continuation, so the tree
accepts the longest prefix of them that is a path in it, plus the target's next token. Checked
here against the engine's own tree verification (`build_tree_heap` + `verify.walk` with the
target's choice at every node), on random trees and end to end through the worker mixin, with a
fake DFlash that verifies against a known deterministic target (`dflash_fakes.GreedyDFlash`)."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from dflash_fakes import FakeBatch, FakeRequest, GreedyDFlash, shadow_env, target_next

from ddtree_ops.engine.shadow import KEEP_CHAIN, PROMOTE, INCONCLUSIVE, OnlineShadow, greedy_walk, heap_tree

pytestmark = pytest.mark.engine


def test_greedy_walk_is_the_engine_tree_verification() -> None:
    from ddtree_ops.engine.tree import build_tree_heap, draft_topk
    from ddtree_ops.engine.verify import walk

    rng = random.Random(5)
    for case in range(1500):
        depth, vocab, budget = rng.randint(1, 6), rng.choice([3, 5, 9]), rng.randint(1, 30)
        logits = torch.tensor([[rng.choice([0.0, 1.0, 2.0, 3.0]) for _ in range(vocab)] for _ in range(depth)])
        k = min(budget, vocab)
        tok, sc = (x.tolist() for x in draft_topk(logits, k).__dict__.values())
        children, ranks = heap_tree(tok, sc, budget)
        prompt = (rng.randrange(vocab), rng.randrange(vocab), case % vocab)
        ref_tree = build_tree_heap(draft_topk(logits, k), budget, prompt[-1])
        assert ref_tree.children() == children
        # the target's choice at every node, given the path to it
        toks, parents, post = ref_tree.tokens.tolist(), ref_tree.parents.tolist(), []
        for node in range(ref_tree.size):
            path, n = [], node
            while n > 0:
                path.append(toks[n])
                n = parents[n]
            post.append(target_next(prompt + tuple(path[::-1]), vocab))
        accepted, _bonus = walk(ref_tree.children(), post)
        continuation, ctx = [], list(prompt)
        for _ in range(depth + 1):
            continuation.append(target_next(tuple(ctx), vocab))
            ctx.append(continuation[-1])
        got = greedy_walk(children, ranks, continuation, depth)
        assert got is not None and got[0] == len(accepted), case
        assert got[1] == [ref_tree.depths[n].item() for n in accepted[1:] if ref_tree.ranks[n].item() > 0]
        # a continuation cut before the walk leaves the tree is undecided, never guessed
        short = greedy_walk(children, ranks, continuation[:len(accepted) - 2], depth) if len(accepted) >= 2 else None
        if len(accepted) >= 2 and children[0]:
            assert short is None



def serve(worker: Any, reqs: list[FakeRequest], rounds: int, lag: int = 1) -> None:
    """The scheduler's loop: prefill, then verify rounds; each round's committed tokens reach the
    requests' output_ids `lag` rounds later (the overlap scheduler processes a result after it
    launched the next round)."""
    worker.forward_batch_generation(FakeBatch("extend", reqs))
    backlog: list[dict[int, list[int]]] = []
    for _ in range(rounds):
        live = [r for r in reqs if not r.finished()]
        if not live:
            break
        seq_lens = [len(worker.seqs[id(r)]) - 1 for r in live]
        worker.forward_batch_generation(FakeBatch("decode", live, seq_lens))
        backlog.append({id(r): worker.committed(r)[:r.max_new] for r in reqs})
        while len(backlog) > lag:
            for r in reqs:
                r.output_ids = list(backlog[0][id(r)])
            backlog.pop(0)
    for snap in backlog:
        for r in reqs:
            r.output_ids = list(snap[id(r)])


def go_on(worker: Any, reqs: list[FakeRequest]) -> None:
    """The requests keep decoding after the last sampled round: their greedy continuation gets
    committed, so every sampled round's walk is decided."""
    for r in reqs:
        ctx = list(worker.seqs[id(r)])
        for _ in range(worker.block_size):
            ctx.append(target_next(tuple(ctx), worker.vocab))
        r.output_ids = ctx[len(r.origin_input_ids):]


@pytest.mark.parametrize("thread", ["0", "1"])
@pytest.mark.parametrize("lag", [0, 1])
def test_exact_tau_tree_through_the_worker_equals_the_engine_tree_verify(monkeypatch: pytest.MonkeyPatch,
                                                                        thread: str, lag: int) -> None:
    from ddtree_ops.engine.sglang_shadow import ShadowWorkerMixin

    shadow_env(monkeypatch, DDTREE_SHADOW_SHARE="1.0", DDTREE_BUDGET="8", DDTREE_SHADOW_REPORT_EVERY="1000",
               DDTREE_SHADOW_ACCOUNT_THREAD=thread)

    class Worker(ShadowWorkerMixin, GreedyDFlash):
        pass

    w = Worker(budget=8, seed=3)
    reqs = [FakeRequest([1, 2, 3]), FakeRequest([4, 5]), FakeRequest([6, 7, 8, 9])]
    serve(w, reqs, rounds=40, lag=lag)
    go_on(w, reqs)
    st = w._ddtree()
    st.drain(wait=True)
    rep = st.acct.report()
    chain = [c for c, _ in w.truth]
    tree = [t for _, t in w.truth]
    assert st.accounted == len(w.truth) == 120
    assert (rep.sampled_rounds, rep.dropped_rounds, st.accountant.book.misaligned) == (120, 0, 0)
    assert rep.tau_chain == pytest.approx(sum(chain) / len(chain))
    assert rep.tau_tree == pytest.approx(sum(tree) / len(tree))
    assert rep.tau_tree > rep.tau_chain                         # rank-1 and rank-2 siblings pay here
    assert rep.tau_tree >= rep.tau_tree_lower


def test_a_request_that_ends_first_drops_its_undecided_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddtree_ops.engine.sglang_shadow import ShadowWorkerMixin

    shadow_env(monkeypatch, DDTREE_SHADOW_SHARE="1.0", DDTREE_BUDGET="8")

    class Worker(ShadowWorkerMixin, GreedyDFlash):
        pass

    w = Worker(budget=8, seed=4)
    req = FakeRequest([1, 2, 3], max_new=30)
    serve(w, [req], rounds=100)
    st = w._ddtree()
    st.drain(wait=True)
    rep = st.acct.report()
    assert req.finished() and rep.rounds == len(w.truth)
    assert rep.dropped_rounds >= 1 and rep.sampled_rounds + rep.dropped_rounds == rep.rounds
    assert st.accountant.book.pending == 0                      # nothing kept for an ended request


def test_exact_figures_match_the_ground_truth_round_by_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """One request, every round sampled: the k-th decided round is the k-th round served."""
    from ddtree_ops.engine.sglang_shadow import ShadowWorkerMixin

    shadow_env(monkeypatch, DDTREE_SHADOW_SHARE="1.0", DDTREE_BUDGET="6")

    class Worker(ShadowWorkerMixin, GreedyDFlash):
        pass

    w = Worker(budget=6, seed=9)
    req = FakeRequest([3, 1, 4])
    seen: list[tuple[int, int]] = []
    st = w._ddtree()
    real = st.acct.observe_exact
    monkeypatch.setattr(st.acct, "observe_exact", lambda c, t, s: (seen.append((c, t)), real(c, t, s)))
    serve(w, [req], rounds=80, lag=1)
    st.drain(wait=True)
    assert len(seen) >= 70
    assert seen == w.truth[:len(seen)]


def test_temperature_rows_keep_the_lower_bound_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddtree_ops.engine.sglang_shadow import ShadowWorkerMixin

    shadow_env(monkeypatch, DDTREE_SHADOW_SHARE="1.0", DDTREE_BUDGET="6")

    class Worker(ShadowWorkerMixin, GreedyDFlash):
        pass

    w = Worker(budget=6, seed=2)
    serve(w, [FakeRequest([1, 2], greedy=False)], rounds=30)
    st = w._ddtree()
    st.drain(wait=True)
    rep = st.acct.report()
    assert rep.rounds == 30 and rep.sampled_rounds == 0 and rep.tau_tree is None
    assert rep.recommendation in (PROMOTE, INCONCLUSIVE)       # a bound never says keep-chain


class _Req:
    def __init__(self, prompt: list[int], out: list[int], done: bool = False) -> None:
        self.origin_input_ids, self.output_ids, self.done = prompt, out, done
        self.sampling_params = None

    def finished(self) -> bool:
        return self.done


def test_horizon_book_waits_decides_drops_and_checks_alignment() -> None:
    from ddtree_ops.engine.sglang_horizon import HorizonBook, PendingTree

    acct = OnlineShadow(budget=4, horizon=3, cost_ratio=1.0, cost_source="test")
    book = HorizonBook(acct, horizon=3, limit=3)
    # root 7 then a chain 1 -> 2 -> 3 in the tree; a sibling 5 at depth 1
    children = [{1: 1, 5: 4}, {2: 2}, {3: 3}, {}, {}]
    ranks = [0, 0, 0, 0, 1]
    req = _Req([9, 9], [8, 7])                    # root 7 sits at position 3 (prompt 2 + index 1)
    book.add(req, PendingTree(children, ranks, root_pos=3, root_token=7, chain_tokens=2))
    assert book.resolve() == 0                    # nothing committed after the root yet
    req.output_ids += [1, 2]
    assert book.resolve() == 0                    # 1, 2 match: the walk could go deeper
    req.output_ids += [3]
    assert book.resolve() == 1 and acct.exact.n == 1 and acct.exact.tree_sum == 4   # whole depth + bonus
    req2 = _Req([0], [7, 5, 6])                   # sibling 5 at depth 1, then a miss
    book.add(req2, PendingTree(children, ranks, 1, 7, 1))
    book.add(_Req([0], [6, 1]), PendingTree(children, ranks, 1, 7, 1))      # root is 6, not 7: misaligned
    ended = _Req([0], [7, 1], done=True)          # ends while the walk still matches
    book.add(ended, PendingTree(children, ranks, 1, 7, 1))
    book.add(_Req([0], []), PendingTree(children, ranks, 1, 7, 1))          # past the limit of 3
    book.resolve()
    assert acct.exact.n == 2 and acct.exact.hits[0] == 1 and acct.exact.tree_sum == 4 + 2
    assert book.misaligned == 1 and acct.dropped == 3 and book.pending == 0


def test_verdict_from_exact_rounds_weighs_the_tree_against_its_cost() -> None:
    def run(pairs: list[tuple[int, int]], ratio: float) -> Any:
        acct = OnlineShadow(budget=8, horizon=7, cost_ratio=ratio, cost_source="test")
        for c, t in pairs:
            acct.tally.add(c, c)
            acct.observe_exact(c, t, [])
        return acct.report()

    rng = random.Random(1)
    gain = [(c, c + (1 if rng.random() < 0.3 else 0)) for c in (rng.randint(1, 5) for _ in range(2000))]
    # +0.3 tokens on ~3 a round is +10%: worth a 1.05x verify, not a 1.2x one
    assert run(gain, 1.05).recommendation == PROMOTE
    assert run(gain, 1.2).recommendation == KEEP_CHAIN
    # the mean decides, not the median: most rounds tie (and lose at r > 1) while the tree still pays
    rare = [(3, 3)] * 1600 + [(3, 6)] * 400
    assert run(rare, 1.1).recommendation == PROMOTE
    assert run(gain[:10], 1.05).recommendation == INCONCLUSIVE          # too few rounds
    rep = run(gain, 1.05)
    assert rep.cost_ratio == 1.05 and rep.tau_tree / rep.tau_chain_sampled == pytest.approx(
        sum(t for _, t in gain) / sum(c for c, _ in gain))


def test_cost_ratio_is_the_env_or_the_measured_default() -> None:
    """The default is read off the committed verify-cost table (bench/results/engine.md): a tree of
    B + 1 tokens against the chain's block, never below 1."""
    from ddtree_ops.engine.sglang_settings import COST_FROM_BENCH, COST_FROM_ENV, cost_ratio, default_cost_ratio, read_settings

    assert default_cost_ratio(16, 16) == pytest.approx(15.3 / 14.0, abs=1e-3)       # N = 17 against 16
    assert default_cost_ratio(128, 16) == pytest.approx(16.9 / 14.0, abs=1e-3)
    assert default_cost_ratio(15, 16) == 1.0                                        # as many tokens as the chain
    assert default_cost_ratio(32, 16) < default_cost_ratio(256, 16) < default_cost_ratio(1024, 16)
    assert cost_ratio(read_settings({})[0], 16, 16) == (default_cost_ratio(16, 16), COST_FROM_BENCH)
    assert cost_ratio(read_settings({"DDTREE_VERIFY_COST_RATIO": "1.3"})[0], 16, 16) == (1.3, COST_FROM_ENV)
