"""Shadow accounting: the lower bound, the paired test and its calls, the online (SGLang) path
and the worker mixin against stand-ins for DFlash's three methods."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch
from dflash_fakes import FakeBatch, FakeDFlash, VERSIONS, class_node, dflash_worker_source, shadow_env

from ddtree_ops.engine.shadow import (
    BoundTally,
    INCONCLUSIVE,
    KEEP_CHAIN,
    PROMOTE,
    OnlineShadow,
    RoundRecord,
    ShadowLedger,
    sign_test,
    spine_lower_bound,
)
from ddtree_ops.engine.tree import build_tree_heap, draft_topk

pytestmark = pytest.mark.engine


def test_sign_test_exact_values() -> None:
    assert sign_test([1.0] * 5) == (pytest.approx(1 / 32), 1.0, 5)
    assert sign_test([0.0, 0.0]) == (1.0, 1.0, 0)
    p_pos, p_neg, n = sign_test([1, -1, 1, 0])
    assert n == 3 and p_pos == pytest.approx(0.5) and p_neg == pytest.approx(0.875)


def test_sign_test_tail_matches_the_exact_binomial() -> None:
    import math

    from ddtree_ops.engine.shadow import half_binomial_tail

    for n in range(1, 90):
        for k in range(-1, n + 2):
            exact = sum(math.comb(n, i) for i in range(max(k, 0), n + 1)) / 2 ** n if k <= n else 0.0
            assert half_binomial_tail(n, k) == pytest.approx(exact, rel=1e-9, abs=1e-300)


@pytest.mark.timeout(60)
def test_a_serving_report_over_a_million_rounds_returns() -> None:
    """The plugin reports every few rounds over all rounds so far: the test must not grow with
    them (summing big-integer binomials did, and stalled real SGLang at share 1.0)."""
    tally = BoundTally(horizon=15, cost_ratio=1.09)
    for _ in range(200):
        tally.add(3, 2)
    tally.rounds = tally.neg = 1_000_000            # as after a day of serving
    tally.chain_sum, tally.lower_sum = 3_000_000, 2_000_000
    for _ in range(50):
        rep = tally.report()
    assert rep.recommendation == INCONCLUSIVE and rep.p_tree_better == pytest.approx(1.0)


def ledger_with(tree: list[int], chain: list[int], tree_s: float, chain_s: float) -> ShadowLedger:
    led = ShadowLedger(horizon=4, min_rounds=10)
    for t, c in zip(tree, chain):
        led.add(RoundRecord(chain_tokens=c, chain_verify_s=chain_s, chain_nodes=5, tree_lower=c,
                            tree_tokens=t, tree_verify_s=tree_s, tree_build_s=0.0, tree_nodes=9))
    return led


def test_recommendation_follows_cost_adjusted_paired_rounds() -> None:
    gain = ledger_with([4] * 30, [2] * 30, tree_s=1.2, chain_s=1.0).report()
    assert gain.recommendation == PROMOTE and gain.cost_ratio == pytest.approx(1.2)
    assert gain.projected_speedup == pytest.approx((4 / 2) / 1.2)
    # +1 token a round is not worth a 3x verify
    costly = ledger_with([3] * 30, [2] * 30, tree_s=3.0, chain_s=1.0).report()
    assert costly.recommendation == KEEP_CHAIN
    few = ledger_with([4] * 5, [2] * 5, tree_s=1.0, chain_s=1.0).report()
    assert few.recommendation == INCONCLUSIVE


def test_lower_bound_cases() -> None:
    logits = torch.full((3, 10), -10.0)
    logits[0, 1], logits[0, 2] = 5.0, 4.0          # depth 1: 1 then 2
    logits[1, 3], logits[1, 4] = 5.0, 4.0          # depth 2: 3 then 4
    logits[2, 5] = 5.0
    tree = build_tree_heap(draft_topk(logits, 5), 5, 0)   # spine 1-3-5, sibling 2, then 4 under 1
    chain = [0, 1, 3, 5]
    assert spine_lower_bound(tree, chain, 0, 2) == 2      # chain took nothing; bonus 2 is a depth-1 sibling
    assert spine_lower_bound(tree, chain, 0, 7) == 1      # bonus not in the tree
    assert spine_lower_bound(tree, chain, 1, 4) == 3      # one accepted, then sibling 4 under it
    assert spine_lower_bound(tree, chain, 3, 9) == 4      # whole chain, nothing below the leaf


def test_online_shadow_batch_and_bound_only_report() -> None:
    reports: list[Any] = []
    acct = OnlineShadow(budget=4, horizon=3, report_every=2, on_report=reports.append, min_rounds=2, cost_ratio=1.0)
    logits = torch.full((2, 3, 10), -10.0)
    logits[:, 0, 1], logits[:, 0, 2] = 5.0, 4.0
    logits[:, 1, 3], logits[:, 1, 4] = 5.0, 4.0
    logits[:, 2, 5] = 5.0
    from ddtree_ops.engine.tree import topk_logprobs

    toks, scores = topk_logprobs(logits, 4)
    cands = torch.tensor([[0, 1, 3, 5], [0, 1, 3, 5]])
    bounds = acct.observe(toks, scores, cands, torch.tensor([0, 1]), torch.tensor([2, 9]))
    assert bounds == [2, 2]
    assert len(reports) == 1 and reports[0].rounds == 2
    assert reports[0].tau_chain == 1.5 and reports[0].tau_tree_lower == 2.0
    assert reports[0].sibling_hits[0] == 1
    assert reports[0].recommendation in (PROMOTE, INCONCLUSIVE)   # a bound never says keep-chain



@pytest.mark.parametrize("version", VERSIONS)
def test_worker_mixin_commits_what_dflash_commits_and_accounts_every_row(monkeypatch: pytest.MonkeyPatch,
                                                                         version: str) -> None:
    from ddtree_ops.engine.sglang_shadow import ShadowWorkerMixin
    from ddtree_ops.engine.sglang_topk import FoldedTopK

    shadow_env(monkeypatch, DDTREE_SHADOW_SHARE="1.0", DDTREE_BUDGET="6", DDTREE_SHADOW_REPORT_EVERY="4")

    class Worker(ShadowWorkerMixin, FakeDFlash):
        pass

    w = Worker(accept=[0, 2], bonus=[7, 9], version=version)
    plain = FakeDFlash(accept=[0, 2], bonus=[7, 9], version=version)
    # the draft head stays in the graph, with the top-K folded in beside DFlash's argmax
    assert isinstance(w._draft_sampler, FoldedTopK) and type(plain._draft_sampler).__name__ == "_DflashDraftSampler"
    assert w.forward_batch_generation(FakeBatch("extend")).accept_lens is None   # prefill passes through
    out = w.forward_batch_generation(FakeBatch("decode"))
    ref = plain.forward_batch_generation(FakeBatch("decode"))
    assert out.accept_lens.tolist() == [1, 3]                   # DFlash's result passes through untouched
    assert torch.equal(w.last_draft, plain.last_draft)          # the same chain drafted
    st = w._ddtree()
    assert st.budget == 6 and st.verify_rounds == 1 and st.accountant.in_flight() == 1
    w.forward_batch_generation(FakeBatch("decode"))             # the earlier round is accounted now
    st.drain(wait=True)
    assert st.accounted == 4 and st.acct.tally.rounds == 4
    assert w.eager_rounds == 0 and w.graph_rounds == 2 and st.path == "graph"
    rep = st.acct.report()
    assert rep.tau_chain == 2.0                                 # rows committed 1 and 3 tokens, twice
    assert rep.tau_tree_lower >= 1.0


def test_worker_mixin_off_keeps_dflash_own_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddtree_ops.engine.sglang_shadow import ShadowWorkerMixin

    shadow_env(monkeypatch, DDTREE_SHADOW_SHARE="0")

    class Worker(ShadowWorkerMixin, FakeDFlash):
        pass

    assert type(Worker(accept=[0], bonus=[1])._draft_sampler).__name__ == "_DflashDraftSampler"


def test_silent_shadow_is_said_once_with_its_reason(monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    """What 0.5.17 did to the first plugin: DFlash served, nothing was accounted, nothing was said."""
    from ddtree_ops.engine.sglang_shadow import SILENT, ShadowWorkerMixin

    shadow_env(monkeypatch, DDTREE_SHADOW_SHARE="1.0", DDTREE_SHADOW_WARN_AFTER="3")

    class NoHeadCall(FakeDFlash):         # a release whose decode path never calls the eager head
        def _greedy_sample_from_vocab_parallel_head(self, **kw: Any) -> Any:
            raise AssertionError("not called on this path")

        def forward_batch_generation(self, batch: Any, on_publish: Any = None) -> Any:
            self._draft_block_tokens_buf = torch.zeros((1, 4), dtype=torch.long)
            return types.SimpleNamespace(accept_lens=torch.tensor([1]),
                                         next_draft_input=types.SimpleNamespace(bonus_tokens=torch.tensor([0])))

    class Worker(ShadowWorkerMixin, NoHeadCall):
        pass

    w = Worker(accept=[0], bonus=[0], graphs=False)        # no draft graph either: nothing reads the head
    with caplog.at_level("WARNING", logger="ddtree_ops.engine.sglang"):
        for _ in range(6):
            w.forward_batch_generation(FakeBatch("decode"))
    said = [r.getMessage() for r in caplog.records if "no round accounted" in r.getMessage()]
    assert said == [SILENT % (3, w._ddtree().silence_reason())]
    assert "draft head never ran" in said[0]
    # and what smoke reads from /metrics says the same
    from prometheus_client import REGISTRY, generate_latest

    exposed = generate_latest(REGISTRY).decode()
    assert 'ddtree_shadow_silent{reason="the draft head never ran' in exposed
    assert "ddtree_shadow_verify_rounds 3.0" in exposed


def test_heap_spine_bound_is_the_tree_walk() -> None:
    """The serving path's list version against build_tree_heap + spine_lower_bound, ties included."""
    import random

    from ddtree_ops.engine.shadow import heap_spine_bound

    rng = random.Random(7)
    for _ in range(2000):
        depth, k, vocab, budget = rng.randint(1, 6), rng.randint(1, 5), 8, rng.randint(1, 24)
        logits = torch.tensor([[rng.choice([0.0, 1.0, 2.0, -1.0]) for _ in range(vocab)] for _ in range(depth)])
        from ddtree_ops.engine.tree import topk_logprobs

        tk, sc = topk_logprobs(logits, k)
        chain = [0] + (tk[:, 0].tolist() if rng.random() < 0.7 else [rng.randrange(vocab) for _ in range(depth)])
        accepted, bonus = rng.randint(0, depth), rng.randrange(vocab)
        tree = build_tree_heap(draft_topk_from(tk, sc), budget, 0)
        assert heap_spine_bound(tk.tolist(), sc.tolist(), budget, chain, accepted, bonus) == (
            spine_lower_bound(tree, chain, accepted, bonus), tree.size)


def draft_topk_from(tokens: Any, scores: Any) -> Any:
    from ddtree_ops.engine.tree import DraftTopK

    return DraftTopK(tokens=tokens, scores=scores)


def test_bound_tally_reports_what_the_ledger_reports() -> None:
    """Constant-memory totals give the ledger's bound report over the same rounds."""
    import random

    from ddtree_ops.engine.shadow import BoundTally

    rng = random.Random(3)
    for ratio in (0.8, 1.0, 1.3):
        tally, led = BoundTally(horizon=6, cost_ratio=ratio), ShadowLedger(horizon=6)
        for _ in range(300):
            chain = rng.randint(1, 7)
            lower = max(1, min(7, chain + rng.choice([-1, 0, 0, 1])))
            tally.add(chain, lower)
            led.add(RoundRecord(chain_tokens=chain, chain_verify_s=0.0, chain_nodes=7, tree_lower=lower,
                                sibling_depths=[chain] if lower > chain else []))
        a, b = tally.report(), led.report(cost_ratio=ratio)
        assert (a.rounds, a.chain_hist, a.sibling_hits, a.recommendation) == (b.rounds, b.chain_hist,
                                                                               b.sibling_hits, b.recommendation)
        assert a.tau_chain == pytest.approx(b.tau_chain) and a.tau_tree_lower == pytest.approx(b.tau_tree_lower)
        assert a.p_tree_better == pytest.approx(b.p_tree_better)


DFLASH_SOURCES = {"0.5.23": "installed sglang (CPU)", "0.5.17": "the sglang 0.5.17 wheel the install step fetches"}


@pytest.mark.parametrize("version", sorted(DFLASH_SOURCES))
def test_mixin_hooks_match_each_supported_dflash_worker(version: str) -> None:
    """The real DFlashWorkerV2 cannot be imported on CPU (its import chain needs the GPU stack), so
    read its source, for every release in the plugin's table: the hooked methods exist with the
    keyword names the mixin uses, the decode path calls the eager head and keeps the verified
    block in `_draft_block_tokens_buf`, and its result carries accept_lens and next_draft_input."""
    import ast

    from ddtree_ops.engine.sglang_settings import SUPPORTED

    assert version in SUPPORTED
    src = dflash_worker_source(version)
    assert src is not None, f"no source for sglang {version}: {DFLASH_SOURCES[version]} is missing (make install)"
    cls = next(n for n in ast.parse(src).body if isinstance(n, ast.ClassDef) and n.name == "DFlashWorkerV2")
    methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
    kwonly = lambda f: {a.arg for a in f.args.kwonlyargs}  # noqa: E731
    assert "_maybe_build_draft_sampler" in methods
    assert {"hidden_states", "lm_head", "chunk_size"} <= kwonly(methods["_greedy_sample_from_vocab_parallel_head"])
    fbg = methods["forward_batch_generation"]
    assert [a.arg for a in fbg.args.args[:2]] == ["self", "batch"]
    body = ast.unparse(fbg)
    assert "self._greedy_sample_from_vocab_parallel_head(" in body
    assert "draft_tokens = self._draft_block_tokens_buf[:bs]" in body
    results = [n for n in ast.walk(fbg) if isinstance(n, ast.Call) and ast.unparse(n.func) == "GenerationBatchResult"]
    decode = max(results, key=lambda n: n.lineno)   # the verify round's result: the function's last return
    kw = {k.arg: ast.unparse(k.value) for k in decode.keywords}
    assert kw["accept_lens"] == "commit_lens" and kw["next_draft_input"] == "next_draft_input"
    assert "bonus_tokens=bonus" in body
    # the folded head: with the sampler in the graph the round reads its `out` (and never calls the
    # eager head), which FoldedTopK keeps as DFlash's own buffer
    assert "self._draft_sampler.out[" in body and "draft_out.can_run_graph" in body
    # the sampler is built before the draft graph capture and run by the capture tail hook
    init = ast.unparse(methods["init_cuda_graphs"])
    assert init.index("self._maybe_build_draft_sampler()") < init.index("capture_tail_hooks.append") < \
        init.index("self._draft_worker.init_cuda_graphs(")
    assert "make_draft_sampler_capture_hook(self._draft_sampler)" in init
    # and DFlash's sampler has the fields and the call FoldedTopK takes over
    sampler = class_node(src, "_DflashDraftSampler")
    init_args = {a.arg for a in next(f for f in sampler.body if isinstance(f, ast.FunctionDef)
                                     and f.name == "__init__").args.kwonlyargs}
    assert {"weight", "block_size", "num_org", "org_vocab_start", "max_bs", "tp_group"} <= init_args
    call = ast.unparse(next(f for f in sampler.body if isinstance(f, ast.FunctionDef) and f.name == "__call__"))
    for stmt in ("hs = hidden_states.view(bs, self.block_size, -1)[:, 1:, :].reshape(-1, hidden_states.shape[-1])",
                 "logits = torch.matmul(hs, self.weight[:self.num_org].T)",
                 "tokens = torch.argmax(logits, dim=-1).to(torch.long)", "self.out[:n].copy_(tokens)"):
        assert stmt in call, stmt


@pytest.mark.parametrize("layers,line", [([0, 2], "DDTREE registered as DFlash-family, hidden capture layers [0, 2]"),
                                         (None, "DDTREE worker started without target hidden capture")])
def test_worker_says_which_target_layers_sglang_captures(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
                                                         layers: Any, line: str) -> None:
    """The journal's proof that the hidden capture was set up (or that it was not)."""
    from ddtree_ops.engine.sglang_shadow import ShadowWorkerMixin

    shadow_env(monkeypatch, DDTREE_SHADOW_SHARE="0.5")

    class Runner:
        spec_aux_config = types.SimpleNamespace(dflash_target_layer_ids=layers)
        model_config = types.SimpleNamespace(vocab_size=20)

    class Worker(ShadowWorkerMixin, FakeDFlash):
        def __init__(self) -> None:
            self.model_runner = Runner()
            super().__init__(accept=[0], bonus=[1])

    with caplog.at_level("INFO", logger="ddtree_ops.engine.sglang"):
        Worker()
    said = [r.getMessage() for r in caplog.records]
    assert sum(line in m for m in said) == 1, said
