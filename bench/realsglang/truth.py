"""The shadow's verdict on a real model pair (issue 23), held to SGLang's counters and the engine.

On the device machine, after `bench/pair/train.py --out /tmp/rs/pair` in the same call:

    python3 bench/realsglang/truth.py --pair /tmp/rs/pair --out "$OUT" --budget 32

1. The engine decodes the pair's own prompts (`DIR/prompts.json`) with the trained draft, chain
   and tree at budget B (`bench/pair/engine_run.py`, the pair helper's script): tau_chain,
   tau_tree, tokens/s of each. Its per-round cost of a tree round in chain rounds,
   (tau_tree / tok_s_tree) / (tau_chain / tok_s_chain), becomes the DDTREE servers'
   DDTREE_VERIFY_COST_RATIO (`--cost-ratio engine`, the default; `default` leaves the plugin's
   measured default, a number sets it).
2. Six servers of the pair start together (`scenarios.truth_scenarios`: trained weights, no
   acceptance knob): DFLASH and DDTREE shadow at shares 0.25 and 1.0 for greedy requests, DFLASH
   and DDTREE at 1.0 for requests with temperature, and a second greedy DDTREE at 1.0 for longer
   requests. Each gets the engine's prompts (the first `--prompts`), `--concurrency` at a time,
   `--max-new` tokens with `ignore_eos` as the engine decodes them; `ddtree_s100_long` gets the
   same prompts with `--long-max-new` tokens, so that its verdict rests on over a thousand rounds
   (their first `--max-new` tokens are the same greedy tokens as `ddtree_s100`'s).
3. From each: SGLang's own accept length (`/server_info` avg_spec_accept_length, `/metrics`),
   and the shadow's last report line (rounds, tau_chain, tau_tree, cost ratio, sibling hits,
   recommendation); from the responses, completion tokens over verify rounds.
4. `$OUT/shadow_truth.json`: {"sglang", "gpu", "target", "draft", "sglang_accept_len",
   "shadow": {rounds, tau_chain, tau_tree, recommendation, cost_ratio, ...}, "engine": {tau_chain,
   tau_tree, budget, tok_s_chain, tok_s_tree, ...}, ...} with issue 23's checks as PASS/FAIL lines
   (also printed; exit 1 if one fails). "shadow" is `ddtree_s100_long`'s last report (every verify
   round of its long requests accounted: the rounds, the verdict, and tau_chain against its own
   SGLang accept length); "shadow_same_prompts" is `ddtree_s100`'s, on exactly the engine's
   prompts and tokens, for tau_tree against the engine's tree decode. Share 0.25 and temperature
   are recorded beside them. Logs and summary.json in `$OUT/truth.tar.gz`.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import arms  # noqa: E402
from scenarios import truth_scenarios  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BUNDLE = "truth.tar.gz"
EXTRA = ("--max-total-tokens", "16384", "--sleep-on-idle")
GREEDY = ("dflash", "ddtree_s025", "ddtree_s100", "ddtree_s100_long")
LONG = ("ddtree_s100_long",)
HOT = ("dflash_temp", "ddtree_s100_temp")


def read_pair(pair: Path) -> tuple[dict[str, Any], dict[str, Any], list[list[int]]]:
    """(target config, draft config, prompts); a clear message naming the file if one is wrong."""
    def load(path: Path) -> Any:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise SystemExit(f"{path}: {exc}") from None

    target, draft, prompts = load(pair / "target" / "config.json"), load(pair / "draft" / "config.json"), \
        load(pair / "prompts.json")
    ids = prompts.get("prompts") if isinstance(prompts, dict) else None
    if not ids or not all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in ids):
        raise SystemExit(f"{pair / 'prompts.json'}: 'prompts' must be a non-empty list of token-id lists")
    return target, draft, ids


def block_of(draft: dict[str, Any]) -> int:
    block = draft.get("block_size") or (draft.get("dflash_config") or {}).get("block_size")
    if not block:
        raise SystemExit("draft/config.json: no block_size (top level or dflash_config)")
    return int(block)


def model_facts(cfg: dict[str, Any]) -> dict[str, Any]:
    keys = ("architectures", "model_type", "num_hidden_layers", "hidden_size", "intermediate_size",
            "num_attention_heads", "num_key_value_heads", "vocab_size", "block_size", "torch_dtype")
    out = {k: cfg[k] for k in keys if k in cfg}
    if "dflash_config" in cfg:
        out["dflash_config"] = cfg["dflash_config"]
    return out


def made_engine_run(path: Path, args: argparse.Namespace, n_prompts: int) -> dict[str, Any]:
    """An engine_run.py JSON made earlier (the device call before this one, while the machine was
    warm), accepted only if it decoded what the servers will: the same budget, tokens and prompts."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--engine-json {path}: {exc}") from None
    want = {"budget": args.budget, "max_new": args.max_new, "prompts": n_prompts, "complete": True}
    wrong = {k: doc.get(k) for k, v in want.items() if doc.get(k) != v}
    if wrong:
        raise SystemExit(f"--engine-json {path}: made with {wrong}, this run needs {want}")
    arms.say(f"ENGINE from {path}: tau_chain {doc.get('tau_chain')} tau_tree {doc.get('tau_tree')}")
    return doc


def engine_run(args: argparse.Namespace, work: Path, made: dict[str, Any] | None = None) -> dict[str, Any]:
    """The pair helper's engine decode of the same prompts at the same budget (or `made`, one
    already checked by made_engine_run, kept beside the logs)."""
    out = work / "engine.json"
    if made is not None:
        out.write_text(json.dumps(made))
        return made
    argv = [sys.executable, str(args.engine_run), "--pair", str(args.pair), "--budget", str(args.budget),
            "--max-new", str(args.max_new), "--prompts", str(args.prompts), "--no-shadow", "--out", str(out),
            "--device", "cpu" if args.standin else "cuda"]
    arms.say(f"ENGINE {' '.join(argv[1:])}")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=args.engine_timeout_s, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"error": f"engine_run timed out after {args.engine_timeout_s:.0f}s"}
    (work / "engine_run.log").write_text(proc.stdout[-20000:] + proc.stderr[-20000:])
    if proc.returncode != 0 or not out.exists():
        return {"error": f"engine_run exit {proc.returncode}: {proc.stderr.strip()[-500:]}"}
    doc = json.loads(out.read_text())
    arms.say(f"ENGINE tau_chain {doc.get('tau_chain')} tau_tree {doc.get('tau_tree')} "
             f"tok/s chain {doc.get('tok_s_chain')} tree {doc.get('tok_s_tree')}")
    return doc


def engine_cost_ratio(engine: dict[str, Any]) -> float | None:
    """Seconds per tree round over seconds per chain round, in the engine's own decode."""
    try:
        per_tree = float(engine["tau_tree"]) / float(engine["tok_s_tree"])
        per_chain = float(engine["tau_chain"]) / float(engine["tok_s_chain"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    return round(per_tree / per_chain, 4) if per_chain > 0 else None


def load(host: Any, s: Any, prompts: list[list[int]], max_new: int, temperature: float, concurrency: int) -> dict[str, Any]:
    # ignore_eos: the engine decodes exactly max_new tokens per prompt, so must SGLang
    params = {"temperature": temperature, "max_new_tokens": max_new, "ignore_eos": True}
    metas: list[dict[str, Any]] = []
    wall = 0.0
    for i in range(0, len(prompts), concurrency):
        chunk = [{"input_ids": p, "sampling_params": dict(params)} for p in prompts[i:i + concurrency]]
        got, t = arms.generate(host, s.port, chunk)
        metas += got
        wall += t
    tokens = sum(int(m.get("completion_tokens", 0)) for m in metas)
    verify = sum(int(m.get("spec_verify_ct", 0)) for m in metas)
    return {"requests": len(metas), "completion_tokens": tokens, "spec_verify_ct": verify, "wall_s": round(wall, 2),
            "accept_len_from_responses": round(tokens / verify, 4) if verify else None}


def within(a: float | None, b: float | None, tol: float) -> tuple[bool, str]:
    if a is None or b is None or not b:
        return False, f"{a} vs {b}: missing"
    rel = (a - b) / b
    return abs(rel) <= tol, f"{a:.4f} vs {b:.4f} ({rel:+.2%}, allowed ±{tol:.0%})"


def checks(doc: dict[str, Any]) -> list[dict[str, Any]]:
    sh, en = doc["shadow"], doc["engine"]
    out = []

    def add(name: str, ok: bool, detail: str) -> None:
        out.append({"name": name, "ok": bool(ok), "detail": detail})

    same = doc.get("shadow_same_prompts") or {}
    rounds = sh.get("rounds") or 0
    add("at least 1,000 accounted rounds", rounds >= 1000, f"{rounds} rounds ({sh.get('server')})")
    rec = sh.get("recommendation")
    add("a verdict that is not inconclusive", rec in ("promote-tree", "keep-chain"), f"recommendation={rec}")
    add("engine tau_chain at least 1.5 (the draft really drafts)", (en.get("tau_chain") or 0) >= 1.5,
        f"tau_chain={en.get('tau_chain')}")
    ok, detail = within(sh.get("tau_chain"), doc.get("sglang_accept_len"), 0.02)
    add("shadow tau_chain within 2% of SGLang's accept length", ok, f"{detail} ({sh.get('server')})")
    ok, detail = within(same.get("tau_tree"), en.get("tau_tree"), 0.05)
    add(f"shadow tau_tree within 5% of the engine's at budget {en.get('budget')}, same prompts and tokens", ok,
        f"{detail} ({same.get('server')})")
    faster = None
    if en.get("tok_s_tree") is not None and en.get("tok_s_chain") is not None:
        faster = "promote-tree" if float(en["tok_s_tree"]) > float(en["tok_s_chain"]) else "keep-chain"
    add("the verdict agrees with the engine's faster decode", faster is not None and rec == faster,
        f"verdict {rec}; engine tok/s chain {en.get('tok_s_chain')} tree {en.get('tok_s_tree')} -> {faster}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="the shadow's verdict on a trained pair, held to SGLang and the engine")
    arms.common_args(ap)
    ap.add_argument("--pair", required=True, type=Path, help="bench/pair/train.py --out DIR")
    ap.add_argument("--budget", type=int, default=32, help="tree budget B (engine and DDTREE_BUDGET)")
    ap.add_argument("--max-new", type=int, default=64, help="tokens per prompt, engine and SGLang alike")
    ap.add_argument("--prompts", type=int, default=64, help="the first N prompts of prompts.json, engine and SGLang")
    ap.add_argument("--long-max-new", type=int, default=256, help="tokens per prompt for ddtree_s100_long")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--cost-ratio", default="engine", help="engine | default | a number")
    ap.add_argument("--engine-run", type=Path, default=REPO / "bench" / "pair" / "engine_run.py")
    ap.add_argument("--engine-json", type=Path, default=None,
                    help="an engine_run.py JSON already made with these --budget/--max-new/--prompts (not run again)")
    ap.add_argument("--engine-timeout-s", type=float, default=200.0)
    ap.add_argument("--ready-s", type=float, default=200.0)
    args = ap.parse_args(argv)
    target, draft, prompts = read_pair(args.pair)
    prompts = prompts[:args.prompts] if args.prompts > 0 else prompts
    block = block_of(draft)
    if args.budget < block - 1:
        raise SystemExit(f"--budget {args.budget} is below the draft horizon {block - 1}")
    context = min(2048, int(target.get("max_position_embeddings") or 2048))
    longest = max(len(p) for p in prompts) + max(args.max_new, args.long_max_new) + block
    if longest > context:
        raise SystemExit(f"{args.pair / 'prompts.json'}: the longest prompt plus --long-max-new {args.long_max_new} "
                         f"({longest} tokens) exceeds the target's context {context}")
    made = made_engine_run(args.engine_json, args, len(prompts)) if args.engine_json is not None else None
    host, info, logs = arms.init(args, "truth")
    engine = engine_run(args, logs, made)
    measured = engine_cost_ratio(engine)
    if args.cost_ratio == "engine" and measured is not None:
        ratio, source = measured, "engine run on this pair: (tau_tree / tok_s_tree) / (tau_chain / tok_s_chain)"
    elif args.cost_ratio not in ("engine", "default"):
        ratio, source = float(args.cost_ratio), "--cost-ratio"
    else:
        ratio, source = None, "the plugin's measured default (engine-bench-h200-qwen3-8b)"
    cost_env = {"DDTREE_VERIFY_COST_RATIO": str(ratio)} if ratio is not None else {}
    arms.say(f"COST RATIO {ratio} ({source})")
    scenarios = truth_scenarios(str(args.pair), block, args.budget, cost_env, context)
    summary: dict[str, Any] = {"environment": info, "groups": {}, "engine": engine, "cost_ratio": ratio,
                               "cost_ratio_source": source}
    drop = () if args.standin else ("--load-format",)
    servers = arms.start_all(scenarios, logs, args.port, args.standin, EXTRA, drop)
    by_name = {s.sc.name: s for s in servers}
    try:
        arms.wait_ready(servers, host, args.ready_s)
        live = {s.sc.name: s for s in arms.ready(servers)}
        jobs = [(n, 0.0) for n in GREEDY if n in live] + [(n, args.temperature) for n in HOT if n in live]
        with cf.ThreadPoolExecutor(max(1, len(jobs))) as pool:
            futs = {n: pool.submit(load, host, live[n], prompts, args.long_max_new if n in LONG else args.max_new, t,
                                   args.concurrency) for n, t in jobs}
            for n, fut in futs.items():
                try:
                    live[n].result["load"] = fut.result()
                except Exception as exc:      # one server's failure must not lose the others'
                    live[n].result["load"] = {"error": f"{type(exc).__name__}: {exc}"}
        for s in live.values():
            s.result["speculation"] = arms.speculation(host, s)
    finally:
        arms.stop_all(servers)
        for s in servers:
            s.result["diagnose"] = arms.run.diagnose(s) if s.log.exists() else None
        summary["groups"]["truth"] = {s.sc.name: s.result for s in servers}
        arms.bundle(args.out, logs, summary, BUNDLE)
    doc = assemble(args, info, target, draft, engine, ratio, source, by_name)
    arms.write_json(args.out / "shadow_truth.json", doc)
    for c in doc["checks"]:
        print(f"{'PASS' if c['ok'] else 'FAIL'} {c['name']}: {c['detail']}", flush=True)
    return 0 if all(c["ok"] for c in doc["checks"]) else 1


def _spec(s: Any) -> dict[str, Any]:
    return s.result.get("speculation") or {} if s is not None else {}


def assemble(args: argparse.Namespace, info: dict[str, Any], target: dict[str, Any], draft: dict[str, Any],
             engine: dict[str, Any], ratio: float | None, source: str, by_name: dict[str, Any]) -> dict[str, Any]:
    spec = _spec(by_name.get("ddtree_s100_long"))

    def shadow(server: str) -> dict[str, Any]:
        rep = _spec(by_name.get(server)).get("shadow") or {}
        return {"rounds": rep.get("rounds"), "tau_chain": rep.get("tau_chain"), "tau_tree": rep.get("tau_tree"),
                "recommendation": rep.get("recommendation"), "cost_ratio": rep.get("cost_ratio"),
                "tau_tree_lower": rep.get("tau_tree_lower"), "sibling_hits": rep.get("sibling_hits"),
                "exact_rounds": rep.get("sampled"), "dropped": rep.get("dropped"), "cost_from": rep.get("cost_from"),
                "server": server, "sglang_accept_len": _spec(by_name.get(server)).get("server_info_accept_len"),
                "line": rep.get("line")}

    doc: dict[str, Any] = {
        "sglang": arms.sglang_version(info, args.standin), "gpu": arms.gpu_name(info),
        "target": {"path": str(args.pair / "target"), **model_facts(target)},
        "draft": {"path": str(args.pair / "draft"), **model_facts(draft)},
        "sglang_accept_len": spec.get("server_info_accept_len"),
        "shadow": shadow("ddtree_s100_long"),
        "shadow_same_prompts": shadow("ddtree_s100"),
        "engine": {"tau_chain": engine.get("tau_chain"), "tau_tree": engine.get("tau_tree"),
                   "budget": engine.get("budget", args.budget), "tok_s_chain": engine.get("tok_s_chain"),
                   "tok_s_tree": engine.get("tok_s_tree"),
                   **{k: v for k, v in engine.items() if k not in ("tau_chain", "tau_tree", "budget", "tok_s_chain",
                                                                   "tok_s_tree")}},
        "cost_ratio_given": ratio, "cost_ratio_source": source, "budget": args.budget, "max_new": args.max_new,
        "long_max_new": args.long_max_new, "prompts": args.prompts,
        "servers": {n: {"sglang_accept_len": _spec(s).get("server_info_accept_len"),
                        "metrics_spec": _spec(s).get("metrics_spec"), "shadow": _spec(s).get("shadow"),
                        "load": s.result.get("load"), "gate": s.result.get("gate")} for n, s in by_name.items()},
    }
    doc["checks"] = checks(doc)
    return doc


if __name__ == "__main__":
    sys.exit(main())
