"""Drafters: per-position draft logits for the next L positions after the root.

A drafter sees the committed context (the root, i.e. the bonus token not yet in the target's
KV, is its last element) and, if it asks for them, the target's hidden states at the layers it
names, for the committed tokens already in KV. It returns [L, V] logits, one row per depth. Like a
DFlash block drafter, the rows are marginals: the same depth-d row is used under every parent.

The trained drafter is `dflash.DFlashDrafter`: a DFlash draft made for its target
(`bench/pair/train.py`), run with SGLang's forward. Of the ones here, `NGramDrafter` is the real
one, for models no draft was trained for. It needs no training and costs no forward, which
matters for what it is used for: on CPU the decoder's tokens/s then reflect the verify economics rather than
a drafter's own cost. A self-speculative early-exit drafter (the target's first layers plus its
head) would cost L partial forwards per round and, untrained (no LayerSkip-style fine-tuning),
agrees poorly with the full model; prompt-lookup drafting has real acceptance on the repetitive
continuations small instruct models produce, and its votes over several earlier matches give a
genuine spread of candidates per depth, which is what a tree can exploit.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Protocol

import torch

# logit of a token no match voted for: far below any voted token but finite, so top-k over a
# depth with few votes still ranks the voted tokens first and the rest in token-id order
_UNVOTED = -30.0


class Drafter(Protocol):
    """A drafter may also define `hidden_layers` (the target `hidden_states` indices it reads,
    which the decoder then captures) and `reset()` (called before each sequence, for drafters
    that keep per-sequence state). The trained DFlash drafter is `dflash.DFlashDrafter`."""

    horizon: int                # L: draft positions per round (block size - 1)
    vocab_size: int
    needs_hidden: bool

    def draft(self, context: list[int], hidden: torch.Tensor | None) -> torch.Tensor:
        """[L, V] logits for the positions after `context[-1]`."""
        ...


class NGramDrafter:
    """Prompt-lookup drafting with votes: every earlier occurrence of the context's suffix
    (n-gram orders max_n down to min_n) votes for the tokens that followed it at each offset.
    Longer matches weigh more (weight = order ** 2) and later occurrences slightly more, so the
    rank-0 path is the most specific, most recent continuation and the siblings are the others."""

    needs_hidden = False

    def __init__(self, vocab_size: int, horizon: int = 15, max_n: int = 4, min_n: int = 1,
                 max_matches: int = 64) -> None:
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n} max_n={max_n}")
        self.vocab_size, self.horizon = int(vocab_size), int(horizon)
        self.max_n, self.min_n, self.max_matches = max_n, min_n, max_matches

    def votes(self, context: list[int]) -> list[dict[int, float]]:
        votes: list[dict[int, float]] = [defaultdict(float) for _ in range(self.horizon)]
        length = len(context)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            suffix = context[length - n:]
            found = 0
            # scan backwards: the most recent matches first, capped for long contexts
            for end in range(length - 2, n - 2, -1):
                if context[end - n + 1:end + 1] != suffix:
                    continue
                found += 1
                weight = n * n * (1.0 + 1.0 / found)
                for d in range(self.horizon):
                    j = end + 1 + d
                    if j >= length:
                        break
                    votes[d][context[j]] += weight
                if found >= self.max_matches:
                    break
        return votes

    def draft(self, context: list[int], hidden: torch.Tensor | None = None) -> torch.Tensor:
        logits = torch.full((self.horizon, self.vocab_size), _UNVOTED)
        for d, tally in enumerate(self.votes(context)):
            if not tally:
                continue
            total = sum(tally.values())
            ids = torch.tensor(list(tally.keys()), dtype=torch.long)
            mass = torch.tensor([v / total for v in tally.values()])
            logits[d, ids] = torch.log(mass)
        return logits


class RandomDrafter:
    """Seeded random logits: acceptance near zero on a real model; for tests and timing."""

    needs_hidden = False

    def __init__(self, vocab_size: int, horizon: int = 15, seed: int = 0, scale: float = 3.0) -> None:
        self.vocab_size, self.horizon, self.scale = int(vocab_size), int(horizon), scale
        self.generator = torch.Generator().manual_seed(seed)

    def draft(self, context: list[int], hidden: torch.Tensor | None = None) -> torch.Tensor:
        return torch.randn((self.horizon, self.vocab_size), generator=self.generator) * self.scale


class OracleDrafter:
    """Knows a reference continuation; puts the true token at rank 0, or with probability
    `swap` at rank 1 behind a decoy. Deterministic per (context length, depth), so every mode
    sees the same drafts. For tests: it makes trees accept through siblings (rank > 0 nodes),
    which exercises deep walks and the non-contiguous KV compaction path. `margin`: the logit
    gap between ranks 0 and 1 (a small one makes a best-first tree bushy and shallow)."""

    needs_hidden = False

    def __init__(self, reference: list[int], vocab_size: int, horizon: int = 6, swap: float = 0.3,
                 seed: int = 0, margin: float = 1.0) -> None:
        self.reference, self.vocab_size, self.horizon = list(reference), int(vocab_size), horizon
        self.swap, self.seed, self.margin = swap, seed, margin

    def draft(self, context: list[int], hidden: torch.Tensor | None = None) -> torch.Tensor:
        logits = torch.zeros((self.horizon, self.vocab_size))
        for d in range(self.horizon):
            j = len(context) + d
            rng = random.Random(self.seed * 7919 + j * 31 + d)
            truth = self.reference[j] if j < len(self.reference) else rng.randrange(self.vocab_size)
            decoy = (truth + 1 + rng.randrange(self.vocab_size - 1)) % self.vocab_size
            first, second = (decoy, truth) if rng.random() < self.swap else (truth, decoy)
            logits[d, first] = 8.0
            logits[d, second] = 8.0 - self.margin
        return logits
