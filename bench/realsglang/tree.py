"""DDTree served for real (issue 33): lossless against the target and DFLASH, and as fast as the shadow said.

On the device machine, with a trained pair (`bench/pair/train.py --out DIR`, or one that travelled):

    python3 bench/realsglang/tree.py --pair DIR --prompts bench/realsglang/tree_prompts.json --out "$OUT"

Eight servers of the pair start together (`scenarios.tree_scenarios`): the target alone, DFLASH and
DDTREE tree serving in float32 (the lossless set), the same three in bfloat16 with a DFLASH twin (A/A)
and DDTREE shadow at share 1.0 (the speed arms). All with `--sleep-on-idle` and a KV cap. Then:

1. lossless: every prompt (`--lossless-prompts`), `--max-new` greedy tokens with `ignore_eos`, one at a
   time (batch 1) and `--lossless-batch` at a time, on each server of a set; the tree's outputs against
   the target's and DFLASH's, token for token. For a prompt that differs, the target is asked for its
   top-2 log-probabilities at the first differing position (a near-tie that rounding decides, or a
   tree that committed a wrong token: the margin says which).
2. speed: in turns, the order rotating every rep, each speed arm serves `b` of the same prompts at once
   (`b` in `--batches`) for `--tokens` tokens; tok/s = completion tokens / wall, per rep, until
   `--budget-s`.
3. from the servers: DFLASH's accept length (/server_info), the tree's and the shadow's report lines
   and their /metrics counters (`treestats`): tau_tree served, the shadow's tau_tree, the paired chain,
   the measured verify cost ratio r per batch bucket, each verdict.

`$OUT/tree_serving.json` (rewritten after every phase, the issue's fields) and `$OUT/tree.tar.gz`
(every log, summary.json).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import arms  # noqa: E402
import tree_prompts  # noqa: E402
import truth  # noqa: E402  (read_pair, block_of, model_facts)
from scenarios import tree_scenarios  # noqa: E402

BUNDLE = "tree.tar.gz"
EXTRA = ("--max-total-tokens", "32768", "--sleep-on-idle")
LOSSLESS = {"fp16": ("target16", "dflash16", "tree16"), "bf16": ("target", "dflash", "ddtree_tree")}
EXACT = "fp16"       # the set whose comparisons decide `lossless.identical`
SPEED = ("dflash", "dflash_twin", "ddtree_shadow", "ddtree_tree")
TREE_LINE = "DDTREE tree: rounds="


def outputs(host: Any, port: int, prompts: list[list[int]], max_new: int, batch: int) -> tuple[list[list[int]], float]:
    """Greedy output ids of every prompt, `batch` concurrent requests at a time; (outputs, wall s)."""
    params = {"temperature": 0.0, "max_new_tokens": max_new, "ignore_eos": True}

    def one(p: list[int]) -> list[int]:
        resp = host.http("POST", port, "/generate", body={"input_ids": p, "sampling_params": dict(params)},
                         timeout=60.0)
        return [int(t) for t in json.loads(resp.body)["output_ids"]]

    out: list[list[int]] = []
    t = time.monotonic()
    with cf.ThreadPoolExecutor(batch) as pool:
        for i in range(0, len(prompts), batch):
            out += list(pool.map(one, prompts[i:i + batch]))
    return out, time.monotonic() - t


def top2(host: Any, port: int, ids: list[int]) -> list[tuple[int, float]] | None:
    """The server's top-2 next tokens after `ids`, with their log-probabilities."""
    body = {"input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": 1},
            "return_logprob": True, "top_logprobs_num": 2}
    try:
        meta = json.loads(host.http("POST", port, "/generate", body=body, timeout=60.0).body)["meta_info"]
        top = meta["output_top_logprobs"][0]
        return [(int(t), float(lp)) for lp, t, *_ in top]
    except Exception as exc:              # noqa: BLE001 - a diagnostic must not lose the run
        arms.say(f"top2 failed: {type(exc).__name__}: {exc}")
        return None


def compare(name: str, got: list[list[int]], ref: list[list[int]], prompts: list[list[int]], host: Any,
            ref_port: int | None, limit: int = 64) -> dict[str, Any]:
    """Token-for-token comparison; for differing prompts the first differing position and, from the
    reference server, its top-2 there."""
    diffs = []
    for i, (a, b) in enumerate(zip(got, ref)):
        if a != b:
            k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            d: dict[str, Any] = {"prompt": i, "at": k, "got": a[k] if k < len(a) else None,
                                 "ref": b[k] if k < len(b) else None}
            if ref_port is not None and len(diffs) < limit:
                d["ref_top2"] = top2(host, ref_port, prompts[i] + b[:k])
            diffs.append(d)
    same = sum(a == b for a, b in zip(got, ref))
    gaps = [round(abs(d["ref_top2"][0][1] - d["ref_top2"][1][1]), 6) for d in diffs if d.get("ref_top2")
            and len(d["ref_top2"]) == 2 and {d["got"], d["ref"]} == {d["ref_top2"][0][0], d["ref_top2"][1][0]}]
    arms.say(f"LOSSLESS {name}: {same}/{len(ref)} identical" + (f"; first diffs {diffs[:3]}" if diffs else ""))
    return {"identical_prompts": same, "prompts": len(ref), "identical": same == len(ref) and len(got) == len(ref),
            "tokens": sum(len(r) for r in ref), "diffs": diffs,
            # the reference's top-2 log-probability gap where both tokens are its top two (a near-tie)
            "top2_gaps_at_diffs": sorted(gaps), "diffs_not_top2": len(diffs) - len(gaps)}


def lossless(host: Any, live: dict[str, Any], prompts: list[list[int]], max_new: int, batches: list[int]) -> dict[str, Any]:
    """Each set's three servers at each batch, concurrently (correctness only, not timed)."""
    jobs = [(dtype, name, b) for dtype, names in LOSSLESS.items() for name in names if name in live for b in batches]
    got: dict[tuple[str, str, int], Any] = {}
    with cf.ThreadPoolExecutor(max(1, len(jobs))) as pool:
        futs = {(d, n, b): pool.submit(outputs, host, live[n].port, prompts, max_new, b) for d, n, b in jobs}
        for key, fut in futs.items():
            try:
                got[key] = fut.result()[0]
            except Exception as exc:          # noqa: BLE001 - one server's failure must not lose the others'
                got[key] = None
                arms.say(f"LOSSLESS {key} failed: {type(exc).__name__}: {exc}")
    out: dict[str, Any] = {}
    for dtype, (target, dflash, tree) in LOSSLESS.items():
        for b in batches:
            t, f, r = got.get((dtype, target, b)), got.get((dtype, dflash, b)), got.get((dtype, tree, b))
            port = live[target].port if target in live else None
            key = f"{dtype}_batch{b}"
            out[key] = {
                "tree_vs_target": compare(f"{key} tree vs target", r, t, prompts, host, port) if r and t else None,
                "tree_vs_dflash": compare(f"{key} tree vs dflash", r, f, prompts, host, port) if r and f else None,
                "dflash_vs_target": compare(f"{key} dflash vs target", f, t, prompts, host, port) if f and t else None,
            }
    return out


def speed_rep(host: Any, live: dict[str, Any], prompts: list[list[int]], batches: list[int], tokens: int,
              rep: int, table: dict[str, dict[str, list[float]]], failed: dict[str, str]) -> None:
    names = [n for n in SPEED if n in live]
    for b in batches:
        shift = rep % len(names) if names else 0
        for name in names[shift:] + names[:shift]:
            if name in failed:
                continue
            body = {"temperature": 0.0, "max_new_tokens": tokens, "ignore_eos": True}
            try:
                metas, wall = arms.generate(host, live[name].port,
                                            [{"input_ids": p, "sampling_params": dict(body)} for p in prompts[:b]],
                                            timeout=60.0)
            except Exception as exc:          # noqa: BLE001 - a dead or stuck arm must not stop the others
                failed[name] = f"rep {rep}, batch {b}: {type(exc).__name__}: {exc}"
                arms.say(f"SPEED {name} failed: {failed[name]}")
                continue
            done = sum(int(m.get("completion_tokens", 0)) for m in metas)
            table.setdefault(name, {}).setdefault(str(b), []).append(round(done / wall, 2))
    arms.say(f"SPEED rep {rep}: " + json.dumps({n: {b: v[-1] for b, v in t.items()} for n, t in table.items()}))


def report_lines(text: str, prefix: str) -> list[str]:
    return [ln[ln.index(prefix):].strip() for ln in text.splitlines() if prefix in ln]


def fields(line: str, prefix: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in line.removeprefix(prefix).split() if "=" in kv)


def num(x: Any) -> float | None:
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def figures(host: Any, live: dict[str, Any]) -> dict[str, Any]:
    """What the servers say: DFLASH's accept length, the tree's and the shadow's reports and counters."""
    from ddtree_ops import treestats

    out: dict[str, Any] = {}
    for name, s in live.items():
        spec = arms.speculation(host, s)
        metrics = arms.run.fetch(host, s.port, "/metrics")
        counters = treestats.parse_metrics(metrics)
        v = treestats.verdict(counters) if counters is not None else None
        tree = report_lines(s.text(), TREE_LINE)
        out[name] = {"sglang_accept_len": spec.get("server_info_accept_len"), "shadow": spec.get("shadow"),
                     "tree_line": tree[-1] if tree else None,
                     "verdict": v.to_dict() if v is not None else None,
                     "verify": ({f"{arm}/{bs}": list(val) for (arm, bs), val in counters.verify.items()}
                                if counters is not None else None)}
    return out


def r_by_bucket(verify: dict[str, list[float]] | None) -> dict[str, float]:
    """Per batch-size bucket: mean tree verify seconds over mean chain verify seconds."""
    out: dict[str, float] = {}
    if not verify:
        return out
    buckets = {k.split("/", 1)[1] for k in verify}
    for bs in sorted(buckets):
        t, c = verify.get(f"tree/{bs}"), verify.get(f"chain/{bs}")
        if t and c and t[1] and c[1] and c[0]:
            out[bs] = round((t[0] / t[1]) / (c[0] / c[1]), 4)
    return out


def assemble(args: argparse.Namespace, info: dict[str, Any], pair_meta: dict[str, Any], loss: dict[str, Any],
             speed: dict[str, Any], figs: dict[str, Any]) -> dict[str, Any]:
    tree_f = fields(figs.get("ddtree_tree", {}).get("tree_line") or "", "DDTREE tree: ")
    shadow = figs.get("ddtree_shadow", {}).get("shadow") or {}
    exact = [v for k, v in loss.items() if k.startswith(EXACT)]
    checks = [c for part in exact for c in (part.get("tree_vs_target"), part.get("tree_vs_dflash")) if c]
    doc = {
        "gpu": arms.gpu_name(info), "sglang": arms.sglang_version(info, args.standin), "pair": pair_meta,
        "budget": args.budget, "max_new": args.max_new,
        "lossless": {"prompts": args.lossless_prompts, "tokens": args.max_new,
                     "dtype": "float16 activations, float32 logits (--enable-fp32-lm-head)",
                     "batches": args.lossless_batches,
                     "identical": bool(checks) and all(c["identical"] for c in checks), "sets": loss},
        "arms": speed,
        "tau": {"tree_served": num(tree_f.get("tau_tree")), "tree_shadow": num(shadow.get("tau_tree")),
                "chain_served": num(figs.get("dflash", {}).get("sglang_accept_len")),
                "chain_paired": num(tree_f.get("tau_chain"))},
        "r_measured": r_by_bucket(figs.get("ddtree_tree", {}).get("verify")),
        "r_measured_shadow": r_by_bucket(figs.get("ddtree_shadow", {}).get("verify")),
        "servers": figs,
    }
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="DDTree tree serving on real SGLang: lossless and speed")
    arms.common_args(ap)
    ap.add_argument("--pair", required=True, type=Path)
    ap.add_argument("--prompts", type=Path, default=None, help="a JSON {'prompts': [[ids]]} (default: the pair's)")
    ap.add_argument("--budget", type=int, default=32)
    ap.add_argument("--lossless-prompts", type=int, default=64)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--lossless-batches", type=lambda s: [int(x) for x in s.split(",")], default=[8, 1])
    ap.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    ap.add_argument("--tokens", type=int, default=128, help="tokens per request in the speed turns")
    ap.add_argument("--ready-s", type=float, default=300.0)
    ap.add_argument("--only", default="", help="comma-separated scenario names (default: all)")
    ap.add_argument("--max-reps", type=int, default=6, help="speed reps at most (each: every batch, every arm)")
    args = ap.parse_args(argv)
    target_cfg, draft_cfg, pair_prompts = truth.read_pair(args.pair)
    prompts = pair_prompts
    if args.prompts is not None:
        doc = json.loads(args.prompts.read_text())
        want = doc.get("tokenizer_sha256")
        if want and want != tree_prompts.tokenizer_sha256(args.pair):
            raise SystemExit(f"{args.prompts}: made with another tokenizer than {args.pair}/target/tokenizer.json "
                             "(bench/realsglang/tree_prompts.py makes them for this pair)")
        prompts = doc["prompts"]
    prompts = prompts[:args.lossless_prompts]
    if len(prompts) < max(args.batches):
        raise SystemExit(f"{args.prompts}: {len(prompts)} prompts, the largest batch needs {max(args.batches)}")
    block = truth.block_of(draft_cfg)
    meta_path = args.pair / "train_meta.json"
    pair_meta = {"path": str(args.pair), "target": truth.model_facts(target_cfg), "draft": truth.model_facts(draft_cfg)}
    if meta_path.exists():
        m = json.loads(meta_path.read_text())
        pair_meta.update({k: m.get(k) for k in ("seed", "device", "versions", "sha256")})
        pair_meta["scale"] = (m.get("scale") or {}).get("name")
    host, info, logs = arms.init(args, "tree")
    scenarios = tree_scenarios(str(args.pair), block, args.budget)
    if args.only:
        keep = set(args.only.split(","))
        scenarios = [s for s in scenarios if s.name in keep]
    drop = () if args.standin else ("--load-format",)
    servers = [arms.run.Server(sc, arms.profile(sc, args.port + i, EXTRA + sc.args, drop), logs / f"{sc.name}.log")
               for i, sc in enumerate(scenarios)]
    for s in servers:
        s.start(args.standin)
    summary: dict[str, Any] = {"environment": info, "groups": {}}
    loss: dict[str, Any] = {}
    speed: dict[str, dict[str, list[float]]] = {}
    figs: dict[str, Any] = {}
    failed: dict[str, str] = {}

    def save() -> None:
        doc = assemble(args, info, pair_meta, loss, speed, figs)
        doc["failed"] = failed
        doc["gates"] = {s.sc.name: s.result.get("gate") for s in servers}
        arms.write_json(args.out / "tree_serving.json", doc)

    try:
        arms.wait_ready(servers, host, args.ready_s)
        live = {s.sc.name: s for s in arms.ready(servers)}
        loss.update(lossless(host, live, prompts, args.max_new, args.lossless_batches))
        save()
        rep = 0
        while rep < args.max_reps and arms.elapsed() < args.budget_s - 40:
            speed_rep(host, {n: s for n, s in live.items() if s.alive()}, prompts, args.batches, args.tokens, rep, speed,
                      failed)
            rep += 1
            save()
        figs.update(figures(host, {n: s for n, s in live.items() if s.alive()}))
        save()
    finally:
        arms.stop_all(servers)
        summary["groups"]["tree"] = {s.sc.name: s.result for s in servers}
        arms.bundle(args.out, logs, summary, BUNDLE)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
