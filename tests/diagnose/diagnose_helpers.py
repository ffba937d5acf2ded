"""Helpers for the diagnose tests: the real log corpus, synthetic fixtures, journal wrappers.

Imported as `diagnose_helpers` (pytest puts this directory on sys.path), so the tests run the same
under `pytest` and `python -m pytest`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "data" / "logcorpus"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
QUIET = ("healthy", "benign_warning")  # labels whose logs must give root_cause null

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


def heldout_logs() -> list[Path]:
    parts = _parts()
    return sorted(p for p in CORPUS.glob("*.log") if parts.get(p.name) == "held out")


def synthetic_logs() -> list[Path]:
    return sorted(FIXTURES.glob("synthetic-*.log"))


def label_of(path: Path) -> str:
    m = _NAME.match(path.name) or _SYNTH.match(path.name)
    assert m, path.name
    return m.group(1)


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
    return path.read_bytes().split(b"\n")[:-1] if path.read_bytes().endswith(b"\n") else path.read_bytes().split(b"\n")


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
