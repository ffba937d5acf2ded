"""How well `diagnose` names the real-log corpus, per part (tuning / held out) and per form.

    python bench/diagnose_corpus.py [--part tuning|held out|all] [--out bench/results/diagnose.md] [-v]

Every log of tests/data/logcorpus whose INDEX.md row gives a part, read three ways: raw, as
journald `short` text, and as `journalctl -o json`. A log counts as named when the verdict and
the root cause match its label (healthy/benign: healthy and no root cause; shadow_accounting_off:
degraded with that warning; any other label: that root cause). The last column is the gate's
coarser judgment: whether a failure was told from a healthy log at all (the verdict alone,
whatever root cause was named). Prints a table and, with -v, every miss; with --out, appends (or
replaces) the corpus section of the results file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "diagnose"))

from ddtree_ops.diagnose.classify import classify  # noqa: E402
from diagnose_helpers import QUIET, WARNING_ONLY, as_journal_json, as_journald, raw_lines, verdict_for  # noqa: E402

CORPUS = REPO / "tests" / "data" / "logcorpus"
FORMS = ("raw", "journald", "json")


def index_rows() -> list[tuple[str, str, str, str]]:
    """(file, label, part, batch) for every row of INDEX.md that names a part; the batch is the
    index section the row is in ("Issue 12 additions", "Issue 20 additions"), so each collection's
    held-out part is scored on its own."""
    rows = []
    batch = ""
    for line in (CORPUS / "INDEX.md").read_text("utf-8").splitlines():
        if line.startswith("## "):
            batch = line[3:].split(":")[0].strip()
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 8 and cells[2].startswith("`") and cells[2].endswith(".log`"):
            part = cells[7]
            if part in ("tuning", "held out"):
                rows.append((cells[2].strip("`"), cells[3].strip("`"), part, batch))
    return rows


def wrapped(lines: list[bytes], form: str) -> list[bytes]:
    return as_journald(lines) if form == "journald" else as_journal_json(lines) if form == "json" else lines


def named(label: str, rep: Any) -> tuple[bool, str]:
    """Whether a report (classify's) names the label, and what it said."""
    rc = rep.root_cause
    got = rc.label if rc is not None else ("warning:" + ",".join(f.label for f in rep.warnings) if rep.warnings
                                            else rep.verdict)
    if label in WARNING_ONLY:
        return rc is None and [f.label for f in rep.warnings] == [label], got
    if label in QUIET:
        return rep.verdict == "healthy" and rc is None, got
    return rc is not None and rc.label == label and rep.verdict == "failed", got


def score(part: str, batch: str | None = None) -> tuple[dict[str, int], int, list[tuple[str, str, str, str]], dict[str, int]]:
    """(named per form, logs, misses, verdict right per form)."""
    rows = [r for r in index_rows() if (part == "all" or r[2] == part) and (batch is None or r[3] == batch)]
    ok = {f: 0 for f in FORMS}
    apart = {f: 0 for f in FORMS}
    misses = []
    for name, label, _, _ in rows:
        lines = raw_lines(CORPUS / name)
        for form in FORMS:
            rep = classify(wrapped(lines, form))
            good, got = named(label, rep)
            ok[form] += good
            # the gate's coarser judgment: the verdict alone, whatever root cause was named
            apart[form] += rep.verdict == verdict_for(label)
            if not good:
                misses.append((name, form, label, got))
    return ok, len(rows), misses, apart


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", default="all", choices=("tuning", "held out", "all"))
    ap.add_argument("--out", help="results file whose corpus section is written")
    ap.add_argument("-v", action="store_true", help="list every miss")
    args = ap.parse_args(argv)
    parts = ("tuning", "held out") if args.part == "all" else (args.part,)
    lines = ["## Real-log corpus: logs named (`python bench/diagnose_corpus.py`)", "",
             "| collection | part | logs | raw | journald text | journalctl -o json | verdict right (raw / journald / json) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    all_misses = []
    batches = list(dict.fromkeys(r[3] for r in index_rows()))
    for part in parts:
        for batch in batches:
            ok, n, misses, apart = score(part, batch)
            if not n:
                continue
            all_misses += misses
            cells = " | ".join(f"{ok[f]}/{n} ({100 * ok[f] / max(n, 1):.0f}%)" for f in FORMS)
            verdicts = " / ".join(str(apart[f]) for f in FORMS)
            lines.append(f"| {batch} | {part} | {n} | {cells} | {verdicts} of {n} |")
    table_end = len(lines)
    if all_misses:
        lines += ["", "Misses (file, form, expected, got):", ""]
        lines += [f"- `{n}` ({f}): expected `{e}`, got `{g}`" for n, f, e, g in all_misses]
    text = "\n".join(lines) + "\n"
    print(text if args.v else "\n".join(lines[:table_end]))
    if args.out:
        out = Path(args.out)
        old = out.read_text("utf-8") if out.exists() else ""
        head = old.split("## Real-log corpus")[0].rstrip()
        out.write_text((head + "\n\n" if head else "") + text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
