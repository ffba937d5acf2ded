"""The shadow tax (issue 22): decode throughput of DDTREE shadow against DFLASH, with an A/A twin.

On the device machine, from the repository root (`run` with carry [".device/realsglang/site.tar.xz"]):

    python3 bench/realsglang/tax.py --out "$OUT" --budget-s 400

Five servers of the Qwen3-8B shape (random weights, `--load-format dummy`) start together on the
one GPU, each with CUDA graphs (`--cuda-graph-max-bs-decode 8`), `--sleep-on-idle` and a KV cap,
and SGLANG_SIMULATE_ACC_LEN=3 (`scenarios.tax_scenarios`): DFLASH, a DFLASH twin (the A/A control:
it shows what this set-up can resolve), DDTREE shadow at shares 0, 0.25 and 1.0. Once all answer
`/health_generate`, each is warmed up at batch 1 and 8; then rep after rep, at batch 1 and at
batch 8, every arm decodes `--tokens` tokens per request (`ignore_eos`), the arms in an order that
rotates every rep, one arm at a time. Decode tokens per second per rep land in
`$OUT/shadow_tax.json` after every rep, in the schema of issue 22:

    {"gpu", "sglang", "model", "params_b", "tokens", "reps",
     "arms": {"dflash": {"1": [tok/s per rep], "8": [...]}, "dflash_twin": ..., "ddtree_s000": ...,
              "ddtree_s025": ..., "ddtree_s100": ...}}

Reps stop when the next one would pass `--budget-s` (less the stop and the bundle), so a call cut
off at its limit still brings back every rep it measured. The server logs, each arm's shadow
report lines and `/metrics` go into `$OUT/tax.tar.gz` (summary.json under `groups.tax`),
rewritten after every rep. `tax_table.py` turns the JSON into BENCHMARKS.md's table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import arms  # noqa: E402
from scenarios import MODELS, TAX_DEFAULT, TAX_EXTRA, tax_scenarios  # noqa: E402

BATCHES = (1, 8)
BUNDLE = "tax.tar.gz"
MODEL = "Qwen3-8B shape (random weights) + 5-layer DFlash draft, block 16"


def params_b(config: dict[str, Any]) -> float:
    """Parameters of a Qwen3 config, in billions: embeddings, untied head, attention, MLP, norms."""
    h, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    d = config.get("head_dim") or h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * inter + 2 * h + 2 * d
    vocab = config["vocab_size"] * h * (1 if config.get("tie_word_embeddings") else 2)
    return round((vocab + layers * per_layer + h) / 1e9, 3)


def body(batch_row: int, rep: int, tokens: int) -> dict[str, Any]:
    """A greedy request of `tokens` new tokens; prompts differ by row and rep (no prefix reuse)."""
    ids = [10 + (rep * 97 + batch_row * 31 + i * 7) % 900 for i in range(16)]
    return {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": tokens, "ignore_eos": True}}


def decode_tok_s(host: Any, port: int, batch: int, tokens: int, rep: int) -> float:
    metas, wall = arms.generate(host, port, [body(i, rep, tokens) for i in range(batch)])
    return sum(int(m["completion_tokens"]) for m in metas) / wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="shadow tax: DDTREE shadow against DFLASH on the Qwen3-8B shape")
    arms.common_args(ap)
    ap.add_argument("--reps", type=int, default=10, help="at most this many reps (fewer if the budget ends first)")
    ap.add_argument("--tokens", type=int, default=512, help="new tokens per request")
    ap.add_argument("--ready-s", type=float, default=240.0, help="how long the servers may take to start")
    ap.add_argument("--arms", type=lambda v: tuple(v.split(",")), default=TAX_DEFAULT, metavar="NAME,...",
                    help=f"arms to run (default {','.join(TAX_DEFAULT)}; also ddtree_s100_thread)")
    args = ap.parse_args(argv)
    known = {sc.name: sc for sc in tax_scenarios()}
    unknown = [a for a in args.arms if a not in known]
    if unknown or "dflash" not in args.arms:
        ap.error(f"--arms: {', '.join(unknown) or 'dflash is the reference and must run'} "
                 f"(known: {', '.join(known)})")
    scenarios = [known[a] for a in args.arms]
    host, info, logs = arms.init(args, "tax")
    config = json.loads((args.root / "models" / "qwen3-8b" / "config.json").read_text())
    doc: dict[str, Any] = {"gpu": arms.gpu_name(info), "sglang": arms.sglang_version(info, args.standin),
                           "model": MODEL, "params_b": params_b(config), "tokens": args.tokens, "reps": 0,
                           "arms": {sc.name: {str(b): [] for b in BATCHES} for sc in scenarios}}
    summary: dict[str, Any] = {"environment": info, "groups": {}, "skipped": [], "models": MODELS}
    servers = arms.start_all(scenarios, logs, args.port, args.standin, TAX_EXTRA)
    try:
        arms.wait_ready(servers, host, args.ready_s)
        live = arms.ready(servers)
        summary["groups"]["tax"] = {s.sc.name: s.result for s in servers}
        if len(live) < len(servers):
            arms.say(f"TAX: only {[s.sc.name for s in live]} started; measuring those")
        for s in live:                                    # warm-up: graphs and allocator at both sizes
            for b in BATCHES:
                decode_tok_s(host, s.port, b, 64, rep=-1)
        per_rep: list[float] = []
        for rep in range(args.reps):
            left = args.budget_s - arms.elapsed() - 45.0  # the stop and the bundle
            if per_rep and max(per_rep) > left:
                arms.say(f"TAX: {rep} reps done; the next would pass the budget")
                break
            t = time.monotonic()
            order = live[rep % len(live):] + live[:rep % len(live)] if live else []
            for b in BATCHES:
                for s in order:
                    doc["arms"][s.sc.name][str(b)].append(round(decode_tok_s(host, s.port, b, args.tokens, rep), 1))
            doc["reps"] = rep + 1
            per_rep.append(time.monotonic() - t)
            arms.write_json(args.out / "shadow_tax.json", doc)
            arms.say(f"TAX rep {rep + 1}: " + ", ".join(f"{n} {v['1'][-1]}/{v['8'][-1]}"
                                                        for n, v in doc["arms"].items() if v["1"]))
            summary["groups"]["tax"] = {s.sc.name: s.result for s in servers}
            arms.bundle(args.out, logs, summary, BUNDLE)
        for s in live:
            s.result["speculation"] = arms.speculation(host, s)
    finally:
        arms.stop_all(servers)
        for s in servers:
            s.result["diagnose"] = arms.run.diagnose(s) if s.log.exists() else None
        summary["groups"]["tax"] = {s.sc.name: s.result for s in servers}
        arms.write_json(args.out / "shadow_tax.json", doc)
        arms.bundle(args.out, logs, summary, BUNDLE)
    arms.say(f"done: {args.out / 'shadow_tax.json'}, {args.out / BUNDLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
