"""Helpers for the diagnose tests: the real log corpus, synthetic fixtures, journal wrappers.

Imported as `diagnose_helpers` (pytest puts this directory on sys.path), so the tests run the same
under `pytest` and `python -m pytest`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "data" / "logcorpus"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
QUIET = ("healthy", "benign_warning")  # labels whose logs must give root_cause null
WARNING_ONLY = ("shadow_accounting_off",)  # labels whose logs serve, degraded, with that warning

_NAME = re.compile(r"^[0-9]{3}-([a-z_]+)\.log$")
_SYNTH = re.compile(r"^synthetic-([a-z_]+)-[a-z0-9-]+\.log$")


def _parts() -> dict[str, str]:
    """file name -> its part in INDEX.md ("tuning" / "held out"); the first corpus has none."""
    out: dict[str, str] = {}
    index = CORPUS / "INDEX.md"
    if not index.exists():
        return out
    for line in index.read_text("utf-8").splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 8 and cells[2].startswith("`") and cells[2].endswith(".log`") and cells[7] in ("tuning", "held out"):
            out[cells[2].strip("`")] = cells[7]
    return out


def corpus_logs() -> list[Path]:
    """Every real log the catalogue was tuned on (the held-out part is scored, not tuned: heldout_logs)."""
    if not CORPUS.is_dir():
        return []
    parts = _parts()
    return sorted(p for p in CORPUS.glob("*.log") if _NAME.match(p.name) and parts.get(p.name) != "held out")


def heldout_logs(first: int = 0, last: int = 999) -> list[Path]:
    """The held-out logs numbered first..last (a collection's held-out part: 200-221, 400-448, 600-642, 800-839, 950-980)."""
    parts = _parts()
    return sorted(p for p in CORPUS.glob("*.log")
                  if parts.get(p.name) == "held out" and first <= int(p.name[:3]) <= last)


def synthetic_logs() -> list[Path]:
    return sorted(FIXTURES.glob("synthetic-*.log"))


def label_of(path: Path) -> str:
    m = _NAME.match(path.name) or _SYNTH.match(path.name)
    assert m, path.name
    return m.group(1)


INCONCLUSIVE_MARK = "VERDICT INCONCLUSIVE"  # in an INDEX row: the excerpt shows no sign of serving (issue 31)


def index_inconclusive() -> set[str]:
    """Healthy and benign logs whose INDEX row says the excerpt shows no sign that a server served
    (no ready line, batch or served request: a start-up fragment): a person's reading, so their
    verdict is inconclusive, not healthy."""
    index = CORPUS / "INDEX.md"
    if not index.exists():
        return set()
    out = set()
    for line in index.read_text("utf-8").splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 5 and cells[2].startswith("`") and cells[2].endswith(".log`") and INCONCLUSIVE_MARK in line:
            out.add(cells[2].strip("`"))
    return out


# Healthy logs that a person reads as serving, from an engine whose serving lines diagnose does not
# read (it reads SGLang's batch reports, uvicorn's access lines and the ready milestones): the
# verdict is inconclusive, the safe miss, never healthy from lines it does not know.
SERVING_NOT_READ = {
    "713-healthy.log": "xinfer's 'Decoding: 1 active request(s)' and DFlash stats",
    "830-healthy.log": "xinfer's per-sequence performance metrics ('Decoded: 1348 tokens')",
}


def index_evidence() -> dict[str, str]:
    """file name -> the root-cause evidence substring INDEX.md gives for it."""
    out: dict[str, str] = {}
    index = CORPUS / "INDEX.md"
    if not index.exists():
        return out
    for line in index.read_text("utf-8").splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 5 and cells[2].startswith("`") and cells[2].endswith(".log`"):
            ev = cells[4]
            if ev.startswith("`") and ev.endswith("`"):
                out[cells[2].strip("`")] = ev.strip("`")
    return out


def raw_lines(path: Path) -> list[bytes]:
    """The log's lines. A made-up fixture's header (its leading `# ` lines: what it was built from and
    what it expects) is blanked, not dropped: line numbers stay the file's, and no header line (an
    `# evidence:` that quotes the cause) can be what a rule claims."""
    data = path.read_bytes()
    lines = data.split(b"\n")[:-1] if data.endswith(b"\n") else data.split(b"\n")
    if path.name.startswith("synthetic-"):
        n = 0
        while n < len(lines) and lines[n].startswith(b"# "):
            n += 1
        lines = [b""] * n + lines[n:]
    return lines


def as_journald(lines: list[bytes], unit: str = "sglang-ddtree", pid: int = 41231) -> list[bytes]:
    """journalctl's default `short` format: 'Mon DD HH:MM:SS host ident[pid]: message'."""
    return [f"Jan 10 09:{i // 60 % 60:02d}:{i % 60:02d} ct129 {unit}[{pid}]: ".encode() + ln
            for i, ln in enumerate(lines)]


def as_journal_json(lines: list[bytes], byte_arrays: bool = False) -> list[bytes]:
    """`journalctl -o json`: one object per entry; byte-array MESSAGEs for every third entry."""
    out = []
    for i, ln in enumerate(lines):
        try:
            msg: object = ln.decode("utf-8")
        except UnicodeDecodeError:
            msg = list(ln)
        if byte_arrays and i % 3 == 0:
            msg = list(ln)
        entry = {"__CURSOR": f"s=abc;i={i}", "__REALTIME_TIMESTAMP": str(1767000000000000 + i * 1000),
                 "_PID": "41231", "SYSLOG_IDENTIFIER": "python", "_SYSTEMD_INVOCATION_ID": "0123456789abcdef",
                 "PRIORITY": "6", "MESSAGE": msg}
        out.append(json.dumps(entry).encode())
    return out


@dataclass(frozen=True)
class Expect:
    """What an operator reads first, for one log: the verdict, the root cause's label (None when
    there is none), the warning labels of a degraded log, and the lines reported as harmless."""

    verdict: str
    label: str | None
    warnings: tuple[str, ...] = ()
    harmless: tuple[int, ...] = ()
    warns_at: tuple[tuple[str, int], ...] = ()  # (label, line) of warnings beside a failure
    evidence: str | None = None  # a substring of the root cause's line
    harmless_text: str | None = None  # a line holding this is reported harmless


def verdict_for(label: str, name: str = "") -> str:
    """The verdict a log of this label must get, whatever its root cause: a healthy or benign
    excerpt that shows no sign of serving (its INDEX row says so) is inconclusive."""
    if label in QUIET:
        return "inconclusive" if name in index_inconclusive() else "healthy"
    return "degraded" if label in WARNING_ONLY else "failed"


def expected(path: Path) -> Expect:
    """From the file's name (NNN-<label>.log, synthetic-<label>-what.log) and, in a made-up
    fixture, its header comments: `# expect: degraded LABEL`, `# harmless: LINE ...`,
    `# warns: LABEL@LINE ...`."""
    label = label_of(path)
    verdict = verdict_for(label, path.name)
    exp = Expect(verdict, label if verdict == "failed" else None, (label,) if verdict == "degraded" else ())
    if not path.name.startswith("synthetic-"):
        ev = index_evidence().get(path.name)
        if label == "benign_warning" and path.name not in BENIGN_EVIDENCE_NOT_A_WARNING:
            # the scary line the index names is reported as harmless, not only left alone
            return Expect(exp.verdict, exp.label, harmless_text=ev)
        return Expect(exp.verdict, exp.label, evidence=ev) if exp.label else exp
    for line in path.read_text("utf-8", "replace").splitlines():
        if not line.startswith("# "):
            break
        key, _, rest = line[2:].partition(":")
        words = rest.split()
        if key == "expect" and words and words[0] == "degraded":
            exp = Expect("degraded", None, tuple(words[1:]), exp.harmless, exp.warns_at)
        elif key == "expect" and words and words[0] == "inconclusive":
            exp = Expect("inconclusive", None, (), exp.harmless, exp.warns_at)
        elif key == "harmless":
            exp = Expect(exp.verdict, exp.label, exp.warnings, tuple(int(w) for w in words), exp.warns_at)
        elif key == "warns":
            at = tuple((w.split("@")[0], int(w.split("@")[1])) for w in words)
            exp = Expect(exp.verdict, exp.label, exp.warnings, exp.harmless, at)
        elif key == "evidence":
            exp = Expect(exp.verdict, exp.label, exp.warnings, exp.harmless, exp.warns_at, rest.strip())
    return exp


# benign_warning logs whose index evidence is a normal serving line, not a warning to call harmless
BENIGN_EVIDENCE_NOT_A_WARNING = {
    "032-benign_warning.log": "a decode report ('cuda graph: False' above the captured batch sizes) is not a warning",
}


def misses(report: object, exp: Expect, lines: list[bytes] | None = None) -> list[str]:
    """How a report differs from what the log's expectation says (empty when it holds). The
    evidence substring is looked for in the root cause's line as given (`lines`, unwrapped: the
    index quotes lines with their record prefixes) and in its cleaned text."""
    rep = report  # a classify.Report
    out: list[str] = []
    evidence = exp.evidence
    rc = rep.root_cause  # type: ignore[attr-defined]
    if rep.verdict != exp.verdict:  # type: ignore[attr-defined]
        out.append(f"verdict {rep.verdict} != {exp.verdict}")  # type: ignore[attr-defined]
    got = None if rc is None else rc.label
    if got != exp.label:
        out.append(f"root {got} ({rc.rule_id if rc else '-'}) != {exp.label}")
    if evidence is not None and rc is not None and evidence not in rc.text:
        if evidence not in _given(lines, rc.line):
            out.append(f"evidence {evidence!r} not in line {rc.line}: {rc.text[:120]!r}")
    if exp.verdict == "degraded":
        warned = sorted({f.label for f in rep.warnings})  # type: ignore[attr-defined]
        if warned != sorted(exp.warnings):
            out.append(f"warnings {warned} != {sorted(exp.warnings)}")
    benign = {f.line for f in rep.findings if f.severity == "benign"}  # type: ignore[attr-defined]
    for n in exp.harmless:
        if n not in benign:
            out.append(f"line {n} not reported harmless")
    if exp.harmless_text is not None and not any(
            f.severity == "benign" and (exp.harmless_text in f.text or exp.harmless_text in _given(lines, f.line))
            for f in rep.findings):  # type: ignore[attr-defined]
        out.append(f"{exp.harmless_text!r} not reported harmless")
    for label, n in exp.warns_at:
        if not any(f.line == n and f.label == label and f.severity == "warning" for f in rep.findings):  # type: ignore[attr-defined]
            out.append(f"no {label} warning at line {n}")
    return out


def _given(lines: list[bytes] | None, n: int) -> str:
    """Input line n (1-based) as given, with its record prefixes (what the index quotes)."""
    return lines[n - 1].decode("utf-8", "replace") if lines and 0 < n <= len(lines) else ""


def message_lines(lines: list[bytes]) -> dict[int, int]:
    """Input line (1-based) -> the first line of the multi-line message it belongs to: an exception
    line and the message lines CPython prints under it, inside one traceback. Lines outside such a
    message are absent (each is a message of its own)."""
    from ddtree_ops.diagnose import journal

    tb = journal.TracebackTracker()
    out: dict[int, int] = {}
    head = 0
    for i, raw in enumerate(lines, 1):
        text, record = journal.clean_line(raw.decode("utf-8", "replace"))
        group, kind = tb.step(text, record, i)
        if group is not None and kind == "exc":
            head = i
            out[i] = i
        elif group is not None and kind == "msg" and head:
            out[i] = head
        else:
            head = 0
    return out


def cites_evidence_line(report: object, evidence: str, lines: list[bytes]) -> bool:
    """Whether the root cause's line is the line a person points at: the input line that holds the
    INDEX's evidence substring, or a line of the same multi-line message (issue 31's figure)."""
    rc = report.root_cause  # type: ignore[attr-defined]
    if rc is None or not 0 < rc.line <= len(lines):
        return False
    where = [i for i, ln in enumerate(lines, 1) if evidence in ln.decode("utf-8", "replace")]
    if rc.line in where:
        return True
    block = message_lines(lines)
    return rc.line in block and any(block.get(i) == block[rc.line] for i in where)
