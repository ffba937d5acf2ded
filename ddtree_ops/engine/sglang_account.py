"""Accounting of the rounds that reached the host: on the scheduler's thread, or on one of its own.

Per landed round and row: the tree from the draft's top-K (`shadow.heap_tree`, the engine's
heap on lists), the spine lower bound into the running totals, and, for greedy requests, the
tree kept in the `HorizonBook` until the committed continuation decides its exact acceptance.

`InlineAccountant` (the default) runs this on the scheduler's thread, at the next call into the
worker once the round's copy has landed: the scheduler never waits for the GPU for the shadow,
but the host time is its own. `ThreadAccountant` (DDTREE_SHADOW_ACCOUNT_THREAD=1) hands landed
rounds to a daemon thread, which waits on the round's event (a CUDA wait releases the GIL) and
accounts there; it yields the GIL after every row, so SGLang's thread waits at most one row's
work for it (Python's default switch interval is 5 ms, half an 8B-shape verify round). A
scheduler that spends its rounds waiting on the GPU then does the accounting in that wait.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from typing import Any

from ddtree_ops.engine.sglang_horizon import HorizonBook, PendingTree
from ddtree_ops.engine.sglang_transfer import Landing, RoundTransfer
from ddtree_ops.engine.shadow import OnlineShadow, heap_tree

logger = logging.getLogger("ddtree_ops.engine.sglang")


class RoundMeta:
    """What the host knows of a sampled round when it is sent: its shape and its requests."""

    __slots__ = ("bs", "width", "k", "reqs", "greedy", "verify_round")

    def __init__(self, bs: int, width: int, k: int, reqs: list[Any] | None, greedy: list[bool],
                 verify_round: int) -> None:
        self.bs, self.width, self.k, self.reqs, self.greedy = bs, width, k, reqs, greedy
        self.verify_round = verify_round


class InlineAccountant:
    def __init__(self, acct: OnlineShadow, transfer: RoundTransfer, horizon: int, max_pending: int) -> None:
        self.acct, self.transfer = acct, transfer
        self.book = HorizonBook(acct, horizon, max_pending)
        self.pending: deque[Landing] = deque()
        self.rows = 0                   # rows accounted
        self.first_round_said = False

    def submit(self, landing: Landing) -> None:
        self.pending.append(landing)

    def poll(self, wait: bool = False) -> None:
        """Account every round whose copy has landed (all of them when `wait`), then decide the
        greedy trees whose continuation is committed."""
        while self.pending and (wait or self.pending[0].ready()):
            landing = self.pending.popleft()
            landing.wait()
            self.account(landing)
        self.book.resolve()

    def in_flight(self) -> int:
        return len(self.pending)

    def account(self, landing: Landing) -> None:
        meta: RoundMeta = landing.meta
        tok, sc, cand, commit, bonus, prefix = landing.parts()
        self.transfer.release(landing)
        bs, width, k = meta.bs, meta.width, meta.k
        depth = width - 1
        for b in range(bs):
            rows_t = [tok[(b * depth + d) * k:(b * depth + d + 1) * k] for d in range(depth)]
            rows_s = [sc[(b * depth + d) * k:(b * depth + d + 1) * k] for d in range(depth)]
            children, ranks = heap_tree(rows_t, rows_s, self.acct.budget)
            chain = cand[b * width:(b + 1) * width]
            self.acct.observe_row(children, chain, commit[b] - 1, bonus[b])
            if meta.reqs is not None and meta.greedy[b]:
                self.book.add(meta.reqs[b], PendingTree(children, ranks, prefix[b], chain[0], commit[b]))
            else:       # a sampled request's tokens are samples, not the target's greedy choices
                self.acct.unpaired("not-greedy" if meta.reqs is not None else "no-request")
            self.rows += 1
            self.yield_gil()
        if not self.first_round_said:
            self.first_round_said = True
            logger.info("DDTREE shadow: accounting running (first round: %d row(s), %d verify rounds so far)",
                        bs, meta.verify_round)

    def yield_gil(self) -> None:
        """Nothing to yield to on the scheduler's own thread."""


class ThreadAccountant(InlineAccountant):
    """The same accounting on a daemon thread fed through a queue."""

    def __init__(self, acct: OnlineShadow, transfer: RoundTransfer, horizon: int, max_pending: int) -> None:
        super().__init__(acct, transfer, horizon, max_pending)
        self.queue: queue.SimpleQueue[Landing | None] = queue.SimpleQueue()
        self.outstanding = 0
        self.lock = threading.Lock()          # the book and the totals: one writer at a time
        self.thread = threading.Thread(target=self._run, name="ddtree-shadow-accounting", daemon=True)
        self.thread.start()

    def submit(self, landing: Landing) -> None:
        with self.lock:
            self.outstanding += 1
        self.queue.put(landing)

    def poll(self, wait: bool = False) -> None:
        if wait:
            while self.outstanding:
                time.sleep(0.001)
            with self.lock:
                self.book.resolve()

    def in_flight(self) -> int:
        return self.outstanding

    def yield_gil(self) -> None:
        time.sleep(0)

    def _run(self) -> None:
        while True:
            try:
                landing = self.queue.get(timeout=0.05)
            except queue.Empty:
                with self.lock:
                    self.book.resolve()          # requests go on committing while no round is sampled
                continue
            if landing is None:
                return
            try:
                landing.wait()
                with self.lock:
                    self.account(landing)
                    self.book.resolve()
            except Exception:                    # never let the thread die silently
                logger.exception("DDTREE shadow: accounting thread failed on a round; round skipped")
            finally:
                with self.lock:
                    self.outstanding -= 1

    def close(self) -> None:
        self.queue.put(None)
