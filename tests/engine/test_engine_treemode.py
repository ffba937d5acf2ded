"""DDTREE_MODE=tree on CPU: the tree worker mixin against a fake DFlash that verifies against a known
target, with a backend that does what SGLang's tree verify will (issue 33): the draft, the engine's
tree from the folded top-K, the target's choice at every node, the walk committed.

Checked against ground truth computed another way: the chain's acceptance from DFlash's own argmax
chain against the target's continuation, the tree's from the engine's `build_tree_heap` and
`verify.walk`. And: the spine-only share, the measured cost ratio per batch bucket, the cross-check of
what a backend commits, the refusals where no backend exists, the validator's answers."""

from __future__ import annotations

import json
import random
from dataclasses import replace
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from dflash_fakes import (FakeBatch, FakeDFlash, FakeRequest, VERSIONS, dflash_worker_source, draft_logits, shadow_env,
                          target_next)

from ddtree_ops.engine.sglang_backend import TreeRound, build_tree, spine_tokens, walk
from ddtree_ops.lab.standin.shadow import ForwardMode  # SGLang's ForwardMode as the plugin asks it
from ddtree_ops.treestats import FROM_ENV, FROM_MEASURED, parse_metrics, verdict, window

pytestmark = pytest.mark.engine

CHAIN_S, NODE_S = 0.010, 0.0004     # the fake's verify forward: a fixed cost and a cost per token verified


class TreeTarget(FakeDFlash):
    """DFlash against `target_next`, as `dflash_fakes.GreedyDFlash`, with its draft split out so that a
    tree round can run it: the draft's logits put the target's token at rank 0, 1 or 2 at random."""

    block_size = 5
    hidden = vocab = 24

    def __init__(self, seed: int = 0, **kw: Any) -> None:
        self.rng = torch.Generator().manual_seed(seed)
        self.seqs: dict[int, list[int]] = {}
        self.truth: list[tuple[int, int]] = []          # (chain, tree) of every tree-round row
        self.chain_rows = 0
        super().__init__(accept=[], bonus=[], **kw)

    def make_head(self) -> Any:
        return types.SimpleNamespace(weight=torch.eye(self.vocab))

    def want(self, seq: list[int]) -> list[int]:
        ctx, out = list(seq), []
        for _ in range(self.block_size):
            out.append(target_next(tuple(ctx), self.vocab))
            ctx.append(out[-1])
        return out

    def draft(self, reqs: list[Any]) -> tuple[Any, list[list[int]]]:
        """The round's draft logits [bs, L, V] and the chain DFlash drafts (run through its sampler)."""
        L, V = self.block_size - 1, self.vocab
        bs = len(reqs)
        hidden = torch.zeros(bs, self.block_size, V)
        for b, r in enumerate(reqs):
            hidden[b, 1:] = draft_logits(self.want(self.seqs[id(r)]), L, V, self.rng)
        return hidden[:, 1:], self.head_draft(hidden).tolist()

    def forward_batch_generation(self, batch: Any, on_publish: Any = None) -> Any:
        """DFlash's own round: the chain, verified against the target."""
        if batch.forward_mode.is_extend():
            for r in batch.reqs:
                seq = self.seqs[id(r)] = list(r.origin_input_ids)
                seq.append(target_next(tuple(seq), self.vocab))
            return types.SimpleNamespace(accept_lens=None, next_draft_input=None)
        batch.forward_mode = ForwardMode("target_verify")   # as real 0.5.17 hands the batch back
        _logits, chains = self.draft(batch.reqs)
        commits, bonuses = [], []
        for r, chain in zip(batch.reqs, chains):
            want = self.want(self.seqs[id(r)])
            a = 0
            while a < len(chain) and chain[a] == want[a]:
                a += 1
            self.seqs[id(r)].extend(want[:a + 1])
            commits.append(a + 1)
            bonuses.append(want[a])
        self.chain_rows += len(chains)
        return types.SimpleNamespace(accept_lens=torch.tensor(commits, dtype=torch.int32),
                                     next_draft_input=types.SimpleNamespace(bonus_tokens=torch.tensor(bonuses)))


class FakeBackend:
    """What SGLang's tree verify will do, on the fake: the draft, the top-K from the plugin's fold, the
    trees from `build`, the target's choice at every node, the walk committed. `lie` commits one node
    short of the walk on every row (a broken accept)."""

    name = "test backend"

    def __init__(self, lie: bool = False) -> None:
        self.lie = lie

    def tree_round(self, worker: TreeTarget, batch: Any, build: Any, **_forward: Any) -> TreeRound:
        from ddtree_ops.engine.tree import build_tree_heap, draft_topk
        from ddtree_ops.engine.verify import walk as engine_walk

        reqs = batch.reqs
        L = worker.block_size - 1
        logits, chains = worker.draft(reqs)
        tok, sc = worker.ddtree_round_topk(len(reqs) * L)
        trees, accepted, predicts, commits = [], [], [], []
        for b, r in enumerate(reqs):
            seq = worker.seqs[id(r)]
            tree = build(tok[b * L:(b + 1) * L], sc[b * L:(b + 1) * L], seq[-1])
            predict = []
            for node in range(tree.size):
                path, n = [], node
                while n > 0:
                    path.append(tree.tokens[n])
                    n = tree.parents[n]
                predict.append(target_next(tuple(seq + path[::-1]), worker.vocab))
            path, bonus = walk(tree, predict)
            committed = path[:-1] if self.lie and len(path) > 1 else path
            seq.extend([tree.tokens[n] for n in committed[1:]] + [predict[committed[-1]]])
            # the ground truth, computed another way: DFlash's chain against the target's continuation,
            # the engine's own tree and verification walk
            want = worker.want(seq[:len(seq) - len(committed)])
            a = 0
            while a < L and chains[b][a] == want[a]:
                a += 1
            ref = build_tree_heap(draft_topk(logits[b], min(worker.budget, worker.vocab)), worker.budget,
                                  seq[-len(committed) - 1])
            ref_post = []
            for node in range(ref.size):
                p, n = [], node
                while n > 0:
                    p.append(int(ref.tokens[n]))
                    n = int(ref.parents[n])
                ref_post.append(target_next(tuple(seq[:len(seq) - len(committed)] + p[::-1]), worker.vocab))
            worker.truth.append((a + 1, len(engine_walk(ref.children(), ref_post)[0])))
            trees.append(tree)
            accepted.append(committed)
            predicts.append(predict if r.sampling_params.top_k == 1 else None)
            commits.append(len(committed))
        result = types.SimpleNamespace(accept_lens=torch.tensor(commits, dtype=torch.int32))
        return TreeRound(result, trees, accepted, predicts, CHAIN_S + NODE_S * sum(t.size for t in trees))

    def chain_round(self, worker: TreeTarget, batch: Any, forward: Any) -> tuple[Any, float]:
        result = forward()
        return result, CHAIN_S + NODE_S * worker.block_size * int(result.accept_lens.shape[0])

    def probe(self, worker: TreeTarget, batch: Any, nodes: int) -> float:
        return CHAIN_S + NODE_S * nodes * len(batch.reqs)


def tree_worker(monkeypatch: pytest.MonkeyPatch, backend: Any = None, budget: int = 8, **env: str) -> Any:
    from ddtree_ops.engine import sglang_tree

    shadow_env(monkeypatch, DDTREE_MODE="tree", DDTREE_BUDGET=str(budget), **env)
    backend = backend or FakeBackend()
    monkeypatch.setattr(sglang_tree, "find_backend", lambda version: (backend, ""))

    class Worker(sglang_tree.TreeWorkerMixin, TreeTarget):
        pass

    w = Worker(seed=3)
    w.budget = budget
    return w


def serve(worker: Any, reqs: list[FakeRequest], rounds: int) -> None:
    worker.forward_batch_generation(FakeBatch("extend", reqs))
    for _ in range(rounds):
        live = [r for r in reqs if not r.finished()]
        if not live:
            break
        worker.forward_batch_generation(FakeBatch("decode", live, [len(worker.seqs[id(r)]) - 1 for r in live]))
        for r in reqs:
            r.output_ids = worker.seqs[id(r)][len(r.origin_input_ids):]


def scrape() -> str:
    from prometheus_client import REGISTRY, generate_latest

    return generate_latest(REGISTRY).decode()


def test_every_tree_round_gives_the_exact_pair_of_the_engine_and_the_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    w = tree_worker(monkeypatch, DDTREE_CHAIN_SHARE="0")
    seen: list[tuple[int, int]] = []
    st = w._ddtree_tree()
    real = st.acct.observe_exact
    monkeypatch.setattr(st.acct, "observe_exact", lambda c, t, s: (seen.append((c, t)), real(c, t, s)))
    serve(w, [FakeRequest([1, 2, 3]), FakeRequest([4, 5]), FakeRequest([6, 7, 8, 9])], rounds=50)
    assert len(seen) == 150 and seen == w.truth
    assert all(t >= c for c, t in seen)                        # the spine is inside the served tree
    assert sum(t for _, t in seen) > sum(c for c, _ in seen)    # and the tree's siblings paid
    assert w.chain_rows == 0 and st.acct.exact.n == 150


def test_a_share_of_rounds_verifies_the_spine_alone_and_r_is_measured(monkeypatch: pytest.MonkeyPatch,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    before = parse_metrics(scrape())
    w = tree_worker(monkeypatch, DDTREE_CHAIN_SHARE="0.25", DDTREE_SHADOW_REPORT_EVERY="50")
    st = w._ddtree_tree()
    published: list[Any] = []
    real_report = st._report
    monkeypatch.setattr(st.acct, "on_report", lambda rep: (real_report(rep), published.append(st.acct.counters())))
    with caplog.at_level("INFO", logger="ddtree_ops.engine.sglang"):
        serve(w, [FakeRequest([1, 2, 3]), FakeRequest([4, 5])], rounds=400)
    rounds = st.verify_rounds
    assert st.chain_rounds == pytest.approx(0.25 * rounds, abs=4 * (0.25 * 0.75 * rounds) ** 0.5)
    assert w.chain_rows == 2 * st.chain_rounds                  # a chain round is DFlash's own, both rows
    after = parse_metrics(scrape())
    assert after is not None
    win = window(before, after)
    # /metrics holds the last report's sums (other tests' workers in this process left series of their own)
    assert {k: v for k, v in win.verify.items() if v != (0.0, 0.0)} == published[-1].verify
    tree_s, tree_n = win.verify[("tree", "2")]
    chain_s, chain_n = win.verify[("chain", "2")]
    assert chain_n <= st.chain_rounds and tree_n == win.modes["tree"].rounds / 2
    assert chain_s / chain_n == pytest.approx(CHAIN_S + NODE_S * 2 * 5)
    # an operator's DDTREE_VERIFY_COST_RATIO would win over the measured r: drop the gauge an earlier
    # test's worker in this process set, which this server (no such variable) would not have
    win = replace(win, cost_ratios={k: r for k, r in win.cost_ratios.items() if k != FROM_ENV})
    v = verdict(win)
    assert v.r_source == FROM_MEASURED and v.mode == "tree"
    assert v.r == pytest.approx((tree_s / tree_n) / (chain_s / chain_n))
    # the last report line says what /metrics says
    line = [r.getMessage() for r in caplog.records if r.getMessage().startswith("DDTREE tree: rounds=")][-1]
    fields = dict(kv.split("=", 1) for kv in line.removeprefix("DDTREE tree: ").split())
    assert int(fields["exact"]) == v.exact_rounds and fields["recommendation"] == v.recommendation
    assert fields["cost_from"] == FROM_MEASURED and float(fields["cost_ratio"]) == pytest.approx(v.r, abs=5e-4)
    assert float(fields["tau_tree"]) == pytest.approx(v.tau_tree, abs=5e-4)
    assert int(fields["chain_rounds"]) == chain_n


def test_a_sampled_request_commits_the_tree_and_has_no_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    w = tree_worker(monkeypatch, DDTREE_CHAIN_SHARE="0")
    serve(w, [FakeRequest([1, 2, 3]), FakeRequest([4, 5], greedy=False)], rounds=30)
    c = w._ddtree_tree().acct.counters().modes["tree"]
    assert (c.rounds, c.exact, c.dropped) == (60, 30, {"not-greedy": 30})


def test_a_backend_that_commits_another_path_is_caught(monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    w = tree_worker(monkeypatch, FakeBackend(lie=True), DDTREE_CHAIN_SHARE="0")
    with caplog.at_level("WARNING", logger="ddtree_ops.engine.sglang"):
        serve(w, [FakeRequest([1, 2, 3])], rounds=40)
    c = w._ddtree_tree().acct.counters().modes["tree"]
    assert c.exact + c.dropped.get("accept-mismatch", 0) == 40 and c.dropped["accept-mismatch"] >= 20
    assert sum("not the walk down its own target choices" in r.getMessage() for r in caplog.records) == 1


def test_without_a_backend_the_tree_worker_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddtree_ops.engine import sglang_tree

    shadow_env(monkeypatch, DDTREE_MODE="tree")

    class Worker(sglang_tree.TreeWorkerMixin, TreeTarget):
        pass

    with pytest.raises(RuntimeError, match=r"no tree verify backend for sglang .*issue 33"):
        Worker(seed=1)


@pytest.mark.parametrize("seed", range(3))
def test_walk_and_spine_are_the_engine_verification(seed: int) -> None:
    """`walk` is `verify.walk`; `spine_tokens` is what the chain's own verify accepts given the same
    target choices (its walk over a tree that holds only the spine)."""
    from ddtree_ops.engine.shadow import heap_tree
    from ddtree_ops.engine.tree import draft_topk
    from ddtree_ops.engine.verify import walk as engine_walk

    rng = random.Random(seed)
    for _ in range(300):
        depth, vocab, budget = rng.randint(1, 6), rng.choice([3, 5, 9]), rng.randint(6, 30)
        logits = torch.tensor([[rng.choice([0.0, 1.0, 2.0, 3.0]) + 0.01 * i for i in range(vocab)]
                               for _ in range(depth)])
        tok, sc = (x.tolist() for x in draft_topk(logits, min(budget, vocab)).__dict__.values())
        tree = build_tree(tok, sc, budget, root_token=7)
        predict = [rng.randrange(vocab) for _ in range(tree.size)]
        assert walk(tree, predict) == tuple(engine_walk(tree.children, predict))
        chain_children, _ = heap_tree([[row[0]] for row in tok], [[row[0]] for row in sc], depth)
        if len(tree.spine) == depth + 1:                       # the spine is in the tree: same nodes' choices
            spine_predict = [predict[n] for n in tree.spine]
            assert spine_tokens(tree, predict) == len(engine_walk(chain_children, spine_predict)[0])


# ------------------------------------------------------------------ against SGLang's sources and parser


@pytest.mark.parametrize("version", VERSIONS)
def test_tree_mixin_hooks_exist_in_each_supported_dflash_worker(version: str) -> None:
    """The tree worker wraps what the shadow wraps, plus the constructor: DFlashWorkerV2 sets its
    block size there and builds its draft sampler only in init_cuda_graphs, after it (so the tree
    state, made at the end of __init__, sees the block size, and the fold sees the state)."""
    import ast

    from ddtree_ops.engine.sglang_tree import TreeWorkerMixin

    src = dflash_worker_source(version)
    assert src is not None, f"no source for sglang {version} (make install fetches it)"
    cls = next(n for n in ast.parse(src).body if isinstance(n, ast.ClassDef) and n.name == "DFlashWorkerV2")
    methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
    hooked = {name for name in vars(TreeWorkerMixin) if not name.startswith("__") and name in methods}
    assert hooked == {"_maybe_build_draft_sampler", "_greedy_sample_from_vocab_parallel_head",
                      "forward_batch_generation"}
    init = ast.unparse(methods["__init__"])
    assert "self.block_size = int(" in init and "init_cuda_graphs(" not in init
    assert "self._maybe_build_draft_sampler()" in ast.unparse(methods["init_cuda_graphs"])


def install_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str = "*") -> None:
    """A tree verify backend found by entry point, as a wheel (or the lab's stand-in) declares one."""
    info = tmp_path / "ddtree_test_backend-0.1.dist-info"
    info.mkdir()
    (tmp_path / "ddtree_test_backend.py").write_text("class Backend:\n    name = 'test'\n")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ddtree-test-backend\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[ddtree_ops.tree_verify]\n{name} = ddtree_test_backend:Backend\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_a_declared_backend_makes_tree_mode_servable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("sglang")
    from ddtree_ops.engine.sglang_backend import find_backend, tree_problem

    assert "no tree verify backend for sglang 0.5.23" in (tree_problem("0.5.23") or "")
    install_backend(tmp_path, monkeypatch, name="0.5.17")
    assert tree_problem("0.5.17.post1") is None and find_backend("0.5.17")[0].name == "test"
    assert tree_problem("0.5.23") is not None                   # declared for another release only


def test_validator_accepts_tree_mode_where_a_backend_is_declared(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("sglang")
    from test_engine_plugin import GOOD, server_args, validate

    from ddtree_ops.engine.sglang_plugin import register

    register()
    shadow_env(monkeypatch, DDTREE_MODE="tree", DDTREE_BUDGET="32", DDTREE_CHAIN_SHARE="0.05")
    with pytest.raises(ValueError, match="no tree verify backend"):
        validate(server_args(*GOOD))
    install_backend(tmp_path, monkeypatch)
    validate(server_args(*GOOD))
    with pytest.raises(ValueError, match=r"DDTREE_MODE=tree with --tp-size > 1 is refused"):
        validate(server_args(*GOOD, "--tp-size", "2"))
    from ddtree_ops.engine.sglang_plugin import check

    monkeypatch.setenv("SGLANG_PLUGINS", "ddtree")
    doc = check()
    assert doc["tree_mode"] == "ok" and doc["settings"]["mode"] == "tree"
    assert json.dumps(doc)


@pytest.mark.parametrize("mode,worker", [("tree", "DDTreeTreeWorker"), ("shadow", "DDTreeShadowWorker"),
                                         (None, "DDTreeShadowWorker")])
def test_worker_factory_picks_the_mode(monkeypatch: pytest.MonkeyPatch, mode: str | None, worker: str) -> None:
    """SGLang's GPU worker modules cannot be imported here: stand-ins for them, by name."""
    from ddtree_ops.engine import sglang_plugin

    shadow_env(monkeypatch, **({"DDTREE_MODE": mode} if mode else {}))
    monkeypatch.setitem(sys.modules, "ddtree_ops.engine.sglang_relay",
                        types.SimpleNamespace(exempt_from_hidden_relay=lambda server_args: None))
    monkeypatch.setitem(sys.modules, "ddtree_ops.engine.sglang_worker", types.SimpleNamespace(
        DDTreeShadowWorker=type("DDTreeShadowWorker", (), {}), DDTreeTreeWorker=type("DDTreeTreeWorker", (), {})))
    assert sglang_plugin.worker_factory(None).__name__ == worker


def test_a_spine_cut_short_gives_no_chain_figure() -> None:
    """A budget below the horizon cuts the spine (the validator refuses it; never guessed if it came):
    where the chain's walk reaches the cut, what the chain would have accepted past it is unknown."""
    tok = [[5, 6], [7, 8], [9, 10], [11, 12]]
    sc = [[-1, -5], [-1, -5], [-1, -5], [-1, -5]]
    tree = build_tree(tok, sc, budget=2, root_token=1)
    assert len(tree.spine) == 3 and tree.horizon == 4
    along = [0] * tree.size
    along[tree.spine[0]], along[tree.spine[1]], along[tree.spine[2]] = 5, 7, 99
    assert spine_tokens(tree, along) is None                     # accepted to the cut: unknown beyond
    along[tree.spine[1]] = 42                                    # missed before the cut: known
    assert spine_tokens(tree, along) == 2
