"""Deterministic "generation" for the stand-in: text derived from the prompt, token counts, and the
speculative-decoding figures SGLang reports per request (pure; no model runs here)."""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass

_TOKEN = re.compile(r"\s?[A-Za-z0-9']+|\s?[^\sA-Za-z0-9']|\s+")
CANNED = {
    "the capital of france is": " Paris. It is the largest city in France and one of the most visited cities in the world, "
                                "known for the Eiffel Tower, the Louvre and its cafes.",
    "the capital city of france is": " Paris. It is the largest city in France and one of the most visited cities in the world.",
}
WORDS = ("the model serves tokens from a draft tree and verifies them in one target pass so that each step commits "
         "several tokens when the drafter agrees with the target and one token when it does not while the "
         "scheduler keeps the cache warm and the queue short").split()
EOS_TOKEN_ID = 151645


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def count_tokens(text: str) -> int:
    """About what Qwen's BPE gives for English (one token per word piece or punctuation mark)."""
    return max(1, len(tokens(text)))


def _seed(prompt: str) -> int:
    return int.from_bytes(hashlib.sha256(prompt.encode("utf-8", "replace")).digest()[:8], "big")


def continuation(prompt: str, max_new_tokens: int) -> tuple[list[str], str]:
    """(generated tokens, finish type): a canned answer for the smoke prompts, else words picked by the
    prompt's hash; "stop" when a canned answer ends before the budget (EOS), else "length"."""
    canned = CANNED.get(prompt.strip().lower().rstrip(":"))
    if canned is not None:
        toks = tokens(canned)
        if len(toks) < max_new_tokens:
            return toks, "stop"
        return toks[:max_new_tokens], "length"
    seed = _seed(prompt)
    out = []
    for i in range(max_new_tokens):
        seed = (seed * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append(" " + WORDS[(seed >> 33) % len(WORDS)])
    return out, "length"


@dataclass(frozen=True)
class SpecStats:
    verify_ct: int
    accept_length: float  # completion_tokens / verify_ct, bonus token included (SGLang's definition)
    num_correct_drafts: int
    num_proposed_drafts: int

    @property
    def accept_rate(self) -> float:
        return self.num_correct_drafts / self.num_proposed_drafts if self.num_proposed_drafts else 0.0


def spec_stats(prompt: str, completion_tokens: int, *, mean: float, spread: float, cap: int) -> SpecStats:
    """Per-request figures around the mode's mean acceptance (deterministic per prompt), never above
    the draft window (`cap` = num_draft_tokens / block size) and never below 1 (the bonus token)."""
    if completion_tokens <= 0:
        return SpecStats(0, 0.0, 0, 0)
    jitter = ((_seed("spec:" + prompt) % 1000) / 1000.0 - 0.5) * 2 * spread
    target = min(max(mean + jitter, 1.0), float(cap))
    verify_ct = max(1, math.ceil(completion_tokens / target))
    verify_ct = min(verify_ct, completion_tokens)
    correct = completion_tokens - verify_ct
    return SpecStats(verify_ct, completion_tokens / verify_ct, correct, verify_ct * max(cap - 1, 0))


def round_commits(prompt: str, completion_tokens: int, verify_ct: int) -> list[int]:
    """The tokens each verify round committed (bonus included), summing to the completion: as even
    as the counts allow, the longer rounds placed by the prompt's hash."""
    if verify_ct <= 0 or completion_tokens <= 0:
        return []
    base, extra = divmod(completion_tokens, verify_ct)
    order = sorted(range(verify_ct), key=lambda i: _seed(f"round:{prompt}:{i}"))
    longer = set(order[:extra])
    return [base + (1 if i in longer else 0) for i in range(verify_ct)]
