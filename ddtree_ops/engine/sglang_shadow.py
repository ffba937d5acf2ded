"""Shadow accounting hooks for SGLang's DFlash V2 worker, free of SGLang imports.

Three methods of `DFlashWorkerV2` are wrapped; each calls the original, so what DFlash commits is
unchanged:

- `_maybe_build_draft_sampler`: while shadowing, DFlash's in-graph greedy head is replaced by
  `sglang_topk.FoldedTopK`: the same matmul and argmax into the same buffer, plus the draft's
  per-position top-K into fixed buffers, inside the draft's CUDA graph (the engine's Triton
  top-K). Where DFlash keeps its head eager, that is kept, and the next hook takes the top-K.
- `_greedy_sample_from_vocab_parallel_head(hidden_states=, lm_head=)`: the eager head (no draft
  graph, or a batch the graph does not cover): on a sampled round, also take the top-K there.
- `forward_batch_generation(batch, ...)`: decide whether this verify round is sampled (before
  DFlash runs), then read the round's result (the verified block from `_draft_block_tokens_buf`,
  the committed lengths and the bonus from the returned GenerationBatchResult, the prefix
  lengths and requests from the batch) and send it to the host with the round's top-K.

The third hook is the one point both checked releases share: 0.5.17 accepts inline inside
forward_batch_generation and has no `_accept_block` (wrapping that, as the plugin once did,
accounted nothing on 0.5.17), 0.5.23 accepts in `_accept_block`; both return the same result.

Off the critical path: a sampled round is packed into one staging buffer on the device and
copied to a pooled pinned host buffer in one copy behind a pooled event (`sglang_transfer`); it
is accounted once the event has completed, at a later call (or on the accounting thread,
`sglang_account`), so the scheduler never waits on the GPU for the shadow. Greedy rounds' trees
wait there for the tokens that decide their exact acceptance (`sglang_horizon`). After
DDTREE_SHADOW_WARN_AFTER verify rounds with nothing accounted the worker says so, once, with the
reason it knows.
"""

from __future__ import annotations

import logging
import random
from typing import Any

from ddtree_ops.engine.sglang_account import InlineAccountant, RoundMeta, ThreadAccountant
from ddtree_ops.engine.sglang_horizon import row_requests
from ddtree_ops.engine.sglang_metrics import ShadowMetrics
from ddtree_ops.engine.sglang_settings import cost_ratio, read_settings
from ddtree_ops.engine.sglang_topk import eager_topk, fold_topk, head_rows
from ddtree_ops.engine.sglang_transfer import RoundTransfer
from ddtree_ops.engine.shadow import OnlineShadow, format_report
from ddtree_ops.treestats import FROM_MEASURED

logger = logging.getLogger("ddtree_ops.engine.sglang")

SILENT = "DDTREE shadow: no round accounted in %d verify rounds (%s); shadow accounting is not running"
REGISTERED = "DDTREE registered as DFlash-family, hidden capture layers %s"
NO_CAPTURE = ("DDTREE worker started without target hidden capture (SGLang resolved no dflash_target_layer_ids): "
              "DDTREE did not answer as DFlash-family; the server fails at the first request")
PATH_GRAPH = ("DDTREE shadow: top-%d taken inside the draft's CUDA graph with DFlash's head, copied out on "
              "sampled rounds")
PATH_EAGER = "DDTREE shadow: top-K taken on the eager draft head on sampled rounds (%s)"


class _ShadowState:
    def __init__(self, worker: Any) -> None:
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
        self.sample_now = False        # this verify round is sampled (decided before DFlash runs)
        self.stash: tuple[Any, Any] | None = None
        self.folded: Any = None        # FoldedTopK: the top-K inside DFlash's draft graph
        self.path = ""                 # which path takes the top-K, said once
        self.verify_rounds = 0         # decode rounds DFlash verified
        self.head_calls = 0            # rounds whose draft head ran eagerly
        self.sent = 0                  # sampled rounds sent to the host
        self.off_reason = ""           # set when a hook decided it cannot account
        self.warned: set[str] = set()
        self.announced = False
        self.metrics = ShadowMetrics()
        self.ratio, self.cost_source = cost_ratio(settings, self.budget, block)
        self.acct = OnlineShadow(self.budget, self.horizon, report_every=settings.report_every,
                                 on_report=self._report, cost_ratio=self.ratio, cost_source=self.cost_source)
        self.metrics.cost_ratio(self.cost_source, self.ratio)
        self.transfer = RoundTransfer()
        kind = ThreadAccountant if settings.account_thread else InlineAccountant
        self.accountant = kind(self.acct, self.transfer, self.horizon, settings.max_pending)

    @property
    def on(self) -> bool:
        return self.share > 0.0 and self.horizon >= 1

    @property
    def accounted(self) -> int:
        return self.accountant.rows

    def trace(self, message: str, *args: Any) -> None:
        """DDTREE_SHADOW_TRACE: the hooks' decisions for the first verify rounds, at INFO."""
        if self.trace_left > 0:
            logger.info("DDTREE shadow trace: " + message, *args)

    def once(self, key: str, message: str, *args: Any) -> None:
        if key not in self.warned:
            self.warned.add(key)
            logger.warning(message, *args)

    def say_path(self, path: str, message: str, *args: Any) -> None:
        """Which path takes the top-K: said once per process, at INFO (a fact, not a problem)."""
        if not self.path:
            self.path = path
            logger.info(message, *args)

    def _report(self, rep: Any) -> None:
        logger.info(format_report(rep))
        self.metrics.publish(rep, self.acct.counters())
        if rep.cost_source == FROM_MEASURED and rep.cost_ratio is not None:
            self.metrics.cost_ratio(FROM_MEASURED, rep.cost_ratio)

    def send(self, tokens: Any, scores: Any, candidates: Any, commit: Any, bonus: Any, prefix: Any,
             reqs: Any, bs: int, width: int) -> None:
        """One sampled round to the host: one pack, one copy, one event; nothing waits."""
        known = prefix is not None and int(prefix.shape[0]) >= bs
        rows, greedy = row_requests(reqs if known else None, bs)
        parts = [tokens, scores, candidates, commit, bonus, prefix[:bs] if known else commit * 0]
        meta = RoundMeta(bs, width, int(tokens.shape[-1]), rows, greedy, self.verify_rounds)
        self.accountant.submit(self.transfer.send(parts, meta))
        self.sent += 1

    def drain(self, wait: bool = False) -> None:
        """Account every sampled round whose copy has landed (all of them when `wait`)."""
        self.accountant.poll(wait)

    def silence_reason(self) -> str:
        if self.problem:
            return self.problem
        if self.share <= 0.0:
            return "DDTREE_SHADOW_SHARE is 0"
        if self.off_reason:
            return self.off_reason
        if self.folded is None and self.head_calls == 0:
            return ("the draft head never ran where the plugin reads it (no top-K in the draft graph and no eager "
                    "head call on this path)")
        if self.sent and not self.accounted:
            return "draft distributions were taken but no verify result reached the accounting"
        return "no sampled round yet"

    def after_round(self) -> None:
        self.verify_rounds += 1
        if self.verify_rounds % 64 == 1:        # liveness on /metrics between reports
            self.metrics.progress(self.verify_rounds)
        if not self.accounted and self.verify_rounds >= self.warn_after and "silent" not in self.warned:
            reason = self.silence_reason()
            self.once("silent", SILENT, self.verify_rounds, reason)
            self.acct.silent = reason
            self.metrics.silent(self.verify_rounds, reason)


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
            logger.info("DDTREE shadow: budget %d, horizon %d, share %.3f, cost ratio %.3f (%s)", state.budget,
                        state.horizon, state.share, state.ratio, state.cost_source)
        if not state.announced and _runner(self) is not None:
            state.announced = True
            layers = capture_layers(self)
            if layers:
                logger.info(REGISTERED, list(layers))
            else:
                logger.warning(NO_CAPTURE)
        return state

    def _maybe_build_draft_sampler(self) -> Any:
        sampler = super()._maybe_build_draft_sampler()  # type: ignore[misc]
        st = self._ddtree()
        if not st.on:
            return sampler
        folded, why = fold_topk(sampler, st.budget)
        if folded is None:
            st.say_path("eager", PATH_EAGER, why)
            return sampler
        st.folded = folded
        st.say_path("graph", PATH_GRAPH, folded.k)
        return folded

    def _greedy_sample_from_vocab_parallel_head(self, *, hidden_states: Any, lm_head: Any,
                                                chunk_size: int = 256) -> Any:
        out = super()._greedy_sample_from_vocab_parallel_head(  # type: ignore[misc]
            hidden_states=hidden_states, lm_head=lm_head, chunk_size=chunk_size)
        st = self._ddtree()
        st.head_calls += 1
        if not st.sample_now:
            st.trace("head call %d: not sampled (share %.3f)", st.head_calls, st.share)
            return out
        vocab = getattr(getattr(_runner(self), "model_config", None), "vocab_size", None)
        rows = head_rows(lm_head, vocab)
        if rows is None:
            st.off_reason = "the LM head is sharded across tensor-parallel ranks or quantised"
            st.once("head", "DDTREE shadow: %s; shadow accounting off", st.off_reason)
            st.share = 0.0
            return out
        if st.folded is None:
            st.say_path("eager", PATH_EAGER, "no draft CUDA graph")
        st.stash = eager_topk(hidden_states, rows, min(st.budget, int(rows.shape[0])), chunk_size)
        st.trace("head call %d: top-%d of %d rows stashed", st.head_calls, int(st.stash[0].shape[-1]),
                 int(hidden_states.shape[0]))
        return out

    def forward_batch_generation(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        st = self._ddtree()
        if st.accountant.in_flight():
            st.drain()
        # decided before DFlash runs: real 0.5.17 hands the batch back in TARGET_VERIFY mode, which
        # ForwardMode.is_extend() counts as an extend (read afterwards, every round looked like a
        # prefill and nothing was accounted: the second real run's trace)
        verify = _is_verify_round(batch)
        st.sample_now = verify and st.on and st.coin.random() < st.share
        st.stash = None
        reqs, prefix = getattr(batch, "reqs", None), getattr(batch, "seq_lens", None)
        result = super().forward_batch_generation(batch, *args, **kwargs)  # type: ignore[misc]
        stash, st.stash = st.stash, None
        commit = getattr(result, "accept_lens", None)
        bonus = getattr(getattr(result, "next_draft_input", None), "bonus_tokens", None)
        block = self.__dict__.get("_draft_block_tokens_buf")
        if st.trace_left > 0:
            mode = getattr(getattr(batch, "forward_mode", None), "name", "?")
            if verify:
                st.trace("verify round %d: mode %s, sampled %s, top-K %s, accept_lens %s, bonus %s, block %s, "
                         "in flight %d, accounted %d", st.verify_rounds + 1, mode, st.sample_now,
                         "eager" if stash is not None else "graph" if st.folded is not None else "none",
                         _shape(commit), _shape(bonus), _shape(block), st.accountant.in_flight(), st.accounted)
            else:
                st.trace("call: mode %s, extend_in_batch %s: not a verify round", mode,
                         getattr(batch, "is_extend_in_batch", "?"))
            st.trace_left -= 1
        if not verify:
            return result
        st.after_round()
        if not st.sample_now:
            return result
        if commit is None or bonus is None or block is None:
            st.off_reason = ("this sglang's DFlash worker returns no accept_lens / next_draft_input.bonus_tokens "
                             "or keeps no _draft_block_tokens_buf")
            st.once("result", "DDTREE shadow: %s; shadow accounting off", st.off_reason)
            st.share = 0.0
            return result
        bs = int(commit.shape[0])
        candidates = block[:bs]
        width = int(candidates.shape[1])
        if stash is None and st.folded is not None:
            stash = st.folded.round(bs * (width - 1))      # the graph's replay wrote this round's top-K
        if stash is None:
            return result
        tokens, scores = stash
        if tokens.shape[0] != bs * (width - 1):
            st.once("shape", "DDTREE shadow: draft rows %d do not match the verified block %dx%d; round skipped",
                    tokens.shape[0], bs, width)
            return result
        st.send(tokens, scores, candidates, commit, bonus, prefix, reqs, bs, width)
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
