"""`ddtree-ops engine verify`: AR, chain, tree and shadow on the same prompts, checked for losslessness.

On CPU in float32 chain, tree and shadow must reproduce the AR greedy tokens exactly. A verify
forward over many tokens reduces in other shapes than a one-token AR step, so a genuine near-tie
can flip; every divergence is reported with the AR step's top-1/top-2 logit gap and counted as
explained only when that gap is within `tie_eps`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ddtree_ops.engine.tree_shape import spine_for
from ddtree_ops.errors import UsageError

# Prompts that a small instruct model answers with some structure: lists, code, repetition.
# Prompt-lookup drafting lives on that; free prose gives it little to match.
PROMPTS = (
    "Write a Python function that returns the first 20 square numbers, with a docstring and an example.",
    "List the days of the week, one per line, each followed by its abbreviation in parentheses.",
    "Count from 1 to 30, separating the numbers with commas.",
    "Write a short Markdown table of five fruits with their colour and a typical weight in grams.",
    "Explain what a binary search does, then write it in Python with comments.",
    "Give the multiplication table of 7 from 7 x 1 to 7 x 12, one line each.",
    "Write a JSON object describing three books with title, author and year.",
    "Repeat the sentence 'The quick brown fox jumps over the lazy dog.' five times, numbered.",
)


@dataclass
class Divergence:
    prompt: int
    mode: str
    index: int                 # first generated position where the mode differs from AR
    ar_token: int | None
    mode_token: int | None
    gap: float | None          # AR's top-1 minus top-2 logit at that step
    explained: bool

    def describe(self) -> str:
        gap = f"{self.gap:.3g}" if self.gap is not None else "n/a"
        why = "near-tie" if self.explained else "UNEXPLAINED"
        return (f"prompt {self.prompt} {self.mode}: token {self.index} is {self.mode_token}, AR has "
                f"{self.ar_token} (top1-top2 gap {gap}, {why})")


@dataclass
class VerifySummary:
    model: str
    prompts: int
    tokens: int
    budget: int
    horizon: int
    identical: bool
    explained: bool
    divergences: list[Divergence]
    tau_chain: float | None
    tau_tree: float | None
    modes: dict[str, dict[str, Any]]
    shadow: dict[str, Any]
    paired_rounds: dict[str, Any]
    tie_eps: float
    seconds: float
    notes: list[str] = field(default_factory=list)
    draft: str | None = None              # the DFlash draft's directory; None = n-gram drafting
    device: str = "cpu"

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["divergences"] = [asdict(d) for d in self.divergences]
        return doc


def first_divergence(ref: list[int], other: list[int]) -> int | None:
    for i in range(max(len(ref), len(other))):
        a = ref[i] if i < len(ref) else None
        b = other[i] if i < len(other) else None
        if a != b:
            return i
    return None


def encode_prompt(tok: Any, text: str) -> list[int]:
    if getattr(tok, "chat_template", None):
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    return [int(i) for i in tok(text)["input_ids"]]


def pair_prompts(target_dir: str) -> list[list[int]] | None:
    """The measurement prompts a trained pair was made with (`<pair>/prompts.json`, beside the
    target's directory), or None when there is no such file."""
    path = Path(target_dir).expanduser().resolve().parent / "prompts.json"
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    ids = doc.get("prompts") if isinstance(doc, dict) else None
    if not isinstance(ids, list) or not ids or not all(
            isinstance(p, list) and p and all(isinstance(i, int) for i in p) for p in ids):
        raise UsageError(f"{path}: field 'prompts' must be a non-empty list of token-id lists")
    return ids


def run_verify(model_name: str = "smollm2", prompts: int = 4, max_new_tokens: int = 64, budget: int = 32,
               horizon: int | None = None, tie_eps: float = 1e-3, shadow_share: float = 1.0,
               progress: Any = None, draft: str | None = None, device: str = "cpu") -> VerifySummary:
    """`draft` None: n-gram drafting on `model_name`; else a trained DFlash draft for the target
    `model_name` (the pair's prompts.json when it has one). float32 on `device`."""
    # torch and transformers (seconds): loaded here, once the CLI has checked they are installed
    import torch

    from ddtree_ops.engine.decoder import MODES, Decoder
    from ddtree_ops.engine.drafters import NGramDrafter
    from ddtree_ops.engine.models import load_model
    from ddtree_ops.engine.shadow import ShadowLedger, sign_test

    t_start = time.perf_counter()
    torch.manual_seed(0)
    drafter: Any
    if draft is None:
        model, tok = load_model(model_name, dtype=torch.float32, device=device)
        horizon = 15 if horizon is None else horizon
        drafter = NGramDrafter(int(model.config.vocab_size), horizon=horizon)
        drafter_note = "drafter: n-gram prompt lookup (no training)"
    else:
        # only for a trained pair: the DFlash draft's module
        from ddtree_ops.engine.dflash import load_pair

        model, tok, drafter = load_pair(model_name, draft, device=device, dtype=torch.float32)
        horizon = drafter.horizon
        drafter_note = f"drafter: the DFlash draft {draft} (block {horizon + 1}, target layers " \
                       f"{list(drafter.spec.target_layer_ids)})"
    pair_ids = pair_prompts(model_name) if draft is not None else None
    if pair_ids is not None:
        texts: list[Any] = [pair_ids[i % len(pair_ids)] for i in range(prompts)]
    else:
        texts = [PROMPTS[i % len(PROMPTS)] for i in range(prompts)]
    eos = tok.eos_token_id
    totals = {m: {"tokens": 0, "seconds": 0.0, "rounds": 0, "round_tokens": 0, "forwards": 0} for m in MODES}
    divergences: list[Divergence] = []
    ledger = ShadowLedger(horizon)
    chain_rounds, tree_rounds = [], []
    generated = 0
    # one throwaway decode: the first forward pays for thread pools and kernel selection
    Decoder(model).generate(_ids(tok, texts[0]), 2, "ar")
    for p, text in enumerate(texts):
        ids = _ids(tok, text)
        dec = Decoder(model, drafter, budget=budget, eos_token_id=eos, shadow_share=shadow_share, shadow_seed=p)
        results = {m: dec.generate(ids, max_new_tokens, m) for m in MODES}
        ar = results["ar"]
        generated += len(ar.tokens)
        for m, r in results.items():
            t = totals[m]
            t["tokens"] += len(r.tokens)
            t["seconds"] += r.elapsed_s
            t["rounds"] += r.rounds
            t["round_tokens"] += sum(r.round_tokens)
            t["forwards"] += r.target_forwards
            if m == "ar":
                continue
            i = first_divergence(ar.tokens, r.tokens)
            if i is not None:
                gap = ar.gaps[i] if i < len(ar.gaps) else None
                divergences.append(Divergence(
                    prompt=p, mode=m, index=i, ar_token=ar.tokens[i] if i < len(ar.tokens) else None,
                    mode_token=r.tokens[i] if i < len(r.tokens) else None, gap=gap,
                    explained=gap is not None and gap <= tie_eps))
        if results["shadow"].ledger is not None:
            ledger.records.extend(results["shadow"].ledger.records)
        chain_rounds.append(results["chain"].rounds)
        tree_rounds.append(results["tree"].rounds)
        if progress is not None:
            progress(f"prompt {p + 1}/{len(texts)}: {len(ar.tokens)} tokens, chain tau "
                     f"{results['chain'].tau or 0:.2f}, tree tau {results['tree'].tau or 0:.2f}")
    modes = {}
    for m, t in totals.items():
        modes[m] = {"tokens": t["tokens"], "seconds": round(t["seconds"], 3),
                    "tokens_per_s": round(t["tokens"] / t["seconds"], 2) if t["seconds"] else None,
                    "rounds": t["rounds"], "target_forwards": t["forwards"],
                    "tau": round(t["round_tokens"] / t["rounds"], 4) if t["rounds"] else None}
    diffs = [c - t for c, t in zip(chain_rounds, tree_rounds)]
    p_fewer, p_more, n = sign_test([float(d) for d in diffs])
    paired = {"chain_rounds": chain_rounds, "tree_rounds": tree_rounds,
              "p_tree_fewer_rounds": p_fewer, "p_tree_more_rounds": p_more, "non_tied_prompts": n}
    return VerifySummary(
        model=model_name, prompts=len(texts), tokens=generated, budget=budget, horizon=horizon,
        identical=not divergences, explained=all(d.explained for d in divergences), divergences=divergences,
        tau_chain=modes["chain"]["tau"], tau_tree=modes["tree"]["tau"], modes=modes,
        shadow=ledger.report().to_dict(), paired_rounds=paired, tie_eps=tie_eps,
        seconds=round(time.perf_counter() - t_start, 2), draft=draft, device=device,
        notes=[f"float32 on {device}; {drafter_note}",
               "prompts: " + ("the pair's prompts.json" if pair_ids is not None else "built-in"),
               "tau = tokens per verify round, bonus included",
               tree_note(budget, horizon)])


def tree_note(budget: int, horizon: int, spine: bool | None = None) -> str:
    """Which tree the decoder built (`Decoder(spine=None)`: the default for B and L)."""
    if spine_for(budget, horizon, spine):
        note = "tree: the spine tree (the draft's top-1 chain to the horizon, then best-first)"
        if budget < horizon:
            note += f"; budget {budget} is below the horizon {horizon}, so it is the chain cut at depth {budget}"
        return note
    if spine is None:
        return (f"tree: plain best-first (the B best prefixes): budget {budget} is below the horizon {horizon}, "
                "so no tree holds the whole chain")
    return "tree: plain best-first (the B best prefixes)"


def _ids(tok: Any, prompt: Any) -> list[int]:
    return [int(i) for i in prompt] if isinstance(prompt, list) else encode_prompt(tok, prompt)
