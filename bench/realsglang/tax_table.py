"""BENCHMARKS.md's shadow-tax table from the raw numbers (`tax.py` wrote them on the H200).

    python bench/realsglang/tax_table.py [bench/results/shadow_tax.json]

Medians of the reps per arm and batch, and each as a ratio to DFLASH's median in the same run;
then issue 22's checks on them, one PASS/FAIL line each (exit 1 if any fails): the A/A twin within
2% of DFLASH at both batch sizes (what the set-up can resolve), share 0.25 at least 0.97 (target
0.99), share 1.0 at least 0.95.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

DEFAULT = Path(__file__).resolve().parents[1] / "results" / "shadow_tax.json"
LABELS = {
    "dflash": "DFLASH",
    "dflash_twin": "DFLASH twin (A/A control)",
    "ddtree_s000": "DDTREE, share 0 (hooks on, nothing sampled)",
    "ddtree_s025": "DDTREE shadow, share 0.25",
    "ddtree_s100": "DDTREE shadow, share 1.0",
    "ddtree_s100_thread": "DDTREE shadow, share 1.0, accounting thread",
}
CHECKS = (  # (arm, lowest ratio, what it checks)
    ("dflash_twin", 0.98, "A/A twin within 2% of DFLASH"),
    ("ddtree_s025", 0.97, "share 0.25 at least 0.97 of DFLASH (target 0.99)"),
    ("ddtree_s100", 0.95, "share 1.0 at least 0.95 of DFLASH (target)"),
)


def medians(doc: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    return {arm: {b: (statistics.median(v) if v else None) for b, v in per.items()} for arm, per in doc["arms"].items()}


def table(doc: dict[str, Any]) -> tuple[str, list[tuple[bool, str]]]:
    med = medians(doc)
    base = med["dflash"]
    batches = sorted(base, key=int)
    head = (f"{doc['model']}, {doc['params_b']} B parameters; {doc['gpu']}, SGLang {doc['sglang']}; "
            f"{doc['reps']} reps of {doc['tokens']} tokens per request, arms in turns; median decode tok/s "
            f"(ratio to DFLASH)\n\n")
    rows = ["| arm | " + " | ".join(f"batch {b}" for b in batches) + " |",
            "|---|" + "---|" * len(batches)]
    ratio: dict[str, dict[str, float | None]] = {}
    for arm, per in med.items():
        cells = []
        ratio[arm] = {}
        for b in batches:
            v, ref = per.get(b), base.get(b)
            r = v / ref if v is not None and ref else None
            ratio[arm][b] = r
            cells.append("-" if v is None else f"{v:,.0f} ({r:.3f})" if r is not None else f"{v:,.0f}")
        rows.append(f"| {LABELS.get(arm, arm)} | " + " | ".join(cells) + " |")
    checks = []
    for arm, low, what in CHECKS:
        got = [ratio.get(arm, {}).get(b) for b in batches]
        if arm == "dflash_twin":
            ok = all(r is not None and abs(r - 1.0) <= 1.0 - low for r in got)
        else:
            ok = all(r is not None and r >= low for r in got)
        shown = ", ".join("n/a" if r is None else f"{r:.3f}" for r in got)
        checks.append((ok, f"{'PASS' if ok else 'FAIL'} {what}: {shown} (batch {', '.join(batches)})"))
    return head + "\n".join(rows), checks


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else DEFAULT
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"{path}: cannot read the tax figures ({exc})", file=sys.stderr)
        return 2
    text, checks = table(doc)
    print(text)
    print()
    for _ok, line in checks:
        print(line)
    return 0 if all(ok for ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
