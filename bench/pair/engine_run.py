#!/usr/bin/env python3
"""The engine's own decoding of the trained pair: AR, chain and tree on the pair's prompts.

    python3 bench/pair/engine_run.py --pair /tmp/pair --budget 32 --prompts 32 --max-new 64 --device cuda --out run.json

What the shadow's verdict is checked against. Greedy, on `DIR/prompts.json` (the first
`--prompts`): one AR pass (the reference tokens and AR's tokens/s), then `--reps` turns of
chain, tree, chain again (A B A'), interleaved per prompt and reversed every other turn, every
decode checked token for token against AR. The second chain arm is an A/A control: its ratio to
the first is the timing noise of this run, and a chain/tree difference smaller than that noise
says nothing. Last, one shadow pass (the engine's
own shadow accounting: the chain committed, the tree verified beside it on every round), so
the plugin's report can be held to the engine's on the same prompts.

tokens/s are end to end: every token of every prompt over the wall time of its decodes (draft,
tree build, verify, walk, KV compaction); on CUDA each round synchronises once (the walk reads
the target's choices), so the times include the GPU's work.

Output (JSON, one object; the fields the shadow side relies on first): tau_chain, tau_tree,
budget, lossless, tok_s_chain, tok_s_tree, tok_s_ar, rounds_chain, rounds_tree (rounds over all
prompts, one arm's pass), then per-prompt accepted lengths, per-turn timings, the A/A ratio,
and the engine's shadow report.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1])]                       # the repo: ddtree_ops


def say(msg: str) -> None:
    print(f"[engine_run {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def histogram(values: list[int]) -> dict[str, int]:
    return {str(k): v for k, v in sorted(Counter(values).items())}


def write(doc: dict[str, Any], dest: Path) -> None:
    """Atomically: a reader (or a timeout) never sees half a file."""
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(dest)


def run(pair: Path, budget: int, max_new: int, prompts: int | None, reps: int, device: str, dtype_name: str,
        tie_eps: float, shadow: bool, builder: str, dest: Path, spine: bool = True) -> dict[str, Any]:
    """Writes `dest` after the turns (complete: false) and again at the end, so a run cut short
    by a device call's limit still leaves the chain/tree figures behind."""
    import torch

    from ddtree_ops.engine.decoder import Decoder, DecodeResult
    from ddtree_ops.engine.dflash import load_pair
    from ddtree_ops.engine.verify_cmd import first_divergence, pair_prompts

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype_name]
    torch.manual_seed(0)
    t0 = time.perf_counter()
    model, tok, drafter = load_pair(pair / "target", pair / "draft", device=device, dtype=dtype)
    ids = pair_prompts(str(pair / "target"))
    if ids is None:
        raise SystemExit(f"engine_run: {pair / 'prompts.json'} is missing")
    ids = ids[:prompts] if prompts else ids
    load_s = time.perf_counter() - t0
    dec = Decoder(model, drafter, budget=budget, eos_token_id=None, builder=builder, spine=spine)
    for mode in ("ar", "chain", "tree"):                    # first calls pay for kernels and allocators
        dec.generate(ids[0], 8, mode)

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def arm(mode: str) -> list[DecodeResult]:
        sync()
        return [dec.generate(p, max_new, mode) for p in ids]

    say(f"{len(ids)} prompts x {max_new} tokens, budget {budget}, horizon {drafter.horizon}, {dtype_name} on {device}")
    ar = arm("ar")
    ref = [r.tokens for r in ar]
    divergences: list[dict[str, Any]] = []

    def check(mode: str, results: list[DecodeResult]) -> None:
        for p, (want, got) in enumerate(zip(ref, (r.tokens for r in results))):
            i = first_divergence(want, got)
            if i is not None:
                gap = ar[p].gaps[i] if i < len(ar[p].gaps) else None
                divergences.append({"prompt": p, "mode": mode, "index": i, "gap": gap,
                                    "explained": gap is not None and gap <= tie_eps})

    # Turns are interleaved per prompt (chain, tree, chain again on one prompt, then the next), and
    # every other rep runs the order backwards, so slow drifts of the machine fall on all arms alike.
    turns: list[dict[str, Any]] = []
    first: dict[str, list[DecodeResult]] = {}
    arms = (("chain", "chain"), ("tree", "tree"), ("chain_b", "chain"))
    for rep in range(reps):
        results: dict[str, list[DecodeResult]] = {name: [] for name, _ in arms}
        order = arms if rep % 2 == 0 else tuple(reversed(arms))
        sync()
        for p in ids:
            for name, mode in order:
                results[name].append(dec.generate(p, max_new, mode))
        for name, _ in arms:
            check(name, results[name])
            first.setdefault(name, results[name])
            tokens = sum(len(r.tokens) for r in results[name])
            seconds = sum(r.elapsed_s for r in results[name])
            turns.append({"rep": rep, "arm": name, "order": [n for n, _ in order], "tokens": tokens,
                          "seconds": round(seconds, 4), "tok_s": round(tokens / seconds, 2)})
            say(f"turn {rep + 1}/{reps} {name:7s} {tokens / seconds:8.1f} tok/s")

    def tok_s(name: str) -> float:
        rows = [t for t in turns if t["arm"] == name]
        return round(sum(t["tokens"] for t in rows) / sum(t["seconds"] for t in rows), 2)

    def rounds(results: list[DecodeResult]) -> tuple[int, float, list[list[int]]]:
        per_prompt = [r.round_tokens for r in results]
        flat = [x for row in per_prompt for x in row]
        return len(flat), round(sum(flat) / len(flat), 4), per_prompt

    n_chain, tau_chain, acc_chain = rounds(first["chain"])
    n_tree, tau_tree, acc_tree = rounds(first["tree"])
    ar_tokens = sum(len(r.tokens) for r in ar)
    ar_seconds = sum(r.elapsed_s for r in ar)
    doc: dict[str, Any] = {
        "schema_version": 1,
        "tau_chain": tau_chain, "tau_tree": tau_tree, "budget": budget,
        "lossless": all(d["explained"] for d in divergences),
        "tok_s_chain": tok_s("chain"), "tok_s_tree": tok_s("tree"), "tok_s_ar": round(ar_tokens / ar_seconds, 2),
        "rounds_chain": n_chain, "rounds_tree": n_tree,
        "identical": not divergences, "divergences": divergences, "tie_eps": tie_eps,
        "tok_s_chain_b": tok_s("chain_b"),
        "aa_ratio": round(tok_s("chain_b") / tok_s("chain"), 4),
        "tree_over_chain": round(tok_s("tree") / tok_s("chain"), 4),
        "faster": "tree" if tok_s("tree") > tok_s("chain") else "chain",
        "accepted_chain": acc_chain, "accepted_tree": acc_tree,
        "accepted_hist_chain": histogram([x for row in acc_chain for x in row]),
        "accepted_hist_tree": histogram([x for row in acc_tree for x in row]),
        "turns": turns, "reps": reps,
        "prompts": len(ids), "max_new": max_new, "tokens_per_arm": ar_tokens, "horizon": drafter.horizon,
        "block_size": drafter.spec.block_size, "target_layer_ids": list(drafter.spec.target_layer_ids),
        "device": device, "gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else None,
        "dtype": dtype_name, "builder": builder, "tree": "spine" if spine else "plain",
        "torch": torch.__version__, "load_s": round(load_s, 2),
        "pair": str(pair),
        "notes": ["greedy; tau = tokens committed per verify round (accepted drafts + the bonus), as SGLang's "
                  "accept length", "rounds_* and accepted_* are the first turn of each arm; every turn is "
                  "checked against AR", "eos ignored: every prompt decodes max_new tokens"],
    }
    doc["complete"] = not shadow
    doc["wall_s"] = round(time.perf_counter() - t0, 2)
    write(doc, dest)
    if shadow:
        from ddtree_ops.engine.shadow import ShadowLedger

        say(f"shadow pass ({doc['wall_s']:.0f} s so far)")

        ledger = ShadowLedger(drafter.horizon)
        res = arm("shadow")
        check("shadow", res)
        for r in res:
            assert r.ledger is not None
            ledger.records.extend(r.ledger.records)
        doc["shadow"] = ledger.report().to_dict()
        doc["lossless"] = all(d["explained"] for d in divergences)
        doc["identical"] = not divergences
        doc["complete"] = True
    doc["wall_s"] = round(time.perf_counter() - t0, 2)
    write(doc, dest)
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", type=Path, default=Path("/tmp/pair"), help="the directory train.py wrote")
    ap.add_argument("--budget", type=int, default=32, help="tree node budget B (non-root nodes)")
    ap.add_argument("--max-new", type=int, default=64, help="tokens generated per prompt")
    ap.add_argument("--prompts", type=int, default=32, help="the first N prompts of prompts.json (0: all)")
    ap.add_argument("--reps", type=int, default=1,
                    help="turns of chain, tree, chain (each already interleaved per prompt)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="float32 (default) keeps the lossless check exact up to near-ties")
    ap.add_argument("--tie-eps", type=float, default=1e-3)
    ap.add_argument("--builder", choices=("heap", "vector"), default="heap")
    ap.add_argument("--tree", choices=("spine", "plain"), default="spine",
                    help="the tree's shape: the chain's spine then best-first (default), or plain best-first")
    ap.add_argument("--no-shadow", action="store_true", help="skip the engine's shadow pass")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.budget < 1 or args.max_new < 1 or args.reps < 1:
        ap.error("--budget, --max-new and --reps must be >= 1")
    doc = run(args.pair, args.budget, args.max_new, args.prompts, args.reps, args.device, args.dtype,
              args.tie_eps, not args.no_shadow, args.builder, args.out, spine=args.tree == "spine")
    say(f"tau chain {doc['tau_chain']:.3f}, tree {doc['tau_tree']:.3f}; tok/s ar {doc['tok_s_ar']}, chain "
        f"{doc['tok_s_chain']}, tree {doc['tok_s_tree']} (A/A {doc['aa_ratio']}); lossless {doc['lossless']}; "
        f"{doc['wall_s']:.0f} s -> {args.out}")
    return 0 if doc["lossless"] else 1


if __name__ == "__main__":
    sys.exit(main())
