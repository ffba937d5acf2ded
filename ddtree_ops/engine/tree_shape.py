"""The tree's limits and the shape of its selection, in plain Python (no torch): below both the
PyTorch build (`tree.py`) and the Triton kernels (`tree_kernels.py`), and readable by the CLI's
option checks without loading torch.
"""

from __future__ import annotations

SCORE_BITS = 24                 # log-prob resolution: 2**-24 nats
LP_FLOOR = -1000.0              # zero-probability tokens get a finite score so sums stay exact
MAX_DEPTH = 32                  # |score| <= 32 * 1000 * 2**24 < 2**39
MAX_BUDGET = 2048               # parent position * K + rank < 2**22 (the tie-break bits)


def budget_topk(budget: int, vocab: int) -> int:
    """K = min(B, V): with a budget of B no node can sit at rank B or deeper."""
    return max(1, min(int(budget), int(vocab)))


def staircase_pairs(budget: int, k: int) -> tuple[list[int], list[int]]:
    """Candidate (beam position i, rank r) pairs that can still be in a depth's top B, ordered
    by i then r.

    With the beam sorted best first and ranks sorted best first, every (j, s) with j <= i and
    s <= r comes no later than (i, r); so (i + 1) * (r + 1) > B means B others precede it.
    That leaves about B * ln B candidates per depth instead of B * K.
    """
    pos, rank = [], []
    for i in range(budget):
        width = min(k, budget // (i + 1))
        pos.extend([i] * width)
        rank.extend(range(width))
    return pos, rank
