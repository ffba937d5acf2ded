"""Tree construction: the heap against brute-force enumeration, the vectorised build against the
heap (node for node, ties included), visibility and positions."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ddtree_ops.engine.tree import (
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

pytestmark = pytest.mark.engine


def brute_force(top: DraftTopK, budget: int) -> list[tuple[int, ...]]:
    """Every prefix of rank tuples, ordered by the documented total order: score desc, depth asc,
    the parent's place in that order, then rank. The first B are the tree (in node order)."""
    sc = top.scores.tolist()
    place: dict[tuple[int, ...], int] = {(): 0}
    everything = []
    for d in range(1, top.depth + 1):
        level = list(itertools.product(range(top.k), repeat=d))
        score = {rs: sum(sc[i][r] for i, r in enumerate(rs)) for rs in level}
        level.sort(key=lambda rs: (-score[rs], place[rs[:-1]], rs[-1]))
        place.update({rs: i for i, rs in enumerate(level)})
        everything += [(-score[rs], d, place[rs], rs) for rs in level]
    everything.sort()
    return [rs for *_, rs in everything[:budget]]


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


@settings(max_examples=150, deadline=None)
@given(rows=logit_tables, budget=st.integers(1, 40), root=st.integers(0, 9))
def test_heap_is_the_best_prefix_set_and_vectorised_matches(rows: list[list[float]], budget: int, root: int) -> None:
    logits = torch.tensor(rows)
    top = draft_topk(logits, budget_topk(budget, logits.shape[1]))
    heap = build_tree_heap(top, budget, root)
    assert rank_paths(heap) == brute_force(top, budget)
    assert same_tree(heap, build_tree_vectorized(top, budget, root))
    assert int(heap.tokens[0]) == root and int(heap.parents[0]) == -1
    assert all(int(heap.parents[i]) < i for i in range(1, heap.size))      # parents first


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), budget=st.sampled_from([1, 7, 16, 64, 200]), depth=st.integers(1, 15),
       scale=st.sampled_from([0.5, 4.0, 12.0]))
def test_vectorised_matches_heap_on_peaked_large_vocab(seed: int, budget: int, depth: int, scale: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn((depth, 4096), generator=gen) * scale
    top = draft_topk(logits, budget)
    assert same_tree(build_tree_heap(top, budget, 5), build_tree_vectorized(top, budget, 5))


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


def test_tree_builder_static_buffers_match_heap() -> None:
    logits = torch.randn(15, 2000, generator=torch.Generator().manual_seed(4)) * 6
    builder = TreeBuilder(15, 2000, 64, "cpu", logits_dtype=torch.float32)
    builder.capture()                              # no-op on CPU: the eager path is the graph body
    out = builder.build(logits, 11)
    heap = build_tree_heap(draft_topk(logits, 64), 64, 11)
    assert out["tokens"].tolist() == heap.tokens.tolist()
    assert out["parents"].tolist() == heap.parents.tolist()
    assert torch.equal(out["visibility"], heap.visibility())
