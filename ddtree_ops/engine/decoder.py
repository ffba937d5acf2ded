"""A reference decoder on a Hugging Face causal LM: ar, chain (DFlash-linear), tree (DDTree), shadow.

Batch size 1, DynamicCache, the engine's own tree/verify code. Chain and tree differ only in the
tree handed to `verify`; shadow commits exactly what chain commits and verifies the tree beside
it on a share of rounds, dropping that forward's KV block afterwards.

Round bookkeeping: the root of a round is the last committed token, chosen but not yet in the
target's KV (position = KV length). A round's tokens are the accepted path, root included,
which is the tau convention of the reference (the bonus of this round is the next round's root).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ddtree_ops.engine.drafters import Drafter
from ddtree_ops.engine.shadow import RoundRecord, ShadowLedger, spine_lower_bound
from ddtree_ops.engine.tree import (
    Tree,
    budget_topk,
    build_chain,
    build_tree_heap,
    build_tree_vectorized,
    draft_topk,
)
from ddtree_ops.engine.verify import (
    SamplingParams,
    Sampler,
    VerifyResult,
    forward,
    kv_length,
    target_choices,
    top_gap,
    verify,
)

MODES = ("ar", "chain", "tree", "shadow")


@dataclass
class DecodeResult:
    mode: str
    tokens: list[int]
    round_tokens: list[int] = field(default_factory=list)     # per verify round, bonus included
    gaps: list[float] = field(default_factory=list)           # ar: top1-top2 logit gap per token
    elapsed_s: float = 0.0
    target_forwards: int = 0                                  # after prefill, shadow's extra ones included
    compactions: int = 0
    ledger: ShadowLedger | None = None

    @property
    def rounds(self) -> int:
        return len(self.round_tokens)

    @property
    def tau(self) -> float | None:
        return sum(self.round_tokens) / len(self.round_tokens) if self.round_tokens else None


class Decoder:
    def __init__(self, model: Any, drafter: Drafter | None = None, *, budget: int = 16,
                 sampling: SamplingParams | None = None, sampler: Sampler | None = None,
                 builder: str = "heap", shadow_share: float = 1.0, shadow_seed: int = 0,
                 eos_token_id: int | None = None, hidden_layers: tuple[int, ...] = (),
                 spine: bool | None = None) -> None:
        self.model, self.drafter, self.budget = model, drafter, int(budget)
        self.spine = spine            # the spine tree, the plain one, or None: the default for B and L
        self.sampling = sampling or SamplingParams()
        self.sampling.validate()
        self.sampler = sampler
        if builder not in ("heap", "vector"):
            raise ValueError(f"builder must be 'heap' or 'vector', got {builder!r}")
        self.builder = builder
        if not 0.0 <= shadow_share <= 1.0:
            raise ValueError(f"shadow share must be in [0, 1], got {shadow_share}")
        self.shadow_share, self.shadow_seed = shadow_share, shadow_seed
        self.eos = eos_token_id
        # the target layers whose outputs a drafter reads (HF hidden_states indices), DFlash-style
        self.hidden_layers = tuple(hidden_layers or getattr(drafter, "hidden_layers", ()) or ())
        self.device = next(model.parameters()).device

    # -- pieces ------------------------------------------------------------------------------

    def _choose(self, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return target_choices(logits, self.sampling, positions.to(logits.device), self.sampler)

    def _build(self, draft_logits: torch.Tensor, root: int, chain: bool) -> Tree:
        if chain:                     # the same device as the tree: only the tree differs
            return build_chain(draft_topk(draft_logits.to(self.device), 1), root).to("cpu")
        top = draft_topk(draft_logits.to(self.device), budget_topk(self.budget, draft_logits.shape[-1]))
        build = build_tree_heap if self.builder == "heap" else build_tree_vectorized
        return build(top, self.budget, root, spine=self.spine).to("cpu")

    def _verify(self, tree: Tree, cache: Any, start: int, keep: bool) -> VerifyResult:
        return verify(self.model, cache, tree, start, self.sampling, self.sampler, keep=keep,
                      hidden_layers=self.hidden_layers)

    # -- decoding ----------------------------------------------------------------------------

    def generate(self, prompt: list[int], max_new_tokens: int, mode: str) -> DecodeResult:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if mode != "ar" and self.drafter is None:
            raise ValueError(f"mode {mode} needs a drafter")
        if not prompt:
            raise ValueError("empty prompt")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        with torch.inference_mode():
            t0 = time.perf_counter()
            result = self._ar(prompt, max_new_tokens) if mode == "ar" else self._speculative(prompt, max_new_tokens, mode)
            result.elapsed_s = time.perf_counter() - t0
        return result

    def _prefill(self, prompt: list[int]) -> tuple[int, Any, torch.Tensor | None, float]:
        logits, cache, hidden = forward(self.model, torch.tensor(prompt, dtype=torch.long),
                                        torch.arange(len(prompt)), None, hidden_layers=self.hidden_layers)
        first = int(self._choose(logits[-1:], torch.tensor([len(prompt) - 1]))[0])
        return first, cache, hidden, top_gap(logits[-1])

    def _done(self, out: list[int], limit: int) -> bool:
        return len(out) >= limit or (self.eos is not None and self.eos in out)

    def _finish(self, out: list[int], limit: int) -> list[int]:
        out = out[:limit]
        if self.eos is not None and self.eos in out:
            out = out[:out.index(self.eos) + 1]
        return out

    def _ar(self, prompt: list[int], limit: int) -> DecodeResult:
        tok, cache, _, gap = self._prefill(prompt)
        res = DecodeResult(mode="ar", tokens=[tok], gaps=[gap])
        while not self._done(res.tokens, limit):
            pos = torch.tensor([kv_length(cache)])
            logits, cache, _ = forward(self.model, torch.tensor([res.tokens[-1]]), pos, cache)
            res.tokens.append(int(self._choose(logits, pos)[0]))
            res.gaps.append(top_gap(logits[0]))
            res.target_forwards += 1
            res.round_tokens.append(1)
        res.tokens = self._finish(res.tokens, limit)
        return res

    def _speculative(self, prompt: list[int], limit: int, mode: str) -> DecodeResult:
        assert self.drafter is not None
        reset = getattr(self.drafter, "reset", None)
        if reset is not None:            # a drafter with per-sequence state (DFlash's context K/V)
            reset()
        root, cache, hidden, _ = self._prefill(prompt)
        feats = [hidden] if hidden is not None else []
        res = DecodeResult(mode=mode, tokens=[root])
        ledger = ShadowLedger(self.drafter.horizon) if mode == "shadow" else None
        coin = random.Random(self.shadow_seed)
        while not self._done(res.tokens, limit):
            start = kv_length(cache)
            t0 = time.perf_counter()
            draft_logits = self.drafter.draft(prompt + res.tokens, torch.cat(feats) if feats else None)
            draft_s = time.perf_counter() - t0
            shadow: dict[str, Any] = {}
            shadow_tree = None
            if ledger is not None:
                t1 = time.perf_counter()
                shadow_tree = self._build(draft_logits, root, chain=False)
                build_s = time.perf_counter() - t1
                if coin.random() < self.shadow_share:
                    probe = self._verify(shadow_tree, cache, start, keep=False)
                    cache = probe.cache
                    res.target_forwards += 1
                    shadow = dict(tree_tokens=len(probe.accepted), tree_verify_s=probe.seconds,
                                  tree_build_s=build_s, tree_nodes=shadow_tree.size,
                                  sibling_depths=[int(shadow_tree.depths[n]) for n in probe.accepted
                                                  if n and int(shadow_tree.ranks[n]) > 0])
            tree = self._build(draft_logits, root, chain=mode in ("chain", "shadow"))
            step = self._verify(tree, cache, start, keep=True)
            cache = step.cache
            res.target_forwards += 1
            res.compactions += int(step.compacted)
            if step.hidden is not None:
                feats.append(step.hidden)
            res.tokens.extend(step.tokens[1:] + [step.bonus])
            res.round_tokens.append(len(step.accepted))
            if ledger is not None and shadow_tree is not None:
                lower = spine_lower_bound(shadow_tree, tree.tokens.tolist(), len(step.accepted) - 1, step.bonus)
                ledger.add(RoundRecord(chain_tokens=len(step.accepted), chain_verify_s=step.seconds,
                                       chain_nodes=tree.size, tree_lower=lower, draft_s=draft_s, **shadow))
            root = step.bonus
        res.tokens = self._finish(res.tokens, limit)
        res.ledger = ledger
        return res
