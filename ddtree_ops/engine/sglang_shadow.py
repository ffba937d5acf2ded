"""Shadow accounting hooks for SGLang's DFlash V2 worker, free of SGLang imports.

Three methods of `DFlashWorkerV2` are wrapped; each calls the original, so what DFlash commits is
unchanged:

- `_maybe_build_draft_sampler`: while shadowing, keep the draft head eager (no in-graph argmax
  sampler), so the draft's hidden states reach the next method.
- `_greedy_sample_from_vocab_parallel_head(hidden_states=, lm_head=)`: on a sampled round, also
  take the per-position top-K log-probs from the same head (the draft's distributions).
- `forward_batch_generation(batch, ...)`: after DFlash's verify, read the round's result (the
  verified block from `_draft_block_tokens_buf`, the committed lengths and the bonus from the
  returned GenerationBatchResult) and queue it with the stashed top-K for the accounting.

The third hook is the one point both checked releases share: 0.5.17 accepts inline inside
forward_batch_generation and has no `_accept_block` (wrapping that, as the plugin once did,
accounted nothing on 0.5.17), 0.5.23 accepts in `_accept_block`; both return the same result.

Off the critical path: a round's tensors are copied to pinned host buffers without blocking and
an event is recorded; the accounting of that round runs at a later call, once its event has
completed, so the scheduler never waits on the GPU for the shadow. After DDTREE_SHADOW_WARN_AFTER
verify rounds with nothing accounted the worker says so, once, with the reason it knows.
"""

from __future__ import annotations

import logging
import os
import random
from collections import deque
from typing import Any

logger = logging.getLogger("ddtree_ops.engine.sglang")

SILENT = "DDTREE shadow: no round accounted in %d verify rounds (%s); shadow accounting is not running"
REGISTERED = "DDTREE registered as DFlash-family, hidden capture layers %s"
NO_CAPTURE = ("DDTREE worker started without target hidden capture (SGLang resolved no dflash_target_layer_ids): "
              "DDTREE did not answer as DFlash-family; the server fails at the first request")


class _Pending:
    """One sampled round on its way to the host."""

    __slots__ = ("event", "tokens", "scores", "candidates", "commit", "bonus", "buffers")

    def __init__(self, event: Any, tokens: Any, scores: Any, candidates: Any, commit: Any, bonus: Any,
                 buffers: Any) -> None:
        self.event, self.tokens, self.scores = event, tokens, scores
        self.candidates, self.commit, self.bonus, self.buffers = candidates, commit, bonus, buffers

    def ready(self) -> bool:
        return self.event is None or bool(self.event.query())


class _HostBuffers:
    """Pinned host tensors, reused by shape: allocating pinned memory every round costs more than
    the copy it serves."""

    def __init__(self) -> None:
        self.free: dict[tuple[Any, ...], list[Any]] = {}

    def take(self, like: Any) -> Any:
        import torch

        key = (tuple(like.shape), like.dtype)
        pool = self.free.get(key)
        if pool:
            return pool.pop()
        return torch.empty(like.shape, dtype=like.dtype, pin_memory=like.is_cuda)

    def give(self, tensors: list[Any]) -> None:
        for t in tensors:
            self.free.setdefault((tuple(t.shape), t.dtype), []).append(t)


class _ShadowState:
    def __init__(self, worker: Any) -> None:
        from ddtree_ops.engine.sglang_settings import read_settings
        from ddtree_ops.engine.shadow import OnlineShadow

        settings, problems = read_settings()
        self.problem = ""
        if problems:             # the validator refused these at launch; be safe if it was bypassed
            self.problem = "; ".join(problems)
            logger.warning("DDTREE shadow: %s; shadow accounting off", self.problem)
        block = int(getattr(worker, "block_size", 16) or 16)
        self.horizon = block - 1
        self.budget = settings.budget or self.horizon
        self.share = 0.0 if problems else settings.share
        self.warn_after = settings.warn_after
        self.trace_left = settings.trace
        self.coin = random.Random(0)
        self.stash: tuple[Any, Any] | None = None
        self.pending: deque[_Pending] = deque()
        self.buffers = _HostBuffers()
        self.verify_rounds = 0         # decode rounds DFlash verified
        self.head_calls = 0            # rounds whose draft head ran eagerly (where we read it)
        self.stashed = 0               # rounds whose top-K was taken
        self.accounted = 0             # rows handed to the accounting
        self.off_reason = ""           # set when a hook decided it cannot account
        self.warned: set[str] = set()
        self.announced = False
        self.metrics = _Metrics(self.horizon)
        self.acct = OnlineShadow(self.budget, self.horizon, report_every=settings.report_every,
                                 on_report=self._report, cost_ratio=settings.cost_ratio)

    @property
    def on(self) -> bool:
        return self.share > 0.0 and self.horizon >= 1

    def trace(self, message: str, *args: Any) -> None:
        """DDTREE_SHADOW_TRACE: the hooks' decisions for the first verify rounds, at INFO."""
        if self.trace_left > 0:
            logger.info("DDTREE shadow trace: " + message, *args)

    def once(self, key: str, message: str, *args: Any) -> None:
        if key not in self.warned:
            self.warned.add(key)
            logger.warning(message, *args)

    def _report(self, rep: Any) -> None:
        from ddtree_ops.engine.shadow import format_report

        logger.info(format_report(rep))
        self.metrics.publish(rep)

    # -------------------------------------------------------------- the round's way to the host

    def enqueue(self, tokens: Any, scores: Any, candidates: Any, commit: Any, bonus: Any) -> None:
        """Start the copies of one round; nothing here waits for the GPU."""
        import torch

        src = (tokens, scores, candidates, commit, bonus)
        host = [self.buffers.take(t) for t in src]
        for dst, s in zip(host, src):
            dst.copy_(s, non_blocking=dst.is_pinned())
        event = None
        if tokens.is_cuda:
            event = torch.cuda.Event()
            event.record()
        self.pending.append(_Pending(event, *host, buffers=host))

    def drain(self, wait: bool = False) -> None:
        """Account every queued round whose copies have landed (all of them when `wait`)."""
        while self.pending and (wait or self.pending[0].ready()):
            p = self.pending.popleft()
            if p.event is not None and wait:
                p.event.synchronize()
            bs, width = int(p.candidates.shape[0]), int(p.candidates.shape[1])
            k = int(p.tokens.shape[-1])
            accepted = [c - 1 for c in p.commit.tolist()]
            self.acct.observe(p.tokens.view(bs, width - 1, k).tolist(), p.scores.view(bs, width - 1, k).tolist(),
                              p.candidates.tolist(), accepted, p.bonus.view(-1).tolist())
            if not self.accounted:
                logger.info("DDTREE shadow: accounting running (first round: %d row(s), %d verify rounds so far)",
                            bs, self.verify_rounds)
            self.accounted += bs
            self.buffers.give(p.buffers)

    def silence_reason(self) -> str:
        if self.problem:
            return self.problem
        if self.share <= 0.0:
            return "DDTREE_SHADOW_SHARE is 0"
        if self.off_reason:
            return self.off_reason
        if self.head_calls == 0:
            return ("the draft head never ran where the plugin reads it (an in-graph draft sampler, or an sglang "
                    "whose DFlash worker has no _greedy_sample_from_vocab_parallel_head on this path)")
        if self.stashed and not self.accounted:
            return "draft distributions were taken but no verify result reached the accounting"
        return "no sampled round yet"

    def after_round(self) -> None:
        self.verify_rounds += 1
        if self.verify_rounds % 64 == 1:        # liveness on /metrics between reports
            self.metrics.progress(self.verify_rounds)
        if not self.accounted and self.verify_rounds >= self.warn_after and "silent" not in self.warned:
            reason = self.silence_reason()
            self.once("silent", SILENT, self.verify_rounds, reason)
            self.metrics.silent(self.verify_rounds, reason)


class _Metrics:
    """Prometheus gauges, if prometheus_client is importable (SGLang depends on it). One set per
    process: SGLang's /metrics reads every scheduler's through its multiprocess directory."""

    _shared: dict[str, Any] | None = None

    def __init__(self, horizon: int) -> None:
        if _Metrics._shared is None:
            _Metrics._shared = self._create()
        self.gauges = _Metrics._shared

    @staticmethod
    def _create() -> dict[str, Any]:
        try:
            from prometheus_client import Gauge
        except ImportError:
            return {}
        mode = {"multiprocess_mode": "mostrecent"} if os.environ.get("PROMETHEUS_MULTIPROC_DIR") else {}
        gauges: dict[str, Any] = {}
        try:
            for name, doc in (("rounds", "verify rounds accounted"),
                              ("tau_chain", "tokens per round committed by the DFlash chain"),
                              ("tau_tree_lower", "lower bound on the DDTree tree's tokens per round"),
                              ("promote", "1 promote the tree, 0 inconclusive, -1 keep the chain"),
                              ("verify_rounds", "verify rounds DFlash ran")):
                gauges[name] = Gauge(f"ddtree_shadow_{name}", doc, **mode)
            gauges["sibling_hits"] = Gauge("ddtree_shadow_sibling_hits",
                                           "rounds whose tree path took a sibling at this depth", ["depth"], **mode)
            # what `smoke` reads: 1 once the worker has said that nothing is being accounted
            gauges["silent"] = Gauge("ddtree_shadow_silent", "1: verify rounds ran and none was accounted",
                                     ["reason"], **mode)
        except ValueError:      # registered by someone else in this process
            return {}
        return gauges

    def progress(self, verify_rounds: int) -> None:
        if self.gauges:
            self.gauges["verify_rounds"].set(verify_rounds)

    def silent(self, verify_rounds: int, reason: str) -> None:
        if self.gauges:
            self.gauges["silent"].labels(reason=reason[:120]).set(1)
            self.gauges["verify_rounds"].set(verify_rounds)

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
    if not weight.dtype.is_floating_point:
        return None
    shard = getattr(lm_head, "shard_indices", None)
    rows = int(vocab or weight.shape[0])
    if shard is not None:
        if int(getattr(shard, "org_vocab_start_index", 0)) != 0 or int(getattr(shard, "num_org_elements", 0)) < rows:
            return None                   # tensor-parallel shard: this rank sees part of the vocabulary
    return weight[:rows]


def _runner(worker: Any) -> Any:
    """The target's model runner: an attribute in 0.5.17, reached through DFlash's delegation to
    the target worker elsewhere; None while the constructor has not set it up yet."""
    try:
        return getattr(worker, "model_runner", None)
    except Exception:           # DFlashWorkerV2.__getattr__ before _target_worker exists
        return None


def capture_layers(worker: Any) -> Any:
    """The target layers whose hidden states SGLang captures for the draft (None if not set up)."""
    aux = getattr(_runner(worker), "spec_aux_config", None)
    return getattr(aux, "dflash_target_layer_ids", None)


class ShadowWorkerMixin:
    """Mix in before `DFlashWorkerV2`. See the module docstring."""

    def _ddtree(self) -> _ShadowState:
        state = self.__dict__.get("_ddtree_state")
        if state is None:
            state = _ShadowState(self)
            self.__dict__["_ddtree_state"] = state
            logger.info("DDTREE shadow: budget %d, horizon %d, share %.3f", state.budget, state.horizon, state.share)
        if not state.announced and _runner(self) is not None:
            state.announced = True
            layers = capture_layers(self)
            if layers:
                logger.info(REGISTERED, list(layers))
            else:
                logger.warning(NO_CAPTURE)
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
        st.head_calls += 1
        st.stash = None
        if not st.on or st.coin.random() >= st.share:
            st.trace("head call %d: not sampled (share %.3f)", st.head_calls, st.share)
            return out
        vocab = getattr(getattr(_runner(self), "model_config", None), "vocab_size", None)
        rows = head_rows(lm_head, vocab)
        if rows is None:
            st.off_reason = "the LM head is sharded across tensor-parallel ranks or quantised"
            st.once("head", "DDTREE shadow: %s; shadow accounting off", st.off_reason)
            return out
        st.stash = draft_head_topk(hidden_states, rows, min(st.budget, int(rows.shape[0])), chunk_size)
        st.stashed += 1
        st.trace("head call %d: top-%d of %d rows stashed", st.head_calls, int(st.stash[0].shape[-1]),
                 int(hidden_states.shape[0]))
        return out

    def forward_batch_generation(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        st = self._ddtree()
        if st.pending:
            st.drain()
        # decided before DFlash runs: real 0.5.17 hands the batch back in TARGET_VERIFY mode, which
        # ForwardMode.is_extend() counts as an extend (read afterwards, every round looked like a
        # prefill and nothing was accounted: the second real run's trace)
        verify = _is_verify_round(batch)
        result = super().forward_batch_generation(batch, *args, **kwargs)  # type: ignore[misc]
        stash, st.stash = st.stash, None
        commit = getattr(result, "accept_lens", None)
        bonus = getattr(getattr(result, "next_draft_input", None), "bonus_tokens", None)
        block = self.__dict__.get("_draft_block_tokens_buf")
        if st.trace_left > 0 and verify:
            st.trace("verify round %d: mode %s, stash %s, accept_lens %s, bonus %s, block %s, pending %d, "
                     "accounted %d", st.verify_rounds + 1, getattr(getattr(batch, "forward_mode", None), "name", "?"),
                     "yes" if stash is not None else "no", _shape(commit), _shape(bonus), _shape(block),
                     len(st.pending), st.accounted)
            st.trace_left -= 1
        elif st.trace_left > 0:
            st.trace("call: mode %s, extend_in_batch %s: not a verify round",
                     getattr(getattr(batch, "forward_mode", None), "name", "?"), getattr(batch, "is_extend_in_batch", "?"))
            st.trace_left -= 1
        if not verify:
            return result
        st.after_round()
        if stash is None:
            return result
        tokens, scores = stash
        if commit is None or bonus is None or block is None:
            st.off_reason = ("this sglang's DFlash worker returns no accept_lens / next_draft_input.bonus_tokens "
                             "or keeps no _draft_block_tokens_buf")
            st.once("result", "DDTREE shadow: %s; shadow accounting off", st.off_reason)
            st.share = 0.0
            return result
        bs = int(commit.shape[0])
        candidates = block[:bs]
        width = int(candidates.shape[1])
        if tokens.shape[0] != bs * (width - 1):
            st.once("shape", "DDTREE shadow: draft rows %d do not match the verified block %dx%d; round skipped",
                    tokens.shape[0], bs, width)
            return result
        st.enqueue(tokens, scores, candidates, commit, bonus)
        return result


def _shape(t: Any) -> str:
    return "None" if t is None else str(tuple(getattr(t, "shape", ())) or type(t).__name__)


def _is_verify_round(batch: Any) -> bool:
    mode = getattr(batch, "forward_mode", None)
    if mode is None:
        return False
    target_verify = getattr(mode, "is_target_verify", None)
    if target_verify is not None and target_verify():
        return True
    if mode.is_extend() or getattr(batch, "is_extend_in_batch", False) or mode.is_idle():
        return False
    return True


def draft_head_topk(hidden_states: Any, rows: Any, k: int, chunk_size: int = 256) -> tuple[Any, Any]:
    """Per-position top-k of the draft's distributions through the (dense) LM head rows. A plain
    fp32 log-softmax, not the engine's Triton statistics kernel: nothing compiles inside a
    running server."""
    import torch

    from ddtree_ops.engine.tree import topk_of_logprobs

    toks, scores = [], []
    for start in range(0, int(hidden_states.shape[0]), chunk_size):
        hs = hidden_states[start:start + chunk_size]
        logits = torch.matmul(hs.to(rows.dtype), rows.T)
        t, s = topk_of_logprobs(torch.log_softmax(logits.float(), dim=-1), k)
        toks.append(t)
        scores.append(s)
    return torch.cat(toks), torch.cat(scores)
