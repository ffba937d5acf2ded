"""The draft's per-position top-K for the shadow, taken where DFlash already computes the logits.

DFlash folds its greedy draft head into the draft model's CUDA graph (`_DflashDraftSampler`:
one matmul against the target's LM head, an argmax into `out`, run by a capture tail hook).
`fold_topk` replaces that sampler with `FoldedTopK`, which does the same matmul and the same
argmax into the same `out` (the chain DFlash commits is unchanged), and also writes the top-K
tokens and quantised log-probs of every draft position into fixed buffers. The selection is the
engine's fused Triton top-K (`tree_kernels.topk_rows`, the kernels `engine verify` and the tree
build use) where Triton runs; its first call, which compiles it, is the first warm-up of SGLang's
graph capture, before any request. A torch fallback (`tree.topk_of_logprobs` over
`torch.log_softmax`) runs where Triton is missing or failed at warm-up: the same order (log-prob
descending, id ascending), the same quantisation.

Where DFlash declines to fold its head (its `_eager(...)` reasons: the env switch, a quantised
or sharded head, no graphs), the head runs eagerly and `eager_topk` takes the top-K there, on
sampled rounds only, with torch: nothing compiles inside a running server.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("ddtree_ops.engine.sglang")

# DFlash's sampler, as both supported releases define it (dflash_worker_v2._DflashDraftSampler)
SAMPLER_CLASS = "_DflashDraftSampler"
SAMPLER_FIELDS = ("weight", "block_size", "num_org", "org_vocab_start", "out")


def select_topk(logits: Any, k: int, counters: Any = None, triton: bool = False) -> tuple[Any, Any]:
    """Top-k tokens and quantised log-probs of each row of logits [n, V], canonical order."""
    if triton:
        # triton: only where the fused kernel runs (a GPU server), never on the control machine
        from ddtree_ops.engine import tree_kernels

        return tree_kernels.topk_rows(logits, k, counters)
    # torch: the plugin's modules import on a control machine (preflight's checks) without it
    import torch

    from ddtree_ops.engine.tree import topk_of_logprobs

    return topk_of_logprobs(torch.log_softmax(logits.float(), dim=-1), k)


def foldable(sampler: Any) -> str:
    """'' when `sampler` is DFlash's plain greedy head on one rank; else why the shadow cannot
    fold its top-K into it."""
    if sampler is None:
        return "DFlash keeps its draft head eager"
    if type(sampler).__name__ != SAMPLER_CLASS:
        return f"DFlash's draft sampler is {type(sampler).__name__}, not its greedy head"
    missing = [f for f in SAMPLER_FIELDS if not hasattr(sampler, f)]
    if missing:
        return f"DFlash's draft sampler has no {', '.join(missing)} in this release"
    if int(getattr(sampler, "tp_size", 1) or 1) != 1 or int(sampler.org_vocab_start):
        return "the LM head is sharded across tensor-parallel ranks"
    if not sampler.weight.dtype.is_floating_point:
        return "the LM head is quantised"
    return ""


class FoldedTopK:
    """DFlash's in-graph greedy head plus the top-K, one matmul. `out` is DFlash's own buffer;
    `tokens`/`scores` [max rows, K] hold the last replay's top-K (rows bs * (block - 1))."""

    def __init__(self, inner: Any, k: int, triton: bool) -> None:
        import torch

        self.inner = inner
        self.weight, self.block_size, self.num_org = inner.weight, int(inner.block_size), int(inner.num_org)
        self.out = inner.out
        self.k = max(1, min(int(k), self.num_org))
        rows = int(self.out.shape[0])
        device = self.weight.device
        self.tokens = torch.zeros((rows, self.k), dtype=torch.int64, device=device)
        self.scores = torch.zeros((rows, self.k), dtype=torch.int64, device=device)
        # the Triton kernels' atomic counters: zeros they leave zero, so a replay needs no memset
        self.counters = torch.zeros(3 * rows, dtype=torch.int32, device=device)
        self.triton = triton
        self.calls = 0
        self.path = "triton" if triton else "torch"

    def __getattr__(self, name: str) -> Any:
        # anything else a release reads off its sampler (stage_sampling_params...) is DFlash's
        return getattr(self.__dict__["inner"], name)

    def __call__(self, hidden_states: Any, input_ids: Any = None) -> None:
        import torch

        bs = hidden_states.shape[0] // self.block_size
        hs = hidden_states.view(bs, self.block_size, -1)[:, 1:, :].reshape(-1, hidden_states.shape[-1])
        if hs.dtype != self.weight.dtype:
            hs = hs.to(self.weight.dtype)
        n = hs.shape[0]
        logits = torch.matmul(hs, self.weight[: self.num_org].T)
        self.out[:n].copy_(torch.argmax(logits, dim=-1).to(torch.long))
        tok, sc = self._select(logits, n)
        self.tokens[:n].copy_(tok)
        self.scores[:n].copy_(sc)
        self.calls += 1

    def _select(self, logits: Any, n: int) -> tuple[Any, Any]:
        if self.triton:
            try:
                return select_topk(logits, self.k, self.counters[:3 * n], triton=True)
            except Exception as exc:   # a compile or launch failure, met at warm-up: torch from now on
                self.triton, self.path = False, "torch"
                logger.warning("DDTREE shadow: the Triton top-K failed at the draft graph's warm-up (%s: %s); "
                               "the torch top-K runs in the graph instead", type(exc).__name__, str(exc)[:200])
        return select_topk(logits, self.k)

    def round(self, rows: int) -> tuple[Any, Any]:
        """This round's top-K, read after the graph replayed: views of the fixed buffers."""
        return self.tokens[:rows], self.scores[:rows]


def fold_topk(sampler: Any, budget: int) -> tuple[Any, str]:
    """(FoldedTopK around DFlash's sampler, "") or (None, why not)."""
    why = foldable(sampler)
    if why:
        return None, why
    # torch (engine.tree): only inside a server that builds the sampler
    from ddtree_ops.engine.tree import fused_available

    triton = fused_available(sampler.weight.device)
    if sampler.weight.is_cuda and not triton:
        logger.warning("DDTREE shadow: Triton cannot be imported; the torch top-K runs in the draft graph")
    return FoldedTopK(sampler, budget, triton=triton), ""


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


def eager_topk(hidden_states: Any, rows: Any, k: int, chunk_size: int = 256) -> tuple[Any, Any]:
    """Per-position top-k through the dense LM head rows, on the eager path (sampled rounds only),
    in chunks of rows as DFlash's own eager head. The torch selection: nothing compiles inside a
    running server."""
    import torch

    toks, scores = [], []
    for start in range(0, int(hidden_states.shape[0]), chunk_size):
        hs = hidden_states[start:start + chunk_size]
        t, s = select_topk(torch.matmul(hs.to(rows.dtype), rows.T), k)
        toks.append(t)
        scores.append(s)
    return torch.cat(toks), torch.cat(scores)
