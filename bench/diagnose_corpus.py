"""How well `diagnose` reads the real-log corpus, per collection and part (tuning / held out), per form.

    python bench/diagnose_corpus.py [--part tuning|held out|all] [--out bench/results/diagnose.md] [-v]
    python bench/diagnose_corpus.py --table      # the table, from bench/results/diagnose_corpus.json

Every log of tests/data/logcorpus whose INDEX.md row gives a part, read three ways: raw, as
journald `short` text, and as `journalctl -o json`. Per log and form the run records (raw data:
bench/results/diagnose_corpus.json):
- named: the verdict and the root cause match the log's label (healthy/benign: no root cause and the
  verdict its row gives: healthy, or inconclusive where the row says the excerpt shows no serving;
  shadow_accounting_off: degraded with that warning; any other label: that root cause);
- verdict right: the verdict alone, whatever root cause was named (failed for a failure);
- called healthy: a failure log whose verdict is healthy (the direction that hides a failure);
- cited line right (failure logs whose row quotes the evidence): the root cause's line is the line
  holding INDEX.md's evidence substring, or a line of the same multi-line message.
The table gives each figure per collection and part, tuning and held out apart; with -v, every miss.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "diagnose"))

from ddtree_ops.diagnose.classify import classify  # noqa: E402
from diagnose_helpers import (QUIET, WARNING_ONLY, as_journal_json, as_journald, cites_evidence_line,  # noqa: E402
                              index_evidence, raw_lines, verdict_for)

CORPUS = REPO / "tests" / "data" / "logcorpus"
RESULTS = REPO / "bench" / "results" / "diagnose_corpus.json"
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


def named(label: str, name: str, rep: Any) -> tuple[bool, str]:
    """Whether a report (classify's) names the label, and what it said."""
    rc = rep.root_cause
    got = rc.label if rc is not None else ("warning:" + ",".join(f.label for f in rep.warnings) if rep.warnings
                                            else rep.verdict)
    if label in WARNING_ONLY:
        return rc is None and [f.label for f in rep.warnings] == [label], got
    if label in QUIET:
        return rep.verdict == verdict_for(label, name) and rc is None, got
    return rc is not None and rc.label == label and rep.verdict == "failed", got


def outcomes() -> list[dict[str, Any]]:
    """One record per log and form: what was expected, what was said, and each figure's mark."""
    evidence = index_evidence()
    out = []
    for name, label, part, batch in index_rows():
        lines = raw_lines(CORPUS / name)
        failure = label not in QUIET and label not in WARNING_ONLY
        for form in FORMS:
            rep = classify(wrapped(lines, form))
            good, got = named(label, name, rep)
            rc = rep.root_cause
            out.append({"log": name, "label": label, "part": part, "collection": batch, "form": form,
                        "named": good, "got": got, "verdict": rep.verdict,
                        "verdict_right": rep.verdict == verdict_for(label, name),
                        "called_healthy": failure and rep.verdict == "healthy",
                        "cited_line": None if rc is None else rc.line,
                        "cited_right": (cites_evidence_line(rep, evidence[name], lines)
                                        if failure and evidence.get(name) else None)})
    return out


def render(doc: dict[str, Any], verbose: bool = False) -> str:
    rows = doc["outcomes"]
    lines = ["## Real-log corpus (`python bench/diagnose_corpus.py`)", "",
             f"Generated on {doc['date']} from `bench/results/diagnose_corpus.json` (`python bench/diagnose_corpus.py "
             "--table`). Per collection and part, each figure in raw / journald text / `journalctl -o json` form.", "",
             "| collection | part | logs | named | verdict right | failures called healthy | failures with evidence "
             "| cited line is the evidence line |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    collections = list(dict.fromkeys(r["collection"] for r in rows))
    for part in ("tuning", "held out"):
        for coll in collections:
            sel = [r for r in rows if r["part"] == part and r["collection"] == coll]
            if not sel:
                continue
            n = len({r["log"] for r in sel})

            def per_form(key: str, sel: list[dict[str, Any]] = sel) -> str:
                return " / ".join(str(sum(1 for r in sel if r["form"] == f and r[key])) for f in FORMS)

            ev = len({r["log"] for r in sel if r["cited_right"] is not None})
            lines.append(f"| {coll} | {part} | {n} | {per_form('named')} | {per_form('verdict_right')} | "
                         f"{per_form('called_healthy')} | {ev} | {per_form('cited_right')} |")
    if verbose:
        misses = [r for r in rows if not r["named"]]
        lines += ["", "Not named (file, form, expected, got):", ""]
        lines += [f"- `{r['log']}` ({r['form']}): expected `{r['label']}`, got `{r['got']}`" for r in misses]
        wrong = [r for r in rows if r["cited_right"] is False]
        lines += ["", "Cited line not the evidence line (file, form, cited line):", ""]
        lines += [f"- `{r['log']}` ({r['form']}): line {r['cited_line']}" for r in wrong]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=str(RESULTS), help="raw outcomes (written by a run, read by --table)")
    ap.add_argument("--out", help="results file whose corpus section is written (bench/results/diagnose.md)")
    ap.add_argument("--table", action="store_true", help="print the table from --json and exit")
    ap.add_argument("-v", action="store_true", help="list every miss")
    args = ap.parse_args(argv)
    if args.table:
        print(render(json.loads(Path(args.json).read_text("utf-8")), args.v))
        return 0
    doc = {"schema_version": 1, "generated_by": "python bench/diagnose_corpus.py", "date": time.strftime("%Y-%m-%d"),
           "outcomes": outcomes()}
    head = {k: v for k, v in doc.items() if k != "outcomes"}
    rows = ",\n".join(json.dumps(r, separators=(", ", ": ")) for r in doc["outcomes"])  # one outcome per line
    Path(args.json).write_text(json.dumps(head)[:-1] + ', "outcomes": [\n' + rows + "\n]}\n", encoding="utf-8")
    text = render(doc, verbose=True)
    print(text if args.v else render(doc))
    if args.out:
        out = Path(args.out)
        old = out.read_text("utf-8") if out.exists() else ""
        head = old.split("## Real-log corpus")[0].rstrip()
        out.write_text((head + "\n\n" if head else "") + text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
