"""ddtree-ops LAB STAND-IN: the simulated draft and target behind the ddtree plugin's rounds, the
simulated verify cost, and the tree verify backend the stand-in declares for the plugin.

SIMULATED, all of it; nothing here runs a model.

The world (`World`). Each request has a truth tape: the target's greedy token at every position, drawn
once and kept, so that whatever a round's tree would have accepted (the shadow's exact figure,
decided later over the committed tokens) is what that tree accepts when it is served. Each round the
draft proposes a distribution per position, a calibrated one: the truth token sits at rank 0 with
probability P_TOP1, else at rank r >= 1 with probability proportional to r ** -ALPHA (the draft's own
probabilities, which the tree is built from, are exactly these). The chain's acceptance per round is
what the stand-in's per-request statistics say (textgen, from the mode's mean acceptance), so the
ranks before it are forced to 0 and the one at it to >= 1; every later position is drawn freely.
Under SGLANG_SIMULATE_ACC_LEN (the real runs' random weights) the draft is flat: the forced tokens
are the chain's own and the tree gains nothing past them, as on the H200.

The cost (`VerifyCost`). A verify forward of T tokens (batch rows x tokens a row) takes, on the
simulated card, t_w * (1 + (T / ridge) ** 4) ** (1 / 4): t_w is the target's weights over the card's
memory bandwidth (a decode step reads them once), ridge = dense BF16 tensor throughput x MMA_EFF /
bandwidth is the token count where the GEMMs' FLOPs take as long as that read (BF16 weights: two bytes
and two FLOPs a parameter a token), and the fourth-power norm is a roofline with a smooth knee. The
cards' figures are their datasheets'. The RTX A6000 has a third of the RTX PRO 6000's tensor
throughput for 43% of its bandwidth, so the same tree costs it more chain rounds: its measured r is
higher. Each forward is jittered by JITTER (seeded) so the measurement has a measurement's spread.

The pace (`PACE`). The stand-in waits out a quarter of the simulated verify time of a request's
rounds: a lab load gathers rounds four times as fast as the simulated card would serve them, as the
stand-in's start compresses SGLang's. Every figure keeps the simulated time (the plugin's measured r,
the request's e2e_latency): only the wall clock between two requests shrinks.

The backend (`SimTreeVerify`): what SGLang's own tree verify will do on a GPU (issue 33), on this
world: the draft (through the plugin's folded top-K), the plugin's tree, the target's choice at every
node, the walk committed. The lab fault `tree-mask` breaks the mask the way a real tree-attention bug
does: nodes off the spine see the wrong ancestors, so the target's choices there are wrong and the
served tree accepts little more than the chain, well below what the shadow predicted.
"""

from __future__ import annotations

import math
import random
import types
from typing import Any, Optional

SIM_VOCAB = 256          # vocabulary = hidden size: the simulated head is the identity (hidden = logits)
P_TOP1 = 0.75            # the draft's top-1 probability (how often it is right past the chain's miss)
ALPHA = 2.5              # the tail: rank r >= 1 holds (1 - P_TOP1) * r ** -ALPHA / H of the mass
MMA_EFF = 0.5            # share of the datasheet tensor throughput a verify GEMM of a few hundred rows gets
JITTER = 0.02            # relative spread of one forward's time
PACE = 0.25              # the share of the simulated verify time the stand-in waits out (the module docstring)
# datasheet figures: memory bandwidth (bytes/s), dense BF16 tensor FLOP/s with FP32 accumulate
CARDS = {
    "RTX A6000": (768e9, 154.8e12),
    "RTX PRO 6000": (1792e9, 503.8e12),
    "H200": (4.8e12, 989e12),
    "H100": (3.35e12, 989e12),
}
BY_ARCH = {"8.6": "RTX A6000", "12.0": "RTX PRO 6000", "9.0": "H100"}
TREE_MASK_FAULT = "tree-mask"


def card_figures(name: str, compute_cap: str) -> tuple[str, float, float]:
    """(the card class, bandwidth, tensor FLOP/s) of the simulated card, by name, else by arch."""
    for key, figures in CARDS.items():
        if key in name:
            return key, *figures
    key = BY_ARCH.get(compute_cap, "RTX A6000")
    return key, *CARDS[key]


class VerifyCost:
    """Seconds of one simulated verify forward over `tokens` tokens (see the module docstring)."""

    def __init__(self, card_name: str, compute_cap: str, weight_bytes: int, seed: int = 0) -> None:
        self.card, bandwidth, flops = card_figures(card_name, compute_cap)
        self.weight_s = max(weight_bytes, 1) / bandwidth
        self.ridge = flops * MMA_EFF / bandwidth
        self.rng = random.Random(seed)

    def exact(self, tokens: int) -> float:
        return self.weight_s * (1.0 + (tokens / self.ridge) ** 4) ** 0.25

    def __call__(self, tokens: int) -> float:
        return self.exact(tokens) * (1.0 + self.rng.gauss(0.0, JITTER))


class World:
    """The simulated draft and target (see the module docstring)."""

    def __init__(self, seed: int = 0, flat: bool = False) -> None:
        self.rng = random.Random(seed)
        self.flat = flat
        v = SIM_VOCAB
        if flat:       # random weights: every token alike
            self.p = [1.0 / v] * v
        else:
            h = sum(r ** -ALPHA for r in range(1, v))
            self.p = [P_TOP1] + [(1.0 - P_TOP1) * r ** -ALPHA / h for r in range(1, v)]
        self.logp = [math.log(x) for x in self.p]
        tail, acc = [], 0.0
        for x in self.p[1:]:
            acc += x
            tail.append(acc)
        self.tail = tail                       # cumulative mass of ranks 1..V-1

    def _rank(self, forced: Optional[int]) -> int:
        """0 when forced so; a rank >= 1 (forced=1: the chain's miss); else a draw from the draft's own
        probabilities."""
        if forced == 0:
            return 0
        if forced is None and self.rng.random() < self.p[0]:
            return 0
        u = self.rng.random() * self.tail[-1]
        lo, hi = 0, len(self.tail) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.tail[mid] < u:
                lo = mid + 1
            else:
                hi = mid
        return lo + 1

    def draft_row(self, tape: dict[int, int], root_pos: int, depth: int,
                  chain_commit: Optional[int]) -> tuple[list[list[float]], list[int]]:
        """One row's draft logits per position ([depth][V]) and the truth ([depth + 1] tokens: the
        target's choice after the root and after each drafted position): `chain_commit` (tokens incl.
        the bonus) forces the chain's acceptance this round."""
        logits, truth = [], []
        for d in range(depth):
            forced = None if chain_commit is None else 0 if d < chain_commit - 1 else 1 if d == chain_commit - 1 else None
            rank = self._rank(forced)
            perm = self.rng.sample(range(SIM_VOCAB), SIM_VOCAB)
            pos = root_pos + 1 + d
            if pos in tape:                                # the truth is fixed: put it at the drawn rank
                at = perm.index(tape[pos])
                perm[at], perm[rank] = perm[rank], perm[at]
            else:
                tape[pos] = perm[rank]
            row = [0.0] * SIM_VOCAB
            for r, tok in enumerate(perm):
                row[tok] = self.logp[r]
            logits.append(row)
            truth.append(tape[pos])
        last = root_pos + 1 + depth                        # the target's choice after the whole block
        truth.append(tape.setdefault(last, self.rng.randrange(SIM_VOCAB)))
        return logits, truth


def commit_to_tape(tape: dict[int, int], root_pos: int, committed: list[int]) -> None:
    """What the round committed is the request's text from now on: where it differs from the tape
    (a broken tree verify committed a wrong bonus), the tape past it is drawn again."""
    for i, tok in enumerate(committed):
        pos = root_pos + 1 + i
        if tape.get(pos) != tok:
            for later in [p for p in tape if p >= pos]:
                del tape[later]
            tape[pos] = tok


class SimTreeVerify:
    """The tree verify backend of the lab's stand-in (entry point group ddtree_ops.tree_verify, `*`)."""

    name = "ddtree-ops LAB STAND-IN simulated tree verify"

    def tree_round(self, worker: Any, batch: Any, build: Any, **_forward: Any) -> Any:
        # the plugin's own types, from the engine wheel the stand-in runs it from
        from ddtree_ops.engine.sglang_backend import TreeRound, walk

        import torch

        rows = worker.sim_draft(batch)               # runs the draft (the plugin's fold takes the top-K)
        depth = worker.block_size - 1
        tok, sc = worker.ddtree_round_topk(len(rows) * depth)
        broken = TREE_MASK_FAULT in worker.faults
        trees, accepted, predicts, commits, bonuses = [], [], [], [], []
        for b, row in enumerate(rows):
            tree = build(tok[b * depth:(b + 1) * depth], sc[b * depth:(b + 1) * depth], row.root)
            spine = set(tree.spine)
            predict = []
            for node in range(tree.size):
                right = row.truth[tree.depths[node]] if _on_path(tree, node, row.truth) else -1
                if right < 0 or (broken and node not in spine):
                    right = _wrong(tree, node, right)
                predict.append(right)
            path, bonus = walk(tree, predict)
            committed = [tree.tokens[n] for n in path[1:]] + [bonus]
            worker.sim_commit(row, committed)
            trees.append(tree)
            accepted.append(path)
            predicts.append(predict)
            commits.append(len(path))
            bonuses.append(bonus)
        seconds = worker.sim_cost(sum(t.size for t in trees))   # the forward verifies every row's whole tree
        worker.sim_seconds += seconds or 0.0
        result = types.SimpleNamespace(accept_lens=torch.tensor(commits, dtype=torch.int32),
                                       next_draft_input=types.SimpleNamespace(bonus_tokens=torch.tensor(bonuses)))
        return TreeRound(result, trees, accepted, predicts, seconds)

    def chain_round(self, worker: Any, batch: Any, forward: Any) -> tuple[Any, Optional[float]]:
        result = forward()
        return result, worker.last_seconds

    def probe(self, worker: Any, batch: Any, nodes: int) -> Optional[float]:
        rows = len(getattr(batch, "reqs", None) or []) or 1
        return worker.sim_cost(rows * nodes)


def _on_path(tree: Any, node: int, truth: list[int]) -> bool:
    """Whether the node's path from the root is the truth's prefix."""
    n = node
    while n > 0:
        d = tree.depths[n]
        if d - 1 >= len(truth) or tree.tokens[n] != truth[d - 1]:
            return False
        n = tree.parents[n]
    return True


def _wrong(tree: Any, node: int, not_this: int) -> int:
    """A token none of the node's children holds (a prediction the walk cannot follow), not `not_this`."""
    taken = set(tree.children[node]) | {not_this}
    tok = (tree.tokens[node] * 31 + 7) % SIM_VOCAB
    while tok in taken:
        tok = (tok + 1) % SIM_VOCAB
    return tok
