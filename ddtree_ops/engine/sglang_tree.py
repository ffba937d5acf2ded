"""DDTREE_MODE=tree: the tree is served, the chain's spine inside it, and the chain is still measured.

The reverse shadow. Every tree round holds the draft's top-1 chain (the spine, `shadow.heap_tree`,
the very build the shadow accounted), and the target's greedy choice at every node is computed by the
round's verify. So one round tells exactly, under greedy decoding, what the tree accepted (the walk
down the target's choices, which is what gets committed) and what the chain alone would have accepted
(the same walk along the spine): a paired (chain, tree) figure per row, at once, with no continuation
to wait for. A share of rounds (DDTREE_CHAIN_SHARE, default 5%) verifies the spine alone instead, which
is DFlash's own round, so the verify cost of a tree round against a chain round, r, is measured on the
same traffic at the same time, per batch-size bucket (`treestats.measured_ratio`). Both taus and r go
to the same counters the shadow exports (mode="tree"), and the verdict is `treestats.verdict` again.

What is SGLang's and what is ours. The tree verify itself (a TARGET_VERIFY forward over the tree's
nodes under an ancestor-only mask, the target's choice at every node, the accepted path committed to
the KV cache and the request) is SGLang's machinery, different in each release, and needs a GPU. It
is a *backend* (`TreeVerifyBackend`), found by the entry point group `ddtree_ops.tree_verify` under
the SGLang release it serves (or `*`). This module is the part that does not change with the release:
the tree (the spine plus the budget best-first), the top-K it is built from (folded into DFlash's
draft graph as in the shadow, `sglang_topk`), the choice of arm, the cross-check of what the backend
committed against the walk down its own target choices, the accounting, the report line and /metrics.

The wheel declares SGLang 0.5.17's backend (sglang_backend_0517, issue 33); on a release without
one the validator refuses DDTREE_MODE=tree at launch, preflight refuses it before
any change, and the worker refuses to start. The lab's stand-in declares a simulated backend
(`ddtree_ops/lab/standin/treesim.py`), which is how the mode is served, gated and promoted in the lab.
"""

from __future__ import annotations

import logging
import random
from functools import partial
from typing import Any

from ddtree_ops.engine.sglang_backend import (RowTree, TreeRound, build_tree, find_backend, is_verify_round,
                                              sibling_depths, spine_tokens, walk)
from ddtree_ops.engine.sglang_horizon import row_requests
from ddtree_ops.engine.sglang_metrics import ShadowMetrics
from ddtree_ops.engine.sglang_settings import cost_ratio, read_settings, sglang_version
from ddtree_ops.engine.sglang_topk import eager_topk, fold_topk, head_rows
from ddtree_ops.engine.shadow import OnlineShadow, ShadowReport
from ddtree_ops.treestats import FROM_MEASURED

logger = logging.getLogger("ddtree_ops.engine.sglang")

STARTED = ("DDTREE tree: serving the tree (budget %d, horizon %d, spine inside), %.0f%% of rounds verify the spine "
           "alone, tree verify by %s, cost ratio %.3f (%s) until measured")
MISMATCH = ("DDTREE tree: the backend committed a path that is not the walk down its own target choices (row %d: "
            "%s, walk %s); such rows are counted as dropped reason=accept-mismatch")
BELOW_CHAIN = ("DDTREE tree: a row's tree accepted %d tokens where its spine alone accepts %d: the served tree does "
               "not hold the chain (counted as dropped reason=below-chain)")


# ------------------------------------------------------------------ the report line


TREE_LINE = ("DDTREE tree: rounds={rounds} exact={exact} tau_tree={tau_tree} tau_chain={tau_chain} cost_ratio={r} "
             "cost_from={source} speedup={speedup} lower={lower} recommendation={rec} chain_rounds={chain_rounds} "
             "dropped={dropped}")


def format_tree_report(rep: ShadowReport, chain_rounds: int, dropped: int) -> str:
    """The tree mode's report line (every DDTREE_SHADOW_REPORT_EVERY rows): the served tree's tau and
    the paired chain's over the same exact rounds, the r in force and where from, the verdict."""
    def num(x: float | None) -> str:
        return f"{x:.3f}" if x is not None else "n/a"

    return TREE_LINE.format(rounds=rep.rounds, exact=rep.sampled_rounds, tau_tree=num(rep.tau_tree),
                            tau_chain=num(rep.tau_chain_sampled), r=num(rep.cost_ratio),
                            source=rep.cost_source or "n/a", speedup=num(rep.projected_speedup),
                            lower=num(rep.speedup_lower), rec=rep.recommendation, chain_rounds=chain_rounds,
                            dropped=dropped)


# ------------------------------------------------------------------ the worker


class _TreeState:
    def __init__(self, worker: Any) -> None:
        settings, problems = read_settings()
        if settings.mode != "tree":
            problems.append(f"DDTREE_MODE={settings.mode!r}: the tree worker serves only DDTREE_MODE=tree")
        self.backend, why = find_backend(sglang_version())
        if self.backend is None:
            problems.append(f"DDTREE_MODE=tree: {why}")
        elif hasattr(self.backend, "problems"):     # what the release's backend cannot serve, said at start
            problems += [f"DDTREE_MODE=tree: {p}" for p in self.backend.problems(worker)]
        if problems:        # the validator refused these at launch: never serve a tree it did not allow
            raise RuntimeError("DDTREE tree worker refused to start:\n  - " + "\n  - ".join(problems))
        block = int(getattr(worker, "block_size", 16) or 16)
        self.horizon = block - 1
        self.budget = settings.budget or self.horizon
        self.chain_share = settings.chain_share
        self.coin = random.Random(0)
        self.folded: Any = None
        self.stash: Any = None
        self.verify_rounds = self.chain_rounds = 0
        self.metrics = ShadowMetrics()
        self.ratio, self.cost_source = cost_ratio(settings, self.budget, block)
        self.metrics.cost_ratio(self.cost_source, self.ratio)
        self.acct = OnlineShadow(self.budget, self.horizon, report_every=settings.report_every,
                                 on_report=self._report, cost_ratio=self.ratio, cost_source=self.cost_source,
                                 mode="tree")
        self.warned: set[str] = set()
        logger.info(STARTED, self.budget, self.horizon, 100 * self.chain_share, getattr(self.backend, "name", "?"),
                    self.ratio, self.cost_source)

    def once(self, key: str, message: str, *args: Any) -> None:
        if key not in self.warned:
            self.warned.add(key)
            logger.warning(message, *args)

    def _report(self, rep: ShadowReport) -> None:
        logger.info(format_tree_report(rep, self.chain_rounds, sum(self.acct.drops.values())))
        self.metrics.publish_counters(self.acct.counters())
        if rep.cost_source == FROM_MEASURED and rep.cost_ratio is not None:
            self.metrics.cost_ratio(FROM_MEASURED, rep.cost_ratio)

    def build(self, tok: list[list[int]], sc: list[list[int]], root_token: int) -> RowTree:
        """The served tree: the build the shadow accounted (`OnlineShadow.spine`, the engine's default)."""
        return build_tree(tok, sc, self.budget, root_token, self.acct.spine)

    def account(self, rnd: TreeRound, reqs: Any, bs: int) -> None:
        """Each row's exact pair from the target's choices the backend computed: the tree's tokens as
        committed (checked against the walk), the chain's along the spine."""
        _rows, greedy = row_requests(reqs, bs)
        if rnd.seconds is not None:
            self.acct.add_cost("tree", bs, rnd.seconds)
        for b, tree in enumerate(rnd.trees):
            committed = len(rnd.accepted[b])
            predict = rnd.predict[b] if b < len(rnd.predict) else None
            if predict is None or not greedy[b]:
                self.acct.tally.add(committed, committed)
                self.acct.unpaired("not-greedy")
            else:
                path, _bonus = walk(tree, predict)
                chain = spine_tokens(tree, predict)
                if chain is None:
                    self.acct.tally.add(committed, committed)
                    self.acct.unpaired("spine-cut")
                elif path != rnd.accepted[b]:
                    self.once("mismatch", MISMATCH, b, rnd.accepted[b], path)
                    self.acct.tally.add(chain, committed)
                    self.acct.unpaired("accept-mismatch")
                elif committed < chain:
                    self.once("below", BELOW_CHAIN, committed, chain)
                    self.acct.tally.add(chain, committed)
                    self.acct.unpaired("below-chain")
                else:
                    self.acct.tally.add(chain, committed)
                    self.acct.observe_exact(chain, committed, sibling_depths(tree, path))
            self.acct.maybe_report()


class TreeWorkerMixin:
    """Mix in before SGLang's DFlash worker (`sglang_worker.DDTreeTreeWorker`) or the lab's simulated
    one; the backend does what differs between releases (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ddtree_tree()          # refuse at start, not at the first request

    def _ddtree_tree(self) -> _TreeState:
        state = self.__dict__.get("_ddtree_tree_state")
        if state is None:
            state = _TreeState(self)
            self.__dict__["_ddtree_tree_state"] = state
        return state

    # ---- the draft's top-K, taken where the shadow takes it (sglang_topk)
    def _maybe_build_draft_sampler(self) -> Any:
        sampler = super()._maybe_build_draft_sampler()  # type: ignore[misc]
        st = self._ddtree_tree()
        folded, why = fold_topk(sampler, st.budget)
        if folded is None:
            logger.info("DDTREE tree: top-K taken on the eager draft head (%s)", why)
            return sampler
        st.folded = folded
        logger.info("DDTREE tree: top-%d taken inside the draft's CUDA graph with DFlash's head", folded.k)
        return folded

    def _greedy_sample_from_vocab_parallel_head(self, *, hidden_states: Any, lm_head: Any,
                                                chunk_size: int = 256) -> Any:
        out = super()._greedy_sample_from_vocab_parallel_head(  # type: ignore[misc]
            hidden_states=hidden_states, lm_head=lm_head, chunk_size=chunk_size)
        st = self._ddtree_tree()
        runner = getattr(self, "model_runner", None)
        rows = head_rows(lm_head, getattr(getattr(runner, "model_config", None), "vocab_size", None))
        if rows is not None:
            st.stash = eager_topk(hidden_states, rows, min(st.budget, int(rows.shape[0])), chunk_size)
        return out

    def ddtree_round_topk(self, rows: int) -> tuple[list[list[int]], list[list[int]]]:
        """This round's draft top-K for `rows` draft positions (rows = bs x horizon), as lists: from
        the eager head if it ran, else from the draft graph's replay."""
        st = self._ddtree_tree()
        stash, st.stash = st.stash, None
        if stash is None and st.folded is not None:
            stash = st.folded.round(rows)
        if stash is None:
            raise RuntimeError("DDTREE tree: no draft top-K this round (neither the draft graph nor the eager head "
                               "ran where the plugin reads it)")
        tokens, scores = stash
        return tokens.tolist(), scores.tolist()

    def forward_batch_generation(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        st = self._ddtree_tree()
        forward = partial(super().forward_batch_generation, batch, *args, **kwargs)  # type: ignore[misc]
        if not is_verify_round(batch):
            return forward()
        reqs = getattr(batch, "reqs", None)
        bs = len(reqs) if reqs is not None else 0
        st.verify_rounds += 1
        if st.chain_share > 0 and st.coin.random() < st.chain_share:
            result, seconds = st.backend.chain_round(self, batch, forward)
            st.chain_rounds += 1
            if seconds is not None:
                st.acct.add_cost("chain", bs or _rows_of(result), seconds)
            return result
        rnd = st.backend.tree_round(self, batch, st.build, **kwargs)     # on_publish: the overlap scheduler's
        st.account(rnd, reqs, len(rnd.trees))
        return rnd.result


def _rows_of(result: Any) -> int:
    lens = getattr(result, "accept_lens", None)
    return int(lens.shape[0]) if lens is not None and hasattr(lens, "shape") else 1
