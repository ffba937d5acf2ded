"""The tree's exact acceptance under greedy decoding, decided from the tokens committed later.

Under greedy decoding the committed tokens ARE the target's greedy continuation, whatever the
drafter proposed: so a sampled round's tree would have accepted the longest prefix of the tokens
committed after that round's root that is a path in the tree, plus the target's next token
(`shadow.greedy_walk`). Those tokens are known a few rounds later, in the request's own
`output_ids`, which SGLang's scheduler fills as it processes each round's result.

`HorizonBook` keeps each sampled greedy round's tree per request until enough of the request's
continuation is committed to decide the walk (at most the draft horizon, fewer when the walk
leaves the tree early), then hands the figure to the accounting. A round whose request ends
before its walk is decided is dropped and counted, never guessed; so is one past the store's
limit. Rows are matched to their place in the request by the root's position (the prefix length
SGLang verified the round at, copied with the round) and checked: the token there must be the
round's root, else the round is dropped and counted as misaligned (a retraction, or an SGLang
that keeps its outputs otherwise).

Requests are SGLang `Req` objects, read duck-typed: `origin_input_ids`, `output_ids`, `finished()`.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from ddtree_ops.engine.shadow import OnlineShadow, greedy_walk

logger = logging.getLogger("ddtree_ops.engine.sglang")
MISALIGNED = ("DDTREE shadow: a sampled round's root is not where the request's committed tokens put it (position %d, "
              "prompt %d, %d outputs): its exact figure is dropped; further such rounds are counted in dropped=")


class PendingTree:
    __slots__ = ("children", "ranks", "root_pos", "root_token", "chain_tokens")

    def __init__(self, children: list[dict[int, int]], ranks: list[int], root_pos: int, root_token: int,
                 chain_tokens: int) -> None:
        self.children, self.ranks, self.root_pos = children, ranks, root_pos
        self.root_token, self.chain_tokens = root_token, chain_tokens


def is_greedy(req: Any) -> bool:
    """SGLang normalises temperature 0 to top_k 1 (sampling_params.py): greedy either way."""
    sp = getattr(req, "sampling_params", None)
    if sp is None:
        return False
    top_k = getattr(sp, "top_k", None)
    temperature = getattr(sp, "temperature", None)
    return top_k == 1 or (temperature is not None and temperature <= 1e-6)


def row_requests(reqs: Any, bs: int) -> tuple[list[Any] | None, list[bool]]:
    """The batch's requests row by row, and which decode greedily; (None, all False) when the
    batch does not say (then only the lower bound is accounted)."""
    if reqs is None:
        return None, [False] * bs
    rows = list(reqs)
    if len(rows) != bs:
        return None, [False] * bs
    return rows, [is_greedy(r) for r in rows]


class HorizonBook:
    def __init__(self, acct: OnlineShadow, horizon: int, limit: int) -> None:
        self.acct, self.horizon, self.limit = acct, horizon, limit
        self.by_req: dict[int, tuple[Any, deque[PendingTree]]] = {}
        self.pending = 0
        self.misaligned = 0
        self.decided = 0

    def add(self, req: Any, tree: PendingTree) -> None:
        if self.pending >= self.limit:
            self.acct.drop(reason="pending-full")
            return
        entry = self.by_req.get(id(req))
        if entry is None:
            entry = self.by_req[id(req)] = (req, deque())
        entry[1].append(tree)
        self.pending += 1

    def resolve(self) -> int:
        """Decide every pending tree whose continuation is now committed; returns how many."""
        done = 0
        for key in list(self.by_req):
            req, trees = self.by_req[key]
            done += self._resolve_req(req, trees)
            if not trees:
                del self.by_req[key]
        return done

    def _resolve_req(self, req: Any, trees: deque[PendingTree]) -> int:
        out = req.output_ids
        origin = len(req.origin_input_ids)
        finished = bool(req.finished())
        done = 0
        while trees:
            t = trees[0]
            i = t.root_pos - origin
            if i < 0 or (i < len(out) and int(out[i]) != t.root_token):
                if not self.misaligned:
                    logger.warning(MISALIGNED, t.root_pos, origin, len(out))
                self.misaligned += 1
                self.acct.drop(reason="misaligned")
            else:
                got = greedy_walk(t.children, t.ranks, out[i + 1:i + 1 + self.horizon], self.horizon) \
                    if i < len(out) else None
                if got is None and not finished:
                    break                  # later trees of this request need even more tokens
                if got is None:
                    self.acct.drop(reason="request-ended")
                else:
                    self.acct.observe_exact(t.chain_tokens, got[0], got[1])
                    self.decided += 1
            trees.popleft()
            self.pending -= 1
            done += 1
        return done
