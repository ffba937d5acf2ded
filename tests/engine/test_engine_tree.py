"""Tree construction: the heap against brute-force enumeration, the vectorised build against the
heap (node for node, ties included), in both shapes (the spine tree and the plain best-first
one); the spine tree never accepting less than the chain under greedy verification; visibility
and positions."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ddtree_ops.engine.shadow import heap_tree
from ddtree_ops.engine.tree import (
    SPINE,
    DraftTopK,
    Tree,
    TreeBuilder,
    ancestor_matrix,
    budget_topk,
    build_chain,
    build_tree_heap,
    build_tree_vectorized,
    draft_topk,
)
from ddtree_ops.engine.verify import walk

pytestmark = pytest.mark.engine


def brute_force(top: DraftTopK, budget: int, spine: bool = False) -> list[tuple[int, ...]]:
    """Every prefix of rank tuples, ordered by the documented total order: score desc, depth asc,
    the parent's place in that order, then rank. The first B are the tree (in node order).

    `spine`: the rank-0 path first, to depth min(B, L), in depth order; then every other prefix
    in the same order, a spine parent placed before every other parent at its depth."""
    sc = top.scores.tolist()
    place: dict[tuple[int, ...], int] = {(): 0}
    first, rest = [], []
    for d in range(1, top.depth + 1):
        level = list(itertools.product(range(top.k), repeat=d))
        score = {rs: sum(sc[i][r] for i, r in enumerate(rs)) for rs in level}
        on_spine = (0,) * d
        others = [rs for rs in level if not (spine and rs == on_spine)]
        others.sort(key=lambda rs: (-score[rs], place[rs[:-1]], rs[-1]))
        order = ([on_spine] if spine else []) + others
        place.update({rs: i for i, rs in enumerate(order)})
        if spine:
            first.append(on_spine)
        rest += [(-score[rs], d, place[rs], rs) for rs in others]
    rest.sort()
    return (first + [rs for *_, rs in rest])[:budget]


def rank_paths(tree: Tree) -> list[tuple[int, ...]]:
    paths: list[tuple[int, ...]] = [()]
    for i in range(1, tree.size):
        paths.append(paths[int(tree.parents[i])] + (int(tree.ranks[i]),))
    return paths[1:]


def same_tree(a: Tree, b: Tree) -> bool:
    return all(torch.equal(x.cpu(), y.cpu()) for x, y in
               ((a.tokens, b.tokens), (a.parents, b.parents), (a.depths, b.depths), (a.ranks, b.ranks)))


# few distinct logit values: ties within and across depths are the common case, not the rare one
logit_tables = st.integers(1, 4).flatmap(lambda L: st.integers(1, 5).flatmap(lambda V: st.lists(
    st.lists(st.sampled_from([0.0, 0.0, 1.0, 2.5, -3.0]), min_size=V, max_size=V), min_size=L, max_size=L)))


@settings(max_examples=200, deadline=None)
@given(rows=logit_tables, budget=st.integers(1, 40), root=st.integers(0, 9), spine=st.sampled_from([True, False, None]))
def test_heap_is_the_best_prefix_set_and_vectorised_matches(rows: list[list[float]], budget: int, root: int,
                                                           spine: bool | None) -> None:
    """Each shape, and the default (None: the spine tree at B >= L, the plain one below)."""
    logits = torch.tensor(rows)
    top = draft_topk(logits, budget_topk(budget, logits.shape[1]))
    heap = build_tree_heap(top, budget, root, spine=spine)
    assert rank_paths(heap) == brute_force(top, budget, budget >= top.depth if spine is None else spine)
    assert same_tree(heap, build_tree_vectorized(top, budget, root, spine=spine))
    children, ranks = heap_tree(top.tokens.tolist(), top.scores.tolist(), budget, spine)   # the serving side's
    assert children == heap.children() and ranks == heap.ranks.tolist()
    assert int(heap.tokens[0]) == root and int(heap.parents[0]) == -1
    assert all(int(heap.parents[i]) < i for i in range(1, heap.size))      # parents first


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), budget=st.sampled_from([1, 7, 16, 64, 200]), depth=st.integers(1, 15),
       scale=st.sampled_from([0.5, 4.0, 12.0]), spine=st.sampled_from([True, False, None]))
def test_vectorised_matches_heap_on_peaked_large_vocab(seed: int, budget: int, depth: int, scale: float,
                                                       spine: bool | None) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn((depth, 4096), generator=gen) * scale
    top = draft_topk(logits, budget)
    assert same_tree(build_tree_heap(top, budget, 5, spine=spine), build_tree_vectorized(top, budget, 5, spine=spine))


def greedy_accepts(tree: Tree, target: "Target") -> int:
    """Tokens a greedy verify of `tree` commits (accepted path incl. the root, as tau counts them)."""
    accepted, _bonus = walk(tree.children(), [target(path) for path in tree.paths()])
    return len(accepted)


class Target:
    """A deterministic greedy target: its choice after a path (the tokens drafted since the root)
    is the draft's top-1 at that depth with probability `agree` (so chains run deep), else any
    token, decided by a hash of the path alone, as a real target's choice depends on the context
    only."""

    def __init__(self, top1: list[int], vocab: int, agree: float, seed: int) -> None:
        self.top1, self.vocab, self.agree, self.seed = top1, vocab, agree, seed

    def __call__(self, path: tuple[int, ...]) -> int:
        rng = random.Random(f"{self.seed}:{path}")
        d = len(path)
        if d < len(self.top1) and rng.random() < self.agree:
            return self.top1[d]
        return rng.randrange(self.vocab)


@settings(max_examples=300, deadline=None)
@given(rows=logit_tables, budget=st.integers(1, 24), agree=st.sampled_from([0.5, 0.8, 0.95, 1.0]),
       seed=st.integers(0, 10**6))
def test_the_spine_tree_never_accepts_less_than_the_chain(rows: list[list[float]], budget: int, agree: float,
                                                          seed: int) -> None:
    """On any draft and any greedy target, on this round: with B >= L the default tree (the spine
    tree) commits at least the chain's tokens. Below the horizon the spine tree is the chain cut at
    depth B, and the default there is the plain tree."""
    logits = torch.tensor(rows)
    top = draft_topk(logits, budget_topk(budget, logits.shape[1]))
    chain = build_chain(top, 0)
    target = Target(chain.tokens[1:].tolist(), logits.shape[1], agree, seed)
    spine = build_tree_heap(top, budget, 0, spine=True)
    assert greedy_accepts(spine, target) >= min(greedy_accepts(chain, target), budget + 1)
    default = build_tree_heap(top, budget, 0)
    if budget >= top.depth:
        assert greedy_accepts(default, target) >= greedy_accepts(chain, target)
    else:
        assert same_tree(default, build_tree_heap(top, budget, 0, spine=False))


def test_the_plain_best_first_tree_can_lose_to_the_chain() -> None:
    """Why the spine: two near-equal candidates at every depth, and B = 8 spent on the best
    prefixes makes a bushy tree 3 deep, while the chain is 6 deep. A target that follows the
    chain accepts 7 tokens from it, 4 from the plain tree, 7 from the spine tree."""
    logits = torch.full((6, 5), -5.0)
    logits[:, 0], logits[:, 1] = 2.0, 1.9
    top = draft_topk(logits, 8)
    chain = build_chain(top, 0)
    target = Target(chain.tokens[1:].tolist(), 5, 1.0, 0)
    plain, spine = build_tree_heap(top, 8, 0, spine=False), build_tree_heap(top, 8, 0, spine=True)
    assert greedy_accepts(chain, target) == 7
    assert int(plain.depths.max()) == 3 and greedy_accepts(plain, target) == 4
    assert greedy_accepts(spine, target) == 7
    assert spine.tokens[1:7].tolist() == chain.tokens[1:].tolist()       # nodes 1..L are the spine
    assert spine.parents[1:7].tolist() == list(range(6))
    assert SPINE is True and same_tree(build_tree_heap(top, 8, 0), spine)     # the default at B >= L, docs/engine.md


def test_tree_contains_top_k_only_and_distinct_siblings() -> None:
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1)) * 3
    tree = build_tree_heap(draft_topk(logits, 10), 10, 0)
    kids = tree.children()
    assert sum(len(k) for k in kids) == tree.size - 1          # token keys never clash
    for i in range(1, tree.size):
        d = int(tree.depths[i])
        assert int(tree.tokens[i]) in torch.topk(logits[d - 1], 10).indices.tolist()


def test_chain_is_rank_zero_path_and_same_code_path() -> None:
    logits = torch.randn(5, 30, generator=torch.Generator().manual_seed(2))
    chain = build_chain(draft_topk(logits, 8), 3)
    assert chain.is_chain() and chain.size == 6
    assert chain.tokens[1:].tolist() == torch.argmax(logits, dim=-1).tolist()
    assert torch.equal(chain.visibility(), torch.tril(torch.ones(6, 6, dtype=torch.bool)))


def test_paths_are_the_tokens_from_the_root() -> None:
    tree = Tree(torch.tensor([9, 4, 5, 6, 7, 8]), torch.tensor([-1, 0, 0, 1, 3, 2]),
                torch.tensor([0, 1, 1, 2, 3, 2]), torch.zeros(6, dtype=torch.long))
    assert tree.paths() == [(), (4,), (5,), (4, 6), (4, 6, 7), (5, 8)]


def test_visibility_and_positions() -> None:
    parents = torch.tensor([-1, 0, 0, 1, 3, 2])
    vis = ancestor_matrix(parents)
    expect = {0: {0}, 1: {0, 1}, 2: {0, 2}, 3: {0, 1, 3}, 4: {0, 1, 3, 4}, 5: {0, 2, 5}}
    for i, anc in expect.items():
        assert set(torch.nonzero(vis[i]).view(-1).tolist()) == anc
    tree = Tree(torch.arange(6), parents, torch.tensor([0, 1, 1, 2, 3, 2]), torch.zeros(6, dtype=torch.long))
    assert tree.positions(100).tolist() == [100, 101, 101, 102, 103, 102]


def test_budget_larger_than_prefixes_and_limits() -> None:
    top = draft_topk(torch.zeros(2, 2), 8)       # 2 + 4 = 6 prefixes exist
    heap = build_tree_heap(top, 8, 0)
    assert heap.size == 7 and same_tree(heap, build_tree_vectorized(top, 8, 0))
    with pytest.raises(ValueError, match="budget"):
        build_tree_heap(top, 5000, 0)
    with pytest.raises(ValueError, match="horizon"):
        draft_topk(torch.zeros(40, 4), 2)


@pytest.mark.parametrize("spine,budget", [(True, 64), (False, 64), (None, 64), (None, 8)])
def test_tree_builder_static_buffers_match_heap(spine: bool | None, budget: int) -> None:
    logits = torch.randn(15, 2000, generator=torch.Generator().manual_seed(4)) * 6
    builder = TreeBuilder(15, 2000, budget, "cpu", logits_dtype=torch.float32, spine=spine)
    builder.capture()                              # no-op on CPU: the eager path is the graph body
    out = builder.build(logits, 11)
    heap = build_tree_heap(draft_topk(logits, budget), budget, 11, spine=spine)
    assert out["tokens"].tolist() == heap.tokens.tolist()
    assert out["parents"].tolist() == heap.parents.tolist()
    assert torch.equal(out["visibility"], heap.visibility())
