"""The DDTree draft tree: the draft's top-1 chain (the spine), then the best prefixes under the
per-depth independence surrogate.

The drafter gives one distribution per future position (depth 1..L). A path's surrogate score is
the sum of its per-depth log-probs. The plain best-first tree (`spine=False`) is the B
highest-scoring prefixes, which is prefix-closed because log-probs are <= 0; it need not hold the
chain, and a good draft's long chain can beat it. The spine tree (`spine=True`, the default,
`tree_shape.SPINE`, for B >= L) holds the chain to depth min(B, L) and spends the rest of the
budget best-first, so under greedy decoding it accepts at least what the chain accepts on every
round (B >= L; below that it is the chain cut at depth B, and the default there is the plain tree,
`tree_shape.spine_for`). Every build returns the same tree, node for node, in either shape:

- `build_tree_heap`: best-first heap on the host, in the reference's style (one device-to-host
  copy of the L x K top-k table, then B pops).
- `build_tree_vectorized`: a depth-by-depth beam of width B on the device with static shapes and
  no host sync, so it can be captured in a CUDA graph (`TreeBuilder`). On CUDA (with Triton)
  the selection runs as one fused kernel (`tree_kernels`); elsewhere as PyTorch ops.
- `build_tree_fused` / `TreeBuilder(how="fused")`: the whole build from draft logits on CUDA in
  three kernels: the row statistics of the log-softmax (the kernel `log_probs` uses there too),
  a filtered per-row top-K, and the selection with the visibility matrix. The PyTorch builds
  stay as the reference and the fallback.

Scores are fixed-point integers (2**-24 nats). Integer sums are exact and associative, so both
builds (and any device) order ties identically; float sums would let rounding pick different
members of a tied set on the host and on the GPU. Ties are broken by a total order that both
builds can compute cheaply: score descending, then depth ascending, then the parent's position
in this order, then the token's rank at its depth. Under it every node's parent and previous
sibling come before it, which is what makes the heap and the beam exact. The spine tree uses the
same order on keys that carry `SPINE_BONUS` along the spine (`tree_shape` says why it is exact):
the spine first, in depth order, then the rest in the plain order.

Node 0 is the root: the bonus token, already chosen, not yet in the target's KV cache.
Nodes 1..n follow in that total order, so a parent always has a smaller index than its children;
in a spine tree nodes 1..min(B, L) are the spine.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from ddtree_ops.engine.tree_shape import (
    LP_FLOOR,
    MAX_BUDGET,
    MAX_DEPTH,
    SCORE_BITS,
    SPINE,
    SPINE_BONUS,
    budget_topk,
    spine_for,
    staircase_pairs,
)

__all__ = ["SCORE_BITS", "LP_FLOOR", "MAX_DEPTH", "MAX_BUDGET", "SPINE", "SPINE_BONUS", "INVALID", "DraftTopK", "Tree",
           "TreeBuilder",
           "budget_topk", "spine_for", "staircase_pairs", "quantize_logprobs", "log_probs", "order_keys", "topk_of_logprobs",
           "topk_logprobs", "draft_topk", "ancestor_matrix", "build_tree_heap", "select_tree", "fused_available",
           "build_tree_vectorized", "draft_topk_fused", "build_tree_fused", "build_chain"]

_LOW_BITS = 22
_LOW_SCALE = 1 << _LOW_BITS     # key = score * 2**22 + tie-break (multiply, not shift: scores are negative)
_LOW_MASK = _LOW_SCALE - 1
INVALID = -(1 << 40)            # an empty slot; below every real path score


@dataclass(frozen=True)
class DraftTopK:
    """Per-depth top-K draft tokens and their quantised log-probs, best first."""

    tokens: torch.Tensor        # [L, K] int64
    scores: torch.Tensor        # [L, K] int64, non-increasing along K

    @property
    def depth(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def k(self) -> int:
        return int(self.tokens.shape[1]) if self.tokens.dim() == 2 else 0


def quantize_logprobs(logprobs: torch.Tensor) -> torch.Tensor:
    return torch.round(logprobs.float().clamp_min(LP_FLOOR) * (1 << SCORE_BITS)).to(torch.int64)


def log_probs(logits: torch.Tensor) -> torch.Tensor:
    """fp32 log-softmax over the last dimension: (x - m) - c per row, m the row's max, c the log
    of the sum of exp(x - m).

    Where the Triton kernels run (CUDA), m and c come from `tree_kernels.log_softmax_stats`, the
    very kernel the fused top-K reads them from, and both sides subtract in plain fp32, so the
    reference and the fused build see bit-identical log-probs (the exact tree depends on them:
    a 1-ulp change in a normaliser can reorder near-tied paths). They match torch.log_softmax
    to about 1e-6. Elsewhere this is torch.log_softmax."""
    if logits.dim() == 2 and logits.shape[0] > 0 and fused_available(logits.device):
        stats = _kernels().log_softmax_stats(logits)
        return (logits.float() - stats[:, 0:1]) - stats[:, 1:2]
    return torch.log_softmax(logits, dim=-1, dtype=torch.float32)


def order_keys(logprobs: torch.Tensor) -> torch.Tensor:
    """Unique int64 keys in the canonical top-k order: log-prob descending, then token id
    ascending. High 32 bits: the float's bits made monotone (-0.0 taken as +0.0); low 32 bits:
    2**32 - 1 - token id. The Triton kernel builds the same keys (`tree_kernels._order_key`)."""
    x = torch.where(logprobs == 0, torch.zeros_like(logprobs), logprobs)
    bits = x.view(torch.int32).to(torch.int64)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    ids = torch.arange(x.shape[-1], dtype=torch.int64, device=x.device)
    return ordered * (1 << 32) + ((1 << 32) - 1 - ids)


def topk_of_logprobs(logprobs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k tokens of fp32 log-probs [..., V] in the canonical order, and their quantised scores."""
    k = max(0, min(int(k), int(logprobs.shape[-1])))
    top = torch.topk(order_keys(logprobs), k, dim=-1, sorted=True).values
    tokens = ((1 << 32) - 1) - (top & ((1 << 32) - 1))
    return tokens, quantize_logprobs(logprobs.gather(-1, tokens))


def topk_logprobs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of [..., V] logits: the top-k tokens and their quantised log-probs (fp32 softmax).

    Ties are ordered by token id (smaller first), on every device: `torch.topk` alone leaves the
    order of equal values to the implementation (it differs between CPU and CUDA, and between
    sizes on CUDA), and bf16 logits tie often. Unique int64 keys make the order exact."""
    return topk_of_logprobs(log_probs(logits), k)


def draft_topk(draft_logits: torch.Tensor, k: int) -> DraftTopK:
    """Top-k tokens per depth from [L, V] draft logits."""
    if draft_logits.dim() != 2:
        raise ValueError(f"draft logits must be [L, V], got shape {tuple(draft_logits.shape)}")
    if draft_logits.shape[0] > MAX_DEPTH:
        raise ValueError(f"draft horizon {draft_logits.shape[0]} exceeds the supported maximum {MAX_DEPTH}")
    tokens, scores = topk_logprobs(draft_logits, k)
    return DraftTopK(tokens=tokens, scores=scores)


@dataclass
class Tree:
    """A draft tree; index 0 is the root. A chain is a tree with one child per node."""

    tokens: torch.Tensor        # [N] int64
    parents: torch.Tensor       # [N] int64, root -1
    depths: torch.Tensor        # [N] int64, root 0
    ranks: torch.Tensor         # [N] int64, rank of the token at its depth (root 0)

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    def children(self) -> list[dict[int, int]]:
        """Per node: token -> child index. Siblings are distinct top-K tokens, so no key clashes."""
        kids: list[dict[int, int]] = [{} for _ in range(self.size)]
        for i, (p, t) in enumerate(zip(self.parents.tolist(), self.tokens.tolist())):
            if i:
                kids[p][t] = i
        return kids

    def paths(self) -> list[tuple[int, ...]]:
        """Per node, the drafted tokens from the root's child down to it (the root: none): the
        context a target sees after the root at that node."""
        toks, parents = self.tokens.tolist(), self.parents.tolist()
        out: list[tuple[int, ...]] = [()]
        for i in range(1, self.size):            # parents come first
            out.append(out[parents[i]] + (toks[i],))
        return out

    def visibility(self) -> torch.Tensor:
        return ancestor_matrix(self.parents, int(self.depths.max()))

    def positions(self, start: int) -> torch.Tensor:
        """Root at `start`, a node at `start + depth`: an accepted path then has exactly the
        positions it would have had as a linear sequence, so its KV stays valid after compaction."""
        return self.depths + int(start)

    def is_chain(self) -> bool:
        return bool(torch.equal(self.parents[1:], torch.arange(self.size - 1, device=self.parents.device)))

    def to(self, device: torch.device | str) -> Tree:
        return Tree(*(t.to(device) for t in (self.tokens, self.parents, self.depths, self.ranks)))


def ancestor_matrix(parents: torch.Tensor, max_depth: int | None = None) -> torch.Tensor:
    """vis[i, j] is True when j is i or an ancestor of i.

    Reachability by repeated squaring of (I + A): log2(depth) small matmuls instead of one
    dependent gather per depth, which keeps the kernel count flat on the GPU. Entries are
    clamped to 0/1 after each product; a row sum is at most depth + 1, exact in any float type.
    """
    n = int(parents.shape[0])
    device = parents.device
    dtype = torch.float32 if device.type == "cpu" else torch.float16
    reach = torch.eye(n, dtype=dtype, device=device)
    # the root points at itself, already set by the identity: no boolean indexing (no host sync)
    reach.scatter_(1, parents.clamp_min(0).view(-1, 1), 1.0)
    longest = min(n - 1, MAX_DEPTH if max_depth is None else max_depth)
    steps = 1                      # reach covers paths of up to `steps` edges
    while steps < longest:
        reach = (reach @ reach).clamp_max_(1)
        steps *= 2
    return reach > 0


# ----------------------------------------------------------------------------------------------
# the host heap (reference style)


def build_tree_heap(top: DraftTopK, budget: int, root_token: int, spine: bool | None = None) -> Tree:
    """Best-first heap over prefixes; includes the device-to-host copy of the top-k table.
    `spine`: the chain first (its keys carry `SPINE_BONUS`; a rank > 0 child of a spine node
    drops it), then best-first; None: the default for this budget and depth (`spine_for`)."""
    if budget > MAX_BUDGET:
        raise ValueError(f"budget {budget} exceeds the supported maximum {MAX_BUDGET}")
    spine = spine_for(budget, top.depth, spine)
    tok = top.tokens.tolist()
    sc = top.scores.tolist()
    depth, k = top.depth, top.k
    tokens, parents, depths, ranks = [int(root_token)], [-1], [0], [0]
    keys, on_spine = [SPINE_BONUS if spine else 0], [spine]
    heap: list[tuple[int, int, int, int]] = []
    if budget > 0 and depth > 0 and k > 0:
        heap.append((-(keys[0] + sc[0][0]), 1, 0, 0))      # (-key, depth, parent index, rank)
    while heap and len(tokens) - 1 < budget:
        neg, d, p, r = heapq.heappop(heap)
        node = len(tokens)
        tokens.append(tok[d - 1][r])
        parents.append(p)
        depths.append(d)
        ranks.append(r)
        keys.append(-neg)
        on_spine.append(on_spine[p] and r == 0)
        if r + 1 < k:
            leave = SPINE_BONUS if on_spine[p] else 0
            heapq.heappush(heap, (-(keys[p] + sc[d - 1][r + 1] - leave), d, p, r + 1))
        if d < depth:
            heapq.heappush(heap, (neg - sc[d][0], d + 1, node, 0))
    as_t = lambda xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
    return Tree(as_t(tokens), as_t(parents), as_t(depths), as_t(ranks))


# ----------------------------------------------------------------------------------------------
# the vectorised build (device, static shapes, no host sync)


@lru_cache(maxsize=64)
def _pair_table(budget: int, k: int, device: str,
                spine: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    pos, rank = staircase_pairs(budget, k, spine)
    pi = torch.tensor(pos, dtype=torch.int64, device=device)
    pr = torch.tensor(rank, dtype=torch.int64, device=device)
    low = _LOW_MASK - (pi * k + pr)       # earlier parent, then better rank, wins a tie
    # beam position 0 is the spine node (its key is the largest): its rank > 0 children leave it
    leave = ((pi == 0) & (pr > 0)).to(torch.int64) * (SPINE_BONUS if spine else 0)
    return pi, pr, low, leave


def _top(keys: torch.Tensor, width: int, how: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The `width` largest keys, best first. Keys are unique, so sort and top-k agree exactly;
    which is faster depends on the device and sizes (see bench/engine_bench.py)."""
    if how == "sort":
        values, indices = torch.sort(keys, descending=True)
        return values[:width], indices[:width]
    best = torch.topk(keys, width, sorted=True)
    return best.values, best.indices


def select_tree(scores: torch.Tensor, tokens: torch.Tensor, budget: int, how: str = "topk",
                spine: bool | None = None) -> tuple[torch.Tensor, ...]:
    """The budget's nodes as padded device tensors: (tokens, parents, depths, ranks, valid), each [B].

    Node i of the result is tree node i + 1 (the root is not included). Invalid slots (fewer
    prefixes than B exist) come last. No host synchronisation: safe inside a CUDA graph.
    """
    depth, k = int(scores.shape[0]), int(scores.shape[1])
    device = scores.device
    spine = spine_for(budget, depth, spine)
    pi, pr, low, leave = _pair_table(budget, k, str(device), spine)
    width = min(budget, int(pi.shape[0]))
    # the root's empty prefix (score 0, plus the bonus when it heads the spine) then empty
    # slots; built without a host-to-device copy
    beam = torch.where(torch.arange(budget, device=device) == 0, SPINE_BONUS if spine else 0, INVALID)
    rec_score = torch.full((depth, budget), INVALID, dtype=torch.int64, device=device)
    rec_parent = torch.zeros((depth, budget), dtype=torch.int64, device=device)
    rec_rank = torch.zeros((depth, budget), dtype=torch.int64, device=device)
    for d in range(depth):
        cand = (beam[pi] + scores[d][pr] - leave).clamp_min_(INVALID)
        values, indices = _top(cand * _LOW_SCALE + low, width, how)
        beam = torch.full_like(beam, INVALID) if width < budget else beam
        beam[:width] = torch.div(values, _LOW_SCALE, rounding_mode="floor")
        rec_score[d] = beam
        rec_parent[d, :width] = pi[indices]
        rec_rank[d, :width] = pr[indices]
    flat = torch.arange(depth * budget, device=device)
    glow = _LOW_MASK - flat               # shallower first, then the depth's own order
    values, idx = _top(rec_score.reshape(-1) * _LOW_SCALE + glow, budget, how)
    valid = torch.div(values, _LOW_SCALE, rounding_mode="floor") > INVALID
    d_sel, b_sel = idx // budget, idx % budget
    node_of = torch.zeros(depth * budget, dtype=torch.int64, device=device)
    node_of[idx] = torch.arange(1, budget + 1, device=device)
    parent_slot = ((d_sel - 1).clamp_min(0) * budget + rec_parent[d_sel, b_sel])
    parents = torch.where(d_sel == 0, torch.zeros_like(d_sel), node_of[parent_slot])
    ranks = rec_rank[d_sel, b_sel]
    node_tokens = tokens[d_sel, ranks]
    return node_tokens, parents, d_sel + 1, ranks, valid


def fused_available(device: torch.device | str) -> bool:
    """The Triton path runs on CUDA, and on the CPU only under TRITON_INTERPRET=1 (tests)."""
    device = torch.device(device)
    if device.type == "cuda":
        return _triton_importable()
    if device.type == "cpu":
        import os

        return os.environ.get("TRITON_INTERPRET") == "1" and _triton_importable()
    return False


@lru_cache(maxsize=1)
def _kernels() -> Any:
    """The Triton kernels, loaded on first use: triton is imported only where they run."""
    from ddtree_ops.engine import tree_kernels  # triton (seconds, CUDA only): never at import time

    return tree_kernels


def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def _tree_from_nodes(nodes: dict[str, torch.Tensor]) -> Tree:
    n = int(nodes["valid"].sum())         # valid slots are a prefix (root included)
    return Tree(*(nodes[key][:n] for key in ("tokens", "parents", "depths", "ranks")))


def build_tree_vectorized(top: DraftTopK, budget: int, root_token: int, fused: bool | None = None,
                          spine: bool | None = None) -> Tree:
    """The same tree as `build_tree_heap`, built on the tensors' device; one sync to trim.

    `fused=None` takes the Triton selection kernel where it runs (CUDA), PyTorch ops elsewhere."""
    if budget > MAX_BUDGET:
        raise ValueError(f"budget {budget} exceeds the supported maximum {MAX_BUDGET}")
    device = top.tokens.device
    spine = spine_for(budget, top.depth, spine)
    root = lambda v: torch.tensor([v], dtype=torch.int64, device=device)  # noqa: E731
    if budget <= 0 or top.depth == 0 or top.k == 0:
        return Tree(root(root_token), root(-1), root(0), root(0))
    if fused if fused is not None else (device.type == "cuda" and fused_available(device)):
        return _tree_from_nodes(_kernels().select_nodes(top.scores, top.tokens, budget, root(root_token),
                                                        spine=spine))
    tokens, parents, depths, ranks, valid = select_tree(top.scores, top.tokens, budget, spine=spine)
    n = int(valid.sum())                  # valid slots are a prefix (they sort first)
    return Tree(torch.cat([root(root_token), tokens[:n]]), torch.cat([root(-1), parents[:n]]),
                torch.cat([root(0), depths[:n]]), torch.cat([root(0), ranks[:n]]))


def draft_topk_fused(draft_logits: torch.Tensor, k: int) -> DraftTopK:
    """`draft_topk` with the Triton top-K kernel (same log-probs, same order, same scores)."""
    if draft_logits.dim() != 2:
        raise ValueError(f"draft logits must be [L, V], got shape {tuple(draft_logits.shape)}")
    if draft_logits.shape[0] > MAX_DEPTH:
        raise ValueError(f"draft horizon {draft_logits.shape[0]} exceeds the supported maximum {MAX_DEPTH}")
    k = max(0, min(int(k), int(draft_logits.shape[-1])))
    tokens, scores = _kernels().topk_rows(draft_logits, k)
    return DraftTopK(tokens=tokens, scores=scores)


def build_tree_fused(draft_logits: torch.Tensor, budget: int, root_token: int, spine: bool | None = None) -> Tree:
    """Draft logits [L, V] to the tree with the Triton kernels (CUDA); same tree as
    `build_tree_heap(draft_topk(draft_logits, K), budget, root_token, spine)`. One sync, to trim."""
    if budget > MAX_BUDGET:
        raise ValueError(f"budget {budget} exceeds the supported maximum {MAX_BUDGET}")
    top = draft_topk_fused(draft_logits, budget_topk(budget, int(draft_logits.shape[-1])))
    return build_tree_vectorized(top, budget, root_token, fused=True, spine=spine)


def build_chain(top: DraftTopK, root_token: int) -> Tree:
    """DFlash-linear: the rank-0 token at every depth. A tree with one child per node."""
    chain_top = DraftTopK(tokens=top.tokens[:, :1], scores=top.scores[:, :1])
    return build_tree_heap(chain_top, top.depth, root_token, spine=False)


class TreeBuilder:
    """Static buffers for the GPU path: draft logits in, padded tree tensors out.

    `capture()` records one CUDA graph of top-k + selection + visibility, so a build is one
    graph launch with no host round trip. Shapes are fixed at construction (L, V, B).

    `how`: "fused" (the Triton kernels: three launches), "topk" or "sort" (PyTorch ops: the
    selection's top-B by `torch.topk` or `torch.sort`), or "auto": fused where it runs (CUDA
    with Triton), else "topk". Every variant gives the same outputs; invalid slots (fewer than
    B prefixes exist, tiny vocabularies only) are flagged by `valid` and differ in content.
    `spine`: the spine tree or the plain best-first one; None: the default for B and L (`spine_for`).
    """

    def __init__(self, depth: int, vocab: int, budget: int, device: torch.device | str,
                 logits_dtype: torch.dtype = torch.bfloat16, how: str = "auto", spine: bool | None = None) -> None:
        if how not in ("auto", "fused", "topk", "sort"):
            raise ValueError(f"how must be auto, fused, topk or sort, got {how!r}")
        if how == "auto":
            how = "fused" if torch.device(device).type == "cuda" and fused_available(device) else "topk"
        self.depth, self.vocab, self.budget, self.how = depth, vocab, budget, how
        self.spine = spine_for(budget, depth, spine)
        self.k = budget_topk(budget, vocab)
        self.device = torch.device(device)
        self.logits = torch.zeros((depth, vocab), dtype=logits_dtype, device=self.device)
        self.root_token = torch.zeros((), dtype=torch.int64, device=self.device)
        # the fused top-K's completion counters: zeroed once here, left zero by every build
        self.counters = torch.zeros(3 * depth, dtype=torch.int32, device=self.device)
        # and its visibility buffer, which every build zeroes (in the filter kernel) and marks
        self.vis: torch.Tensor | None = None
        if how == "fused":
            self.vis = torch.empty(_kernels().vis_bytes(budget), dtype=torch.int8, device=self.device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: dict[str, torch.Tensor] = {}

    def _run(self) -> None:
        if self.how == "fused":
            kernels = _kernels()
            tokens, scores = kernels.topk_rows(self.logits, self.k, self.counters, clear=self.vis)
            self.out = kernels.select_nodes(scores, tokens, self.budget, self.root_token, vis=self.vis,
                                            spine=self.spine)
            return
        top = draft_topk(self.logits, self.k)
        tokens, parents, depths, ranks, valid = select_tree(top.scores, top.tokens, self.budget, self.how,
                                                            spine=self.spine)
        zero = torch.zeros(1, dtype=torch.int64, device=self.device)
        all_parents = torch.cat([zero - 1, parents])
        self.out = {
            "tokens": torch.cat([self.root_token.view(1), tokens]),
            "parents": all_parents,
            "depths": torch.cat([zero, depths]),
            "ranks": torch.cat([zero, ranks]),
            "valid": torch.cat([torch.ones(1, dtype=torch.bool, device=self.device), valid]),
            "visibility": ancestor_matrix(all_parents, self.depth),
        }

    def capture(self) -> None:
        if self.device.type != "cuda":
            return
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):             # warm-up: allocator and cached pair tables
                self._run()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._run()

    def build(self, draft_logits: torch.Tensor, root_token: torch.Tensor | int) -> dict[str, torch.Tensor]:
        self.logits.copy_(draft_logits)
        self.root_token.fill_(root_token) if isinstance(root_token, int) else self.root_token.copy_(root_token)
        if self.graph is not None:
            self.graph.replay()
        else:
            self._run()
        return self.out
