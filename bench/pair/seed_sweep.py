#!/usr/bin/env python3
"""The test pair over several seeds: what the figures tests/engine/test_engine_pair.py relies on
do across seeds, so its margins rest on more than one trained model.

    python3 bench/pair/seed_sweep.py --out bench/results/pair/test_seed_sweep.json
    python3 bench/pair/seed_sweep.py --table bench/results/pair/test_seed_sweep.json

Per seed: the `test`-scale pair from the cache (bench/pair/cache.py; trained there when missing),
then exactly what the test decodes: the first 4 prompts x 48 tokens at budget 16, chain decoding
with the trained draft and with an untrained one (weights re-randomised under torch seed 0), and
tree decoding in both shapes; the shadow's per-round pairing of chain and tree in both shapes (the
rounds where the tree committed fewer tokens than the chain); both models' loss drops.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]

SEEDS = (20261203, 1, 2, 3, 4, 5)


def measure(seed: int) -> dict[str, Any]:
    import torch

    from cache import cached_pair
    from scales import SCALES
    from ddtree_ops.engine.decoder import Decoder
    from ddtree_ops.engine.dflash import DFlashDraft, DFlashDrafter, load_pair

    out, meta, trained = cached_pair(SCALES["test"], seed, "cpu",
                                     progress=lambda m: print(f"[sweep] {m}", file=sys.stderr, flush=True))
    model, _, drafter = load_pair(out / "target", out / "draft")
    prompts = json.loads((out / "prompts.json").read_text())["prompts"][:4]
    torch.manual_seed(0)
    raw = DFlashDraft(drafter.spec)
    raw.init_weights()
    untrained = DFlashDrafter(model, raw.eval())

    def tau(d: Any, mode: str, spine: bool = True) -> float:
        res = [Decoder(model, d, budget=16, spine=spine).generate(p, 48, mode) for p in prompts]
        return round(sum(sum(r.round_tokens) for r in res) / sum(r.rounds for r in res), 4)

    def below(spine: bool) -> tuple[int, int]:
        recs = [r for p in prompts for r in Decoder(model, drafter, budget=16, spine=spine)
                .generate(p, 48, "shadow").ledger.records]
        return sum(r.tree_tokens < r.chain_tokens for r in recs), len(recs)

    curve = json.loads((out / "train_curve.json").read_text())
    below_spine, rounds = below(True)
    below_plain, _ = below(False)
    row = {"seed": seed, "trained_now": trained, "corpus_sha256": meta["corpus"]["sha256"],
           "tau_chain": tau(drafter, "chain"), "tau_chain_untrained": tau(untrained, "chain"),
           "tau_tree_spine": tau(drafter, "tree", True), "tau_tree_plain": tau(drafter, "tree", False),
           "shadow_rounds": rounds, "rounds_tree_below_chain_spine": below_spine,
           "rounds_tree_below_chain_plain": below_plain,
           "target_loss_drop": round(curve["target_loss"][0] - curve["target_loss"][-1], 4),
           "draft_loss_drop": round(curve["draft_loss"][0] - curve["draft_loss"][-1], 4)}
    row["draft_gain"] = round(row["tau_chain"] - row["tau_chain_untrained"], 4)
    print(f"[sweep] {json.dumps(row)}", file=sys.stderr, flush=True)
    return row


def table(doc: dict[str, Any]) -> str:
    cols = ("seed", "tau_chain", "tau_chain_untrained", "draft_gain", "tau_tree_spine", "tau_tree_plain",
            "rounds_tree_below_chain_spine", "rounds_tree_below_chain_plain", "shadow_rounds",
            "target_loss_drop", "draft_loss_drop")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in doc["rows"]]
    gains = [r["draft_gain"] for r in doc["rows"]]
    lines.append(f"\ndraft gain over the untrained draft: {min(gains):.3f} to {max(gains):.3f} over {len(gains)} seeds")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from report import table_only

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    args = table_only(ap, argv, table)
    if args is None:
        return 0
    import torch

    rows = [measure(int(s)) for s in args.seeds.split(",")]
    doc = {"schema_version": 1, "scale": "test", "budget": 16, "prompts": 4, "max_new": 48,
           "torch": torch.__version__, "rows": rows,
           "note": "first 4 prompts x 48 tokens, greedy, float32 CPU; tau = tokens per verify round"}
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(args.out)
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
