"""The KV-pool table of BENCHMARKS.md, computed from the committed memory probes only.

    .venv/bin/python bench/memory_table.py                 # the table and its summary line (markdown)
    .venv/bin/python bench/memory_table.py --write          # also bench/results/memory.md
    .venv/bin/python bench/memory_table.py --json

A probe (`bench/results/memory_probes/<date>_<name>.json`, written by the `memory` group of
bench/realsglang/run.py on the lent H200) records the settings (model and draft configs, memory
fraction, cards), the free memory preflight read on the live GPU just before the start, and SGLang's
own lines about its pool, verbatim. Here the prediction is made again from those settings with
`ddtree_ops.memory` (never read from the file, so a change to the formula shows), and the real pool
is parsed from SGLang's first `KV Cache is allocated. ... #tokens: N` line (the target's pool; a
DFlash draft's pool has the same capacity). tests/unit/test_memory_probes.py holds every row to 2%.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ddtree_ops import memory  # noqa: E402

PROBES = REPO / "bench" / "results" / "memory_probes"
KV_TOKENS = re.compile(r"KV Cache is allocated\..*?#tokens: (\d+)")
LOAD_BEGIN = re.compile(r"Load weight begin\. avail mem=([\d.]+) GB")


def load(folder: Path = PROBES) -> list[dict[str, Any]]:
    """Every probe file, by name; `_path` added. A stand-in's probe is refused: only SGLang's
    numbers belong in the table."""
    out = []
    for path in sorted(folder.glob("*.json")):
        probe = json.loads(path.read_text())
        if not str(probe.get("server", "")).startswith("sglang"):
            raise ValueError(f"{path}: server {probe.get('server')!r} is not SGLang; stand-in probes are not data")
        probe["_path"] = str(path.relative_to(REPO) if path.is_relative_to(REPO) else path)
        out.append(probe)
    return out


def real_tokens(lines: list[str]) -> int | None:
    for line in lines:
        m = KV_TOKENS.search(line)
        if m:
            return int(m.group(1))
    return None


def sglang_free_before_load_mib(lines: list[str]) -> float | None:
    """SGLang's own `pre`: the free memory it measured before loading the target (GiB, 2 decimals)."""
    for line in lines:
        m = LOAD_BEGIN.search(line)
        if m:
            return float(m.group(1)) * 1024
    return None


def predict(probe: dict[str, Any]) -> memory.MemoryPlan:
    """Preflight's formula on the probe's recorded settings and the free memory it read."""
    s = probe["settings"]
    total = s.get("target_index_total_size")
    return memory.plan_from_configs(
        s["target_config"], index={"metadata": {"total_size": total}} if total else None,
        draft_cfg=s.get("draft_config"), gpu_total_mib=int(s["gpu_total_mib"]),
        free_mib=int(probe["preflight"]["free_mib"]), mem_fraction_static=float(s["mem_fraction_static"]),
        context_length=int(s.get("context_length", 1)), concurrency=int(s.get("max_running_requests", 1)),
        kv_cache_dtype=s.get("kv_cache_dtype", "auto"), page_size=int(s.get("page_size", 1)),
        tp=int(s.get("tp", 1)), cards=int(s.get("cards", 1)))


def row(probe: dict[str, Any]) -> dict[str, Any]:
    s = probe["settings"]
    plan = predict(probe)
    real = real_tokens(probe["sglang_lines"])
    pre = sglang_free_before_load_mib(probe["sglang_lines"])
    cfg = s["target_config"].get("text_config") or s["target_config"]
    draft = s.get("draft_config")
    return {
        "probe": probe["_path"], "date": probe.get("date"), "server": probe.get("server"),
        "model": s["model"], "layers": cfg["num_hidden_layers"], "hidden": cfg["hidden_size"],
        "draft": s.get("draft"), "draft_layers": draft["num_hidden_layers"] if draft else 0,
        "tp": s.get("tp", 1), "mfs": s["mem_fraction_static"], "free_mib": probe["preflight"]["free_mib"],
        "predicted": plan.tokens, "real": real,
        "error_pct": None if not real else round(100.0 * (plan.tokens - real) / real, 2),
        "pre_predicted_mib": round(plan.free_before_load_gib * 1024),
        "pre_sglang_mib": None if pre is None else round(pre),
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    head = ("| model shape | draft | TP | mem_fraction_static | free MiB (preflight) | predicted tokens | "
            "real tokens (SGLang) | error | probe |\n|---|---|---|---|---|---|---|---|---|\n")
    body = ""
    for r in rows:
        draft = f"{r['draft_layers']}-layer DFlash" if r["draft"] else "none"
        body += (f"| {r['model']} ({r['layers']} layers, hidden {r['hidden']}) | {draft} | {r['tp']} | {r['mfs']:.2f} | "
                 f"{r['free_mib']:,} | {r['predicted']:,} | {r['real']:,} | {r['error_pct']:+.2f}% | "
                 f"`{Path(r['probe']).name}` |\n")
    return head + body + "\n" + summary(rows) + "\n"


def summary(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "No probe with SGLang's own output is committed."
    shapes = sorted({r["model"] for r in rows})
    drafted = sum(1 for r in rows if r["draft"])
    worst = max(rows, key=lambda r: abs(r["error_pct"]))
    def n(k: int, what: str) -> str:
        return f"{k} {what}{'' if k == 1 else 's'}"

    return (f"{n(len(rows), 'probe')} on {n(len(shapes), 'model shape')} ({', '.join(shapes)}), {drafted} with a "
            f"DFlash draft and {len(rows) - drafted} without; every prediction within "
            f"{abs(worst['error_pct']):.2f}% of SGLang's pool (largest: {Path(worst['probe']).name}).")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=PROBES)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", action="store_true", help="also write bench/results/memory.md")
    args = ap.parse_args(argv)
    rows = [row(p) for p in load(args.dir)]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    text = markdown(rows)
    print(text, end="")
    if args.write:
        (REPO / "bench" / "results" / "memory.md").write_text(
            "# KV pool: preflight's prediction against real SGLang\n\n"
            "Generated by `bench/memory_table.py` from `bench/results/memory_probes/` (do not edit by hand).\n\n"
            + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
