"""Shadow accounting: the lower bound, the paired test and its calls, the online (SGLang) path
and the worker mixin against stand-ins for DFlash's three methods."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ddtree_ops.engine.shadow import (
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


class FakeDFlash:
    """Stand-in for DFlashWorkerV2's three hooked methods, with sglang 0.5.23's signatures."""

    block_size = 4

    def __init__(self) -> None:
        self.sampler_built = self._maybe_build_draft_sampler()   # the real constructor calls it too

    def _maybe_build_draft_sampler(self) -> Any:
        return "in-graph sampler"

    def _greedy_sample_from_vocab_parallel_head(self, *, hidden_states: Any, lm_head: Any, chunk_size: int = 256) -> Any:
        return torch.argmax(hidden_states @ lm_head.weight.T, dim=-1)

    def _accept_block(self, *, candidates: Any, next_token_logits: Any, sampling_info: Any, draft_input: Any,
                      prefix_lens: Any, bs: int, target_predict: Any = None) -> Any:
        accept = torch.zeros(bs, dtype=torch.long)
        return accept, accept + 1, torch.full((bs,), 7), candidates, None


def test_worker_mixin_commits_what_dflash_commits(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddtree_ops.engine.sglang_shadow import ShadowWorkerMixin

    monkeypatch.setenv("DDTREE_SHADOW_SHARE", "1.0")
    monkeypatch.setenv("DDTREE_BUDGET", "6")
    monkeypatch.setenv("DDTREE_SHADOW_REPORT_EVERY", "1")

    class Worker(ShadowWorkerMixin, FakeDFlash):
        pass

    w = Worker()
    assert w.sampler_built is None                              # eager head while shadowing
    head = torch.nn.Linear(8, 20, bias=False)
    hidden = torch.randn(2 * 3, 8)
    draft = w._greedy_sample_from_vocab_parallel_head(hidden_states=hidden, lm_head=head)
    assert torch.equal(draft, FakeDFlash._greedy_sample_from_vocab_parallel_head(w, hidden_states=hidden, lm_head=head))
    cands = torch.cat([torch.tensor([[1], [2]]), draft.view(2, 3)], dim=1)
    out = w._accept_block(candidates=cands, next_token_logits=None, sampling_info=None, draft_input=None,
                          prefix_lens=None, bs=2)
    assert torch.equal(out[2], torch.full((2,), 7))              # DFlash's result passes through
    st = w._ddtree()
    assert st.budget == 6 and len(st.acct.ledger.records) == 2
    assert all(r.chain_tokens == 1 for r in st.acct.ledger.records)


def test_worker_mixin_off_keeps_the_in_graph_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddtree_ops.engine.sglang_shadow import ShadowWorkerMixin

    monkeypatch.setenv("DDTREE_SHADOW_SHARE", "0")

    class Worker(ShadowWorkerMixin, FakeDFlash):
        pass

    assert Worker().sampler_built == "in-graph sampler"


def test_mixin_hooks_match_sglang_dflash_worker_signatures() -> None:
    """The real DFlashWorkerV2 cannot be imported on CPU (its import chain needs the GPU stack), so
    read its source: the three hooked methods must exist with the keyword names the mixin uses."""
    import ast
    import importlib.util
    import pathlib

    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        pytest.skip("sglang not installed")
    src = pathlib.Path(spec.origin).parent / "srt" / "speculative" / "dflash_worker_v2.py"
    cls = next(n for n in ast.parse(src.read_text()).body if isinstance(n, ast.ClassDef) and n.name == "DFlashWorkerV2")
    methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
    kwonly = lambda f: {a.arg for a in f.args.kwonlyargs}  # noqa: E731
    assert "_maybe_build_draft_sampler" in methods
    assert {"hidden_states", "lm_head", "chunk_size"} <= kwonly(methods["_greedy_sample_from_vocab_parallel_head"])
    assert {"candidates", "next_token_logits", "sampling_info", "draft_input", "prefix_lens", "bs",
            "target_predict"} == kwonly(methods["_accept_block"])
    # and the worker really returns (accept_len, commit_lens, bonus, out_tokens, new_seq_lens)
    ret = [n for n in ast.walk(methods["_accept_block"]) if isinstance(n, ast.Return)][-1]
    assert [e.id for e in ret.value.elts] == ["accept_len", "commit_lens", "bonus", "out_tokens", "new_seq_lens"]
