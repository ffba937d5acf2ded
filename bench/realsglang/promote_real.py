"""`promote` on the real server, over the transport the device has (issue 33, item 5).

The device machine has no systemd (its PID 1 is the tool's process, `run.py` records it), so
`ddtree-ops promote h200` cannot install and start a unit there. This runs the same promote logic over
the local transport, as `run.py` runs the deploy gate: the shadow's /metrics scraped through
`LocalHost`, the decision by `promote.decide` (the shadow's counters, `treestats`' verdict, the bar), the
switch as a process start of the rendered `ddtree` launch line in place of the unit, the live window by
`promote.live_check` over `treestats.window` of two scrapes of the served tree, and on a miss the
rollback: the tree stopped and the ddtree-shadow server started again, until it answers.

    python3 bench/realsglang/promote_real.py --pair DIR --prompts bench/realsglang/tree_prompts.json --out "$OUT"

Two passes on the pair, one after the other:
- `pass`: a shadow server and then the tree with the same DDTREE_VERIFY_COST_RATIO (`--ratio`, given by
  the operator, as a profile may): decide on the shadow's counters, switch, live window;
- `forced-miss`: from the same shadow verdict, a tree server started with DDTREE_VERIFY_COST_RATIO=
  `--miss-ratio` (a verify cost no served tree pays for), so the live window's paired test says
  keep-chain: a miss, rolled back to the shadow (started again, until it answers and accounts).
`$OUT/promote_real.json` (every step: scrapes, decision, live window, rollback, timings) and the logs.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import arms  # noqa: E402
import truth  # noqa: E402
from scenarios import Scenario, tree_scenarios  # noqa: E402

BUNDLE = "promote.tar.gz"
EXTRA = ("--max-total-tokens", "32768", "--sleep-on-idle")


class Traffic:
    """Greedy requests in batches of `batch` on a server until stopped (what a live window needs)."""

    def __init__(self, host: Any, port: int, prompts: list[list[int]], batch: int, tokens: int) -> None:
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.sent = 0

        def loop() -> None:
            i = 0
            while not self.stop.is_set():
                chunk = [prompts[(i + k) % len(prompts)] for k in range(batch)]
                i += batch
                try:
                    arms.generate(host, port, [{"input_ids": p, "sampling_params": {
                        "temperature": 0.0, "max_new_tokens": tokens, "ignore_eos": True}} for p in chunk], timeout=60.0)
                    self.sent += len(chunk)
                except Exception as exc:          # noqa: BLE001 - a stopped server ends the traffic, said
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    time.sleep(1.0)

        self.thread = threading.Thread(target=loop, daemon=True)
        self.thread.start()

    def end(self) -> None:
        self.stop.set()
        self.thread.join(timeout=90)


def counters(host: Any, p: Any) -> tuple[Any, str]:
    from ddtree_ops import promote

    return promote.scrape(host, p)


def start(sc: Scenario, port: int, logs: Path, host: Any, tag: str, args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    drop = () if args.standin else ("--load-format",)
    s = arms.run.Server(sc, arms.profile(sc, port, EXTRA, drop), logs / f"{tag}.log")
    s.start(args.standin)
    arms.wait_ready([s], host, args.ready_s)
    return s, {"server": tag, "mode": sc.mode, "env": {k: v for k, v in sc.env.items() if k.startswith("DDTREE")},
               "gate": s.result.get("gate")}


def with_env(sc: Scenario, name: str, **env: str) -> Scenario:
    from dataclasses import replace

    return replace(sc, name=name, env={**sc.env, **env})


def decide_on_shadow(label: str, host: Any, shadow_sc: Scenario, bar: Any, prompts: list[list[int]], port: int,
                     logs: Path, args: argparse.Namespace, step: dict[str, Any]) -> tuple[Any, Any]:
    """A shadow server under greedy traffic until the decision is not 'too few rounds' (or time is up);
    (the decision, the server still running) or (None, None) if it did not start."""
    from ddtree_ops import promote

    shadow, step["shadow"] = start(shadow_sc, port, logs, host, f"{label}_shadow", args)
    if step["shadow"]["gate"]["status"] != "ready":
        shadow.stop()
        return None, None
    traffic = Traffic(host, shadow.port, prompts, args.batch, args.tokens)
    deadline = time.monotonic() + args.shadow_s
    decision = None
    while time.monotonic() < deadline:
        time.sleep(3.0)
        c, why = counters(host, shadow.profile)
        decision = promote.decide(c, bar, no_data=why)
        if decision.decision != promote.HOLD or not decision.reason.startswith("rounds"):
            break
    traffic.end()
    assert decision is not None
    step["decision"] = decision.to_json()
    arms.say(f"PROMOTE {label}: decision {decision.decision}: {decision.reason}")
    return decision, shadow


def one_pass(label: str, host: Any, shadow_sc: Scenario, tree_sc: Scenario, bar: Any, prompts: list[list[int]],
             port: int, logs: Path, args: argparse.Namespace, doc: dict[str, Any], decided: Any = None) -> Any:
    """Decide on a shadow (or take `decided`, the decision of the pass before, whose shadow it replaces),
    switch to the tree, watch the live window, roll back on a miss; returns the decision."""
    from ddtree_ops import promote, treestats

    step: dict[str, Any] = {"label": label, "t0": round(arms.elapsed(), 1)}
    doc["passes"].append(step)
    shadow = None
    if decided is None:
        decision, shadow = decide_on_shadow(label, host, shadow_sc, bar, prompts, port, logs, args, step)
        if decision is None:
            step["result"] = "the shadow did not start"
            return None
    else:
        decision = decided
        step["decision"] = {**decision.to_json(), "from": "the pass before (the same shadow verdict)"}
    if decision.decision != promote.PROMOTE or decision.verdict is None:
        step["result"] = f"not promoted: {decision.decision}"
        if shadow is not None:
            shadow.stop()
        return decision
    t = time.monotonic()
    if shadow is not None:
        shadow.stop()                               # the switch: the shadow's process out, the tree's in
    tree, step["tree"] = start(tree_sc, port, logs, host, f"{label}_tree", args)
    step["switch_s"] = round(time.monotonic() - t, 1)
    if step["tree"]["gate"]["status"] != "ready":
        live = promote.Live(True, False, "the tree did not start")
    else:
        before, why = counters(host, tree.profile)
        traffic = Traffic(host, tree.port, prompts, args.batch, args.tokens)
        start_live = time.monotonic()
        polls = []
        while True:
            time.sleep(bar.poll_s)
            now, why = counters(host, tree.profile)
            out = time.monotonic() - start_live >= bar.live_deadline_s
            live = (promote.Live(True, False, f"the live window lost its data: {why}") if now is None else
                    promote.live_check(decision.verdict, treestats.window(before, now), bar, out_of_time=out))
            polls.append({"t": round(time.monotonic() - start_live, 1), "reason": live.reason})
            if live.done:
                break
        traffic.end()
        step["live_polls"] = polls
        step["traffic_errors"] = traffic.errors[:5]
    step["live"] = live.to_json()
    arms.say(f"PROMOTE {label}: live {'PASS' if live.passed else 'MISS'}: {live.reason}")
    if live.passed:
        step["result"] = "passed"
        tree.stop()
        return decision
    t = time.monotonic()                            # a miss: back one step, to the shadow
    tree.stop()
    back, step["rollback"] = start(shadow_sc, port, logs, host, f"{label}_rollback", args)
    step["rollback_s"] = round(time.monotonic() - t, 1)
    ok = step["rollback"]["gate"]["status"] == "ready"
    if ok:
        got, _ = counters(host, back.profile)
        step["rollback_serves_shadow"] = got is not None and "shadow" in got.modes
    step["result"] = "rolled back" if ok else "rolled back, but the shadow did not start again"
    arms.say(f"PROMOTE {label}: {step['result']} in {step['rollback_s']}s")
    back.stop()
    return decision


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="promote's logic on the real server, over the local transport")
    arms.common_args(ap)
    ap.add_argument("--pair", required=True, type=Path)
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--budget", type=int, default=32)
    ap.add_argument("--ratio", default="1.147", help="DDTREE_VERIFY_COST_RATIO of the pass (both servers)")
    ap.add_argument("--miss-ratio", default="25", help="DDTREE_VERIFY_COST_RATIO of the forced miss's tree")
    ap.add_argument("--min-rounds", type=int, default=300)
    ap.add_argument("--min-speedup", type=float, default=1.0)
    ap.add_argument("--live-deadline-s", type=float, default=90.0)
    ap.add_argument("--shadow-s", type=float, default=90.0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--ready-s", type=float, default=240.0)
    ap.add_argument("--passes", default="pass,forced-miss")
    args = ap.parse_args(argv)
    _, draft_cfg, _ = truth.read_pair(args.pair)
    prompts = json.loads(args.prompts.read_text())["prompts"]
    host, info, logs = arms.init(args, "promote")
    from ddtree_ops import promote   # after init: pydantic comes from the wheel set on the device

    base = {s.name: s for s in tree_scenarios(str(args.pair), truth.block_of(draft_cfg), args.budget)}
    bar = promote.Bar(min_rounds=args.min_rounds, min_speedup=args.min_speedup, live_deadline_s=args.live_deadline_s,
                      poll_s=3.0)
    doc: dict[str, Any] = {"transport": "local (the device has no systemd: PID 1 is " + str(info.get("ps")) + ")",
                           "sglang": arms.sglang_version(info, args.standin), "gpu": arms.gpu_name(info),
                           "bar": vars(bar), "ratio": args.ratio, "miss_ratio": args.miss_ratio, "passes": []}
    shadow = with_env(base["ddtree_shadow"], "shadow", DDTREE_VERIFY_COST_RATIO=args.ratio)
    decided = None
    try:
        for label in args.passes.split(","):
            tree_ratio = args.ratio if label == "pass" else args.miss_ratio
            tree = with_env(base["ddtree_tree"], "tree", DDTREE_VERIFY_COST_RATIO=tree_ratio)
            decided = one_pass(label, host, shadow, tree, bar, prompts, args.port, logs, args, doc, decided)
            arms.write_json(args.out / "promote_real.json", doc)
    finally:
        arms.bundle(args.out, logs, {"environment": info, "promote": doc}, BUNDLE)
        arms.write_json(args.out / "promote_real.json", doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
