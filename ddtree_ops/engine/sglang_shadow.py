"""Shadow accounting hooks for SGLang's DFlash V2 worker (sglang 0.5.23), free of SGLang imports.

Three methods of `DFlashWorkerV2` are wrapped; each calls the original first, so what DFlash
commits is unchanged:

- `_maybe_build_draft_sampler`: while shadowing, keep the draft head eager (no in-graph argmax
  sampler) so the draft's hidden states reach the method below.
- `_greedy_sample_from_vocab_parallel_head(hidden_states=, lm_head=)`: on a sampled round, also
  take the per-position top-K log-probs from the same head (the draft's distributions).
- `_accept_block(candidates=, ...)`: after DFlash's accept, feed the round (verified block,
  accepted length, bonus) with the stashed top-K to the engine's `OnlineShadow`.

The state is created lazily because the DFlash constructor itself calls the first hook.
Figures go to the log every DDTREE_SHADOW_REPORT_EVERY rounds and to Prometheus gauges.
"""

from __future__ import annotations

import logging
import os
import random
from typing import Any

logger = logging.getLogger("ddtree_ops.engine.sglang")


class _ShadowState:
    def __init__(self, worker: Any) -> None:
        from ddtree_ops.engine.sglang_plugin import read_settings
        from ddtree_ops.engine.shadow import OnlineShadow

        settings, problems = read_settings()
        if problems:             # the validator refused these at launch; be safe if it was bypassed
            logger.warning("DDTREE shadow: %s; shadow accounting off", "; ".join(problems))
            settings = None
        self.settings = settings
        block = int(getattr(worker, "block_size", 16) or 16)
        self.horizon = block - 1
        self.budget = (settings.budget if settings and settings.budget else self.horizon)
        self.share = settings.share if settings else 0.0
        self.coin = random.Random(0)
        self.stash: tuple[Any, Any] | None = None
        self.warned: set[str] = set()
        self.metrics = _Metrics(self.horizon)
        self.acct = OnlineShadow(self.budget, self.horizon,
                                 report_every=settings.report_every if settings else 200,
                                 on_report=self._report, cost_ratio=settings.cost_ratio if settings else None)

    @property
    def on(self) -> bool:
        return self.share > 0.0 and self.horizon >= 1

    def once(self, key: str, message: str, *args: Any) -> None:
        if key not in self.warned:
            self.warned.add(key)
            logger.warning(message, *args)

    def _report(self, rep: Any) -> None:
        from ddtree_ops.engine.shadow import format_report

        logger.info(format_report(rep))
        self.metrics.publish(rep)


class _Metrics:
    """Prometheus gauges, if prometheus_client is importable (SGLang depends on it)."""

    def __init__(self, horizon: int) -> None:
        self.gauges: dict[str, Any] = {}
        try:
            from prometheus_client import Gauge
        except ImportError:
            return
        mode = {"multiprocess_mode": "mostrecent"} if os.environ.get("PROMETHEUS_MULTIPROC_DIR") else {}
        try:
            for name, doc in (("rounds", "verify rounds accounted"),
                              ("tau_chain", "tokens per round committed by the DFlash chain"),
                              ("tau_tree_lower", "lower bound on the DDTree tree's tokens per round"),
                              ("promote", "1 promote the tree, 0 inconclusive, -1 keep the chain")):
                self.gauges[name] = Gauge(f"ddtree_shadow_{name}", doc, **mode)
            self.gauges["sibling_hits"] = Gauge("ddtree_shadow_sibling_hits",
                                                "rounds whose tree path took a sibling at this depth",
                                                ["depth"], **mode)
        except ValueError:      # registered already in this process (a second worker)
            self.gauges = {}

    def publish(self, rep: Any) -> None:
        if not self.gauges:
            return
        self.gauges["rounds"].set(rep.rounds)
        self.gauges["tau_chain"].set(rep.tau_chain)
        self.gauges["tau_tree_lower"].set(rep.tau_tree_lower)
        self.gauges["promote"].set({"promote-tree": 1, "keep-chain": -1}.get(rep.recommendation, 0))
        for depth, hits in enumerate(rep.sibling_hits, start=1):
            self.gauges["sibling_hits"].labels(depth=str(depth)).set(hits)


def head_rows(lm_head: Any, vocab: int | None) -> Any:
    """The dense rows of the full vocabulary, or None when the head is sharded across ranks."""
    weight = getattr(lm_head, "weight", None)
    if weight is None or not hasattr(weight, "dim") or weight.dim() != 2:
        return None                       # quantised or missing head
    shard = getattr(lm_head, "shard_indices", None)
    rows = int(vocab or weight.shape[0])
    if shard is not None:
        if int(getattr(shard, "org_vocab_start_index", 0)) != 0 or int(getattr(shard, "num_org_elements", 0)) < rows:
            return None                   # tensor-parallel shard: this rank sees part of the vocabulary
    return weight[:rows]


class ShadowWorkerMixin:
    """Mix in before `DFlashWorkerV2`. See the module docstring."""

    def _ddtree(self) -> _ShadowState:
        state = self.__dict__.get("_ddtree_state")
        if state is None:
            state = _ShadowState(self)
            self.__dict__["_ddtree_state"] = state
            logger.info("DDTREE shadow: budget %d, horizon %d, share %.3f", state.budget, state.horizon, state.share)
        return state

    def _maybe_build_draft_sampler(self) -> Any:
        if self._ddtree().on:
            logger.info("DDTREE shadow: draft head kept eager to read the per-position distributions")
            return None
        return super()._maybe_build_draft_sampler()  # type: ignore[misc]

    def _greedy_sample_from_vocab_parallel_head(self, *, hidden_states: Any, lm_head: Any,
                                                chunk_size: int = 256) -> Any:
        out = super()._greedy_sample_from_vocab_parallel_head(  # type: ignore[misc]
            hidden_states=hidden_states, lm_head=lm_head, chunk_size=chunk_size)
        st = self._ddtree()
        st.stash = None
        if not st.on or st.coin.random() >= st.share:
            return out
        vocab = getattr(getattr(getattr(self, "model_runner", None), "model_config", None), "vocab_size", None)
        rows = head_rows(lm_head, vocab)
        if rows is None:
            st.once("head", "DDTREE shadow: the LM head is sharded or quantised; shadow accounting off")
            return out
        st.stash = draft_head_topk(hidden_states, rows, min(st.budget, int(rows.shape[0])), chunk_size)
        return out

    def _accept_block(self, **kwargs: Any) -> Any:
        result = super()._accept_block(**kwargs)  # type: ignore[misc]
        st = self._ddtree()
        stash, st.stash = st.stash, None
        if stash is None:
            return result
        accept_len, _commit, bonus = result[0], result[1], result[2]
        candidates = kwargs["candidates"]
        bs, width = int(candidates.shape[0]), int(candidates.shape[1])
        tokens, scores = stash
        if tokens.shape[0] != bs * (width - 1):
            st.once("shape", "DDTREE shadow: draft rows %d do not match the verified block %dx%d; round skipped",
                    tokens.shape[0], bs, width)
            return result
        k = tokens.shape[-1]
        st.acct.observe(tokens.view(bs, width - 1, k), scores.view(bs, width - 1, k), candidates, accept_len, bonus)
        return result


def draft_head_topk(hidden_states: Any, rows: Any, k: int, chunk_size: int = 256) -> tuple[Any, Any]:
    """Per-position top-k of the draft's distributions through the (dense) LM head rows."""
    import torch

    from ddtree_ops.engine.tree import topk_logprobs

    toks, scores = [], []
    for start in range(0, int(hidden_states.shape[0]), chunk_size):
        hs = hidden_states[start:start + chunk_size]
        logits = torch.matmul(hs.to(rows.dtype), rows.T)
        t, s = topk_logprobs(logits, k)
        toks.append(t)
        scores.append(s)
    return torch.cat(toks), torch.cat(scores)
