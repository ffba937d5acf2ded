#!/usr/bin/env python3
"""The spine tree against the plain best-first tree, on a trained pair, by budget.

    python3 bench/pair/spine_vs_plain.py --out bench/results/spine_vs_plain.json     # the cpu pair, trained if missing
    python3 bench/pair/spine_vs_plain.py --pair DIR --out run.json                  # a pair made before
    python3 bench/pair/spine_vs_plain.py --table bench/results/spine_vs_plain.json  # the table from the raw file

The pair's own prompts (its prompts.json), greedy, float32, on the CPU unless --device. First one
AR pass (the reference every decode is checked against, token for token). Then per budget:
- turns of chain, tree (plain), tree (spine) and chain again (A/A control), interleaved per
  prompt and reversed every other turn, so a drift of the machine falls on every arm alike:
  tokens/s per arm (end to end: draft, build, verify, walk, compaction), and tau per arm from the
  first turn (tokens per verify round, bonus included);
- one shadow pass per shape (the chain committed, the tree verified beside it from the same draft
  on every round): the rounds where that tree committed fewer tokens than the chain, and the
  tree's and the chain's tau on those same rounds.
tau and the rounds are exact and do not depend on the machine's load; tokens/s do, which is what
the A/A ratio (chain again over chain) measures. Besides each arm's tokens/s over all its turns,
each decode's tokens/s is divided by the chain decode of the same prompt in the same turn (seconds
apart, so under nearly the same load) and the median of those ratios is reported per arm
(`paired_*`): the chain again's is the A/A of that statistic.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]

ARMS = (("chain", "chain", True), ("tree_plain", "tree", False), ("tree_spine", "tree", True),
        ("chain_b", "chain", True))


def say(msg: str) -> None:
    print(f"[spine_vs_plain {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def write(doc: dict[str, Any], dest: Path) -> None:
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(dest)


def run(pair: Path, budgets: list[int], max_new: int, prompts: int | None, reps: int, device: str,
        dest: Path, meta: dict[str, Any]) -> dict[str, Any]:
    import torch

    from ddtree_ops.engine.decoder import Decoder
    from ddtree_ops.engine.dflash import load_pair
    from ddtree_ops.engine.verify_cmd import first_divergence, pair_prompts

    torch.manual_seed(0)
    model, _, drafter = load_pair(pair / "target", pair / "draft", device=device, dtype=torch.float32)
    ids = pair_prompts(str(pair / "target"))
    if ids is None:
        raise SystemExit(f"spine_vs_plain: {pair / 'prompts.json'} is missing")
    ids = ids[:prompts] if prompts else ids
    warm = Decoder(model, drafter, budget=budgets[0])
    for mode in ("ar", "chain", "tree"):                 # the first calls pay for thread pools
        warm.generate(ids[0], 8, mode)
    ar = [warm.generate(p, max_new, "ar") for p in ids]
    say(f"{len(ids)} prompts x {max_new} tokens, horizon {drafter.horizon}, budgets {budgets}, {reps} turns")
    divergences: list[dict[str, Any]] = []

    def check(name: str, budget: int, p: int, tokens: list[int]) -> None:
        i = first_divergence(ar[p].tokens, tokens)
        if i is not None:
            gap = ar[p].gaps[i] if i < len(ar[p].gaps) else None
            divergences.append({"budget": budget, "arm": name, "prompt": p, "index": i, "gap": gap,
                                "explained": gap is not None and gap <= 1e-3})

    doc: dict[str, Any] = {
        "schema_version": 1, "pair": str(pair), "device": device, "torch": torch.__version__,
        "horizon": drafter.horizon, "prompts": len(ids), "max_new": max_new, "reps": reps,
        "pair_meta": {"seed": meta.get("seed"), "scale": meta.get("scale", {}).get("name"),
                      "corpus": meta.get("corpus"), "sha256": meta.get("sha256")},
        "budgets": [], "complete": False,
        "notes": ["greedy, float32; tau = tokens committed per verify round (accepted drafts + the bonus)",
                  "tok_s: every token of every prompt over the wall time of its decodes, per arm over all turns",
                  "aa_ratio: chain_b / chain tokens/s, the timing noise of this run",
                  "rounds_below_chain: shadow rounds (chain committed, tree verified beside it from the same "
                  "draft) where the tree committed fewer tokens than the chain"],
    }
    for budget in budgets:
        decs = {name: Decoder(model, drafter, budget=budget, spine=spine) for name, _, spine in ARMS}
        seconds = {name: 0.0 for name, _, _ in ARMS}
        tokens = {name: 0 for name, _, _ in ARMS}
        rounds: dict[str, list[int]] = {name: [] for name, _, _ in ARMS}
        turns, decodes = [], []
        for rep in range(reps):
            order = ARMS if rep % 2 == 0 else tuple(reversed(ARMS))
            turn = {name: [0.0, 0] for name, _, _ in ARMS}
            for p, prompt in enumerate(ids):
                for name, mode, _ in order:
                    res = decs[name].generate(prompt, max_new, mode)
                    check(name, budget, p, res.tokens)
                    decodes.append({"rep": rep, "prompt": p, "arm": name, "tokens": len(res.tokens),
                                    "seconds": round(res.elapsed_s, 5)})
                    turn[name][0] += res.elapsed_s
                    turn[name][1] += len(res.tokens)
                    if rep == 0:
                        rounds[name] += res.round_tokens
            for name in turn:
                seconds[name] += turn[name][0]
                tokens[name] += turn[name][1]
                turns.append({"rep": rep, "arm": name, "order": [n for n, _, _ in order],
                              "tok_s": round(turn[name][1] / turn[name][0], 2)})
        row: dict[str, Any] = {"budget": budget, "turns": turns, "decodes": decodes}
        rate = {(d["rep"], d["prompt"], d["arm"]): d["tokens"] / d["seconds"] for d in decodes}
        for name, _, _ in ARMS:
            row[f"tau_{name}"] = round(sum(rounds[name]) / len(rounds[name]), 4)
            row[f"rounds_{name}"] = len(rounds[name])
            row[f"tok_s_{name}"] = round(tokens[name] / seconds[name], 2)
            row[f"paired_{name}"] = round(statistics.median(
                rate[(rep, p, name)] / rate[(rep, p, "chain")] for rep in range(reps) for p in range(len(ids))), 4)
        row["aa_ratio"] = round(row["tok_s_chain_b"] / row["tok_s_chain"], 4)
        for shape, spine in (("plain", False), ("spine", True)):
            recs = []
            for p, prompt in enumerate(ids):
                res = Decoder(model, drafter, budget=budget, spine=spine).generate(prompt, max_new, "shadow")
                check(f"shadow_{shape}", budget, p, res.tokens)
                recs += res.ledger.records
            row[f"shadow_{shape}"] = {
                "rounds": len(recs), "rounds_below_chain": sum(r.tree_tokens < r.chain_tokens for r in recs),
                "rounds_above_chain": sum(r.tree_tokens > r.chain_tokens for r in recs),
                "tau_chain": round(sum(r.chain_tokens for r in recs) / len(recs), 4),
                "tau_tree": round(sum(r.tree_tokens for r in recs) / len(recs), 4)}
        doc["budgets"].append(row)
        say(f"B={budget}: tau chain {row['tau_chain']}, plain {row['tau_tree_plain']}, spine {row['tau_tree_spine']}; "
            f"below chain (shadow) plain {row['shadow_plain']['rounds_below_chain']}, spine "
            f"{row['shadow_spine']['rounds_below_chain']} of {row['shadow_spine']['rounds']}; tok/s chain "
            f"{row['tok_s_chain']} plain {row['tok_s_tree_plain']} spine {row['tok_s_tree_spine']} A/A {row['aa_ratio']}")
        doc["divergences"] = divergences
        write(doc, dest)
    doc["lossless"] = all(d["explained"] for d in divergences)
    doc["complete"] = True
    write(doc, dest)
    return doc


def table(doc: dict[str, Any]) -> str:
    head = ("| B | tau chain | tau tree: plain | spine | shadow rounds below chain: plain | spine "
            "| tok/s chain | plain | spine | chain again (A/A) | paired tok/s vs chain: plain | spine | A/A |")
    lines = [head, "|" + "---|" * 13]
    for r in doc["budgets"]:
        sp, pl = r["shadow_spine"], r["shadow_plain"]
        lines.append(f"| {r['budget']} | {r['tau_chain']:.3f} | {r['tau_tree_plain']:.3f} | {r['tau_tree_spine']:.3f} "
                     f"| {pl['rounds_below_chain']} / {pl['rounds']} | {sp['rounds_below_chain']} / {sp['rounds']} "
                     f"| {r['tok_s_chain']:.1f} | {r['tok_s_tree_plain']:.1f} | {r['tok_s_tree_spine']:.1f} "
                     f"| {r['tok_s_chain_b']:.1f} ({r['aa_ratio']:.3f}) | {r['paired_tree_plain']:.3f} "
                     f"| {r['paired_tree_spine']:.3f} | {r['paired_chain_b']:.3f} |")
    lines.append(f"\n{doc['prompts']} prompts x {doc['max_new']} tokens, horizon {doc['horizon']}, {doc['reps']} "
                 f"turns, {doc['device']}, torch {doc['torch']}; lossless: {doc.get('lossless')} "
                 f"({len(doc.get('divergences', []))} divergences)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from report import table_only

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", type=Path, help="a pair directory (default: the cpu-scale pair from the cache)")
    ap.add_argument("--budgets", default="8,16,32,64")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=0, help="the first N prompts (0: all)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    args = table_only(ap, argv, table)
    if args is None:
        return 0
    if args.pair:
        pair = args.pair
        meta = json.loads((pair / "train_meta.json").read_text()) if (pair / "train_meta.json").is_file() else {}
    else:
        from cache import cached_pair
        from scales import SCALES
        from train import SEED

        pair, meta, _ = cached_pair(SCALES["cpu"], SEED, "cpu", progress=say)
    doc = run(pair, [int(b) for b in args.budgets.split(",")], args.max_new, args.prompts or None, args.reps,
              args.device, args.out, meta)
    print(table(doc))
    return 0 if doc["lossless"] else 1


if __name__ == "__main__":
    sys.exit(main())
