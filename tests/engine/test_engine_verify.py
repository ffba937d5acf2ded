"""Verification pieces: the walk on host and device, KV compaction, the tree mask, sampling transforms."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from ddtree_ops.engine.tree import Tree, build_tree_heap, draft_topk
from ddtree_ops.engine.verify import (
    PositionalSampler,
    SamplingParams,
    compact_kv,
    forward,
    kv_length,
    sampling_probs,
    top_gap,
    tree_mask,
    walk,
    walk_device,
)

pytestmark = pytest.mark.engine


def small_tree() -> Tree:
    #        0
    #      /   \
    #     1(5)  2(6)
    #     |      |
    #     3(7)   4(8)
    #     |
    #     5(9)
    parents = torch.tensor([-1, 0, 0, 1, 2, 3])
    return Tree(torch.tensor([4, 5, 6, 7, 8, 9]), parents, torch.tensor([0, 1, 1, 2, 2, 3]),
                torch.tensor([0, 0, 1, 0, 0, 0]))


@pytest.mark.parametrize("post,accepted,bonus", [
    ([6, 0, 8, 0, 1, 0], [0, 2, 4], 1),          # through the sibling
    ([5, 7, 0, 9, 0, 3], [0, 1, 3, 5], 3),       # the whole spine, bonus after the leaf
    ([42, 0, 0, 0, 0, 0], [0], 42),              # nothing accepted: the root's choice is the bonus
])
def test_walk_host_and_device_agree(post: list[int], accepted: list[int], bonus: int) -> None:
    tree = small_tree()
    assert walk(tree.children(), post) == (accepted, bonus)
    path, b = walk_device(tree, tree.visibility(), torch.tensor(post))
    assert path.tolist() == accepted and int(b) == bonus


def test_tree_mask_shape_and_values() -> None:
    tree = small_tree()
    mask = tree_mask(tree.visibility(), past=3, dtype=torch.float32)
    assert mask.shape == (1, 1, 6, 9)
    allowed = mask[0, 0] == 0
    assert allowed[:, :3].all()                                       # the committed context
    assert allowed[4, 3 + 2] and allowed[4, 3 + 0] and not allowed[4, 3 + 1]   # node 4 sees 2 and root, not 1


def test_compaction_leaves_the_kv_of_a_linear_decode(tiny) -> None:
    prompt = torch.tensor([3, 14, 15, 92, 65])
    _, cache, _ = forward(tiny, prompt, torch.arange(5), None)
    top = draft_topk(torch.randn(3, 96, generator=torch.Generator().manual_seed(0)) * 4, 6)
    tree = build_tree_heap(top, 6, 35)
    _, cache, _ = forward(tiny, tree.tokens, tree.positions(5), cache, tree_mask(tree.visibility(), 5, tiny.dtype))
    assert kv_length(cache) == 5 + tree.size
    vis = tree.visibility()
    paths = [torch.nonzero(vis[n]).view(-1).tolist() for n in range(tree.size)]
    path = max((p for p in paths if p != list(range(len(p)))), key=len)   # a path with a gap
    assert len(path) >= 2
    assert compact_kv(cache, 5, path)                                 # entries moved
    assert kv_length(cache) == 5 + len(path)
    linear = torch.cat([prompt, tree.tokens[path]])
    _, ref, _ = forward(tiny, linear, torch.arange(len(linear)), None)
    for got, want in zip(cache.layers, ref.layers):
        torch.testing.assert_close(got.keys, want.keys, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got.values, want.values, rtol=1e-4, atol=1e-5)


def test_contiguous_path_is_not_moved(tiny) -> None:
    cache = DynamicCache()
    _, cache, _ = forward(tiny, torch.arange(8), torch.arange(8), cache)
    assert not compact_kv(cache, 4, [0, 1, 2])
    assert kv_length(cache) == 7


def test_sampling_transforms() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    full = sampling_probs(logits, SamplingParams(temperature=1.0))
    torch.testing.assert_close(full, torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    top2 = sampling_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    torch.testing.assert_close(top2, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    nucleus = sampling_probs(logits, SamplingParams(temperature=1.0, top_p=0.8))
    torch.testing.assert_close(nucleus, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    hot = sampling_probs(logits, SamplingParams(temperature=0.5))
    assert hot[0, 0] > full[0, 0]
    with pytest.raises(ValueError):
        SamplingParams(top_p=0.0).validate()


def test_positional_sampler_is_inverse_cdf_per_position() -> None:
    s = PositionalSampler(seed=7)
    probs = torch.tensor([[0.2, 0.3, 0.5], [0.2, 0.3, 0.5]])
    a = s(probs, torch.tensor([10, 10]))
    assert a[0] == a[1]                                   # same position, same uniform
    draws = [int(s(probs[:1], torch.tensor([p]))[0]) for p in range(3000)]
    freq = [draws.count(i) / len(draws) for i in range(3)]
    assert freq == pytest.approx([0.2, 0.3, 0.5], abs=0.03)


def test_top_gap() -> None:
    assert top_gap(torch.tensor([1.0, 3.0, 2.5])) == pytest.approx(0.5)


def test_engine_verify_says_which_tree_it_built_and_what_a_small_budget_makes_of_it() -> None:
    from ddtree_ops.engine.verify_cmd import tree_note

    assert tree_note(16, 15).startswith("tree: the spine tree") and "below" not in tree_note(16, 15)
    assert tree_note(8, 15) == ("tree: plain best-first (the B best prefixes): budget 8 is below the horizon 15, "
                                "so no tree holds the whole chain")
    assert tree_note(8, 15, spine=True).endswith("budget 8 is below the horizon 15, so it is the chain cut at depth 8")
    assert tree_note(16, 15, spine=False) == "tree: plain best-first (the B best prefixes)"
