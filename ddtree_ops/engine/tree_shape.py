"""The tree's limits and the shape of its selection, in plain Python (no torch): below both the
PyTorch build (`tree.py`) and the Triton kernels (`tree_kernels.py`), and readable by the CLI's
option checks and the serving-side heap (`shadow.py`) without loading torch.

The spine. A spine tree holds the draft's top-1 chain (rank 0 at every depth, the DFlash chain)
down to depth min(B, L), then spends the rest of the budget best-first. Under greedy decoding it
then accepts at least what the chain accepts on every round: the target's choices along the
spine are the chain's. Every build makes it the same way, by a key bonus: a spine node's key is
its path score plus SPINE_BONUS, so every spine node precedes every other node; leaving the
spine (a rank > 0 child of a spine node) drops the bonus. Path scores lie in
[-MAX_DEPTH * 1000 * 2**24, 0], inside (-2**39, 0], so spine keys (score + 2**39 > 0) and the
others (<= 0) never meet, and the builds' int64 keys (key * 2**23 + tie bits) still fit.
Within the spine the order is depth; among the rest it is the plain total order, with a spine
parent placed before every other parent at its depth. So the spine is nodes 1..min(B, L) in
depth order, and an accepted path that stays on it needs no KV compaction.
"""

from __future__ import annotations

SCORE_BITS = 24                 # log-prob resolution: 2**-24 nats
LP_FLOOR = -1000.0              # zero-probability tokens get a finite score so sums stay exact
MAX_DEPTH = 32                  # |score| <= 32 * 1000 * 2**24 < 2**39
MAX_BUDGET = 2048               # parent position * K + rank < 2**22 (the tie-break bits)
SPINE_BONUS = 1 << 39           # > every |path score|: see the module's note
SPINE = True                    # the default where the budget holds the chain (spine_for; docs/engine.md says why)


def spine_for(budget: int, depth: int, spine: bool | None = None) -> bool:
    """The shape a build makes: `spine` when the caller names one; else the spine tree when the
    budget holds the whole chain (B >= L, the default, SPINE), and the plain best-first tree below
    that. Below the horizon no tree of B nodes can hold the chain, and the spine tree is the chain
    cut at depth B, which on the CPU-trained pair accepted fewer tokens than both the chain and the
    plain tree (bench/results/spine_vs_plain.json, B = 8, L = 15)."""
    if spine is not None:
        return bool(spine)
    return SPINE and int(budget) >= int(depth)


def budget_topk(budget: int, vocab: int) -> int:
    """K = min(B, V): with a budget of B no node can sit at rank B or deeper."""
    return max(1, min(int(budget), int(vocab)))


def staircase_pairs(budget: int, k: int, spine: bool = False) -> tuple[list[int], list[int]]:
    """Candidate (beam position i, rank r) pairs that can still be in a depth's top B, ordered
    by i then r.

    With the beam sorted best first and ranks sorted best first, every (j, s) with j <= i and
    s <= r comes no later than (i, r); so (i + 1) * (r + 1) > B means B others precede it.
    That leaves about B * ln B candidates per depth instead of B * K.

    Spine: beam position 0 is the spine node, whose rank > 0 children lose the bonus, so the
    square argument holds over positions 1..i only, plus the spine child (0, 0) that precedes
    everything: (i, r) with i >= 1 has i * (r + 1) nodes before it, and (0, r) has r.
    """
    pos, rank = [], []
    for i in range(budget):
        if spine:
            width = min(k, budget if i == 0 else (budget - 1) // i)
        else:
            width = min(k, budget // (i + 1))
        pos.extend([i] * width)
        rank.extend(range(width))
    return pos, rank
