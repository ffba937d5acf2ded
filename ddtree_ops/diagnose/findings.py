"""What a diagnosis says: findings, the report, and the one-line signature of an unnamed crash.

A `Finding` is one line a rule claimed (or one fact the scanner derived); a `Report` is the
verdict, the root cause chosen among the findings, and the numbers the log carried.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ddtree_ops.diagnose import journal
from ddtree_ops.diagnose.facts import AcceptStats, MemoryFacts
from ddtree_ops.diagnose.fingerprint import Description


@dataclass(frozen=True)
class Finding:
    label: str
    severity: str  # fatal | warning | benign
    line: int  # 1-based line number in the input
    text: str  # the cleaned message line
    evidence: str  # the matched substring (the whole line for generic backstops)
    remedy: str
    profile_key: str | None
    direction: str | None  # raise | lower | None
    rule_id: str
    role: str = "cause"
    meaning: str = ""
    group: int | None = None  # traceback group id, None outside tracebacks
    hardware: bool = False  # an Xid that means "do not roll back the software"
    frames: tuple[str, ...] = ()  # inside a traceback: the innermost frame, ours, the engine's
    signature: str = ""  # for an unnamed crash: a one-line signature to search issue trackers for
    context: str = ""  # the lines of the log that named the cause (server_args, the raising frame)
    # an unnamed failure (unclassified_crash): its component, exception and fingerprint (fingerprint.py)
    description: Description | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label, "severity": self.severity, "line": self.line, "evidence": self.evidence,
            "text": self.text, "remedy": self.remedy, "profile_key": self.profile_key,
            "direction": self.direction, "rule_id": self.rule_id, "role": self.role,
            **({"hardware": True} if self.hardware else {}),
            **({"frames": list(self.frames)} if self.frames else {}),
            **({"signature": self.signature} if self.signature else {}),
            **({"context": self.context} if self.context else {}),
            **({"fingerprint": self.description.to_json()} if self.description is not None else {}),
        }




@dataclass(frozen=True)
class Report:
    verdict: str  # healthy | degraded | failed | inconclusive (root.verdict_of); a live host may be unreadable
    root_cause: Finding | None
    findings: list[Finding]
    lines: int = 0
    ready_line: int | None = None
    memory: MemoryFacts = field(default_factory=MemoryFacts)
    accept: AcceptStats = field(default_factory=AcceptStats)
    suppressed: dict[str, int] = field(default_factory=dict)  # rule id -> findings not kept
    launch: dict[str, Any] = field(default_factory=dict)  # what the log says about this start (algorithm, weights, stop)
    claimed: dict[str, int] = field(default_factory=dict)  # rule id -> lines it claimed (not in the JSON)
    serving: tuple[int, str] | None = None  # the last evidence that this start served: (line, what)

    @property
    def dummy_weights(self) -> bool:
        """`--load-format dummy`: random weights, so an acceptance length of 1.00 means nothing."""
        return self.launch.get("load_format") == "dummy"

    @property
    def fatal(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "fatal"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    def not_found(self) -> str:
        """What an inconclusive verdict read and did not find (issue 31: it says so)."""
        found = "no failure signature" if not self.warnings else f"{len(self.warnings)} warning(s) and no failure"
        return (f"{found} in {self.lines} line(s), and no sign that this start served: no ready line, no decode "
                "batch, no served request")

    def to_json(self) -> dict[str, Any]:
        rc = None
        if self.root_cause is not None:
            f = self.root_cause
            rc = {"label": f.label, "line": f.line, "evidence": f.evidence, "remedy": f.remedy,
                  "text": f.text, "profile_key": f.profile_key, "direction": f.direction,
                  "rule_id": f.rule_id, "meaning": f.meaning, **({"hardware": True} if f.hardware else {}),
                  **({"frames": list(f.frames)} if f.frames else {}),
                  **({"signature": f.signature} if f.signature else {}),
                  **({"context": f.context} if f.context else {}),
                  **({"fingerprint": f.description.to_json()} if f.description is not None else {})}
        doc: dict[str, Any] = {
            "verdict": self.verdict,
            "root_cause": rc,
            "findings": [f.to_json() for f in self.findings],
            "lines": self.lines,
            "ready_line": self.ready_line,
            "serving": None if self.serving is None else {"line": self.serving[0], "evidence": self.serving[1]},
        }
        if self.verdict == "inconclusive":
            doc["inconclusive"] = self.not_found()
        if self.memory.any():
            doc["memory"] = self.memory.to_json()
        if self.accept.recent:
            doc["accept_len"] = self.accept.to_json()
        if self.suppressed:
            doc["suppressed"] = dict(self.suppressed)
        if self.launch:
            doc["launch"] = dict(self.launch)
        return doc



_SIG_NUM = re.compile(r"0x[0-9a-fA-F]+|[0-9]+")
_SIG_PATH = re.compile(r"(?:/[^/\s'\"]+){2,}/")


def crash_signature(exception: str, frames: list[journal.Frame]) -> str:
    """One line to search an issue tracker with: the exception without its numbers and paths,
    and the innermost engine frame (file and function, not line numbers, which move)."""
    sig = _SIG_PATH.sub("", _SIG_NUM.sub("N", exception.strip()))[:160]
    engine = next((f for f in reversed(frames) if any(m in f.path for m in journal.ENGINE_PATHS)), None)
    where = engine or (frames[-1] if frames else None)
    if where is not None:
        short = where.short().rsplit(":", 1)[0] if ":" in where.short() else where.short()
        sig += f" ({short} in {where.func})" if where.func else f" ({short})"
    return sig
