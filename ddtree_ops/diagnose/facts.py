"""Numbers a log carries besides its errors: SGLang's memory report and the acceptance length.

- `MemoryFacts` / `parse_memory`: the KV pool, the weights, what was left after startup (compared
  with the preflight prediction by `diagnose HOST`).
- `AcceptTracker`: the decode reports' `accept len`; three in a row at exactly 1.00 mean no drafted
  token is ever accepted (the draft sees no target hidden states), unless the weights are random.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

ACCEPT_LOW = 1.10  # below this the drafter is not helping
ACCEPT_STREAK = 3  # consecutive decode reports at exactly 1.00 that mean "capture is missing"
ACCEPT_RX = re.compile(r"accept len: ([0-9]+\.[0-9]+)")
RECENT = 16  # accept lengths kept for the report


@dataclass(frozen=True)
class MemoryFacts:
    """SGLang's own memory report, for comparison with the preflight prediction."""

    kv_tokens: int | None = None  # "KV Cache is allocated. #tokens: N"
    k_size_gb: float | None = None
    v_size_gb: float | None = None
    max_total_num_tokens: int | None = None
    available_gpu_mem_gb: float | None = None  # after startup, in the max_total_num_tokens line
    weights_gb: float | None = None  # "Load weight end ... mem usage=X GB"
    context_len: int | None = None
    max_running_requests: int | None = None

    @property
    def kv_gb(self) -> float | None:
        if self.k_size_gb is None or self.v_size_gb is None:
            return None
        return self.k_size_gb + self.v_size_gb

    def any(self) -> bool:
        return any(v is not None for v in self.__dict__.values())

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


_NUM = r"([0-9]+(?:\.[0-9]+)?)"
_MEM_PARSERS: tuple[tuple[re.Pattern[str], tuple[tuple[str, type], ...]], ...] = (
    (re.compile(r"KV Cache is allocated\.[^#]{0,80}#tokens: ([0-9]+), K size: " + _NUM + r" GB, V size: " + _NUM + " GB"),
     (("kv_tokens", int), ("k_size_gb", float), ("v_size_gb", float))),
    (re.compile(r"KV Cache is allocated\.[^#]{0,80}#tokens: ([0-9]+)"), (("kv_tokens", int),)),
    (re.compile(r"max_total_num_tokens=([0-9]+)"), (("max_total_num_tokens", int),)),
    (re.compile(r"max_running_requests=([0-9]+)"), (("max_running_requests", int),)),
    (re.compile(r"context_len=([0-9]+)"), (("context_len", int),)),
    (re.compile(r"available_gpu_mem=" + _NUM + " GB"), (("available_gpu_mem_gb", float),)),
    (re.compile(r"Load weight end\..{0,400}?mem usage=" + _NUM + " GB"), (("weights_gb", float),)),
)


def parse_memory(text: str, facts: MemoryFacts | None = None) -> MemoryFacts:
    """Numbers from one SGLang memory line, merged into `facts`. The first report of a number
    wins: SGLang logs the target's weights and KV pool before a draft model's own."""
    facts = facts if facts is not None else MemoryFacts()
    updates: dict[str, Any] = {}
    for rx, fields in _MEM_PARSERS:
        m = rx.search(text)
        if not m:
            continue
        for (name, kind), value in zip(fields, m.groups(), strict=False):
            if name not in updates and getattr(facts, name) is None:
                updates[name] = kind(value)
    return replace(facts, **updates) if updates else facts


@dataclass(frozen=True)
class AcceptStats:
    low_reports: int = 0  # decode reports below ACCEPT_LOW
    recent: tuple[float, ...] = ()  # the last accept lengths, oldest first
    longest_one_streak: int = 0

    @property
    def last(self) -> float | None:
        return self.recent[-1] if self.recent else None

    def to_json(self) -> dict[str, Any]:
        return {"recent": list(self.recent), "last": self.last, "low_reports": self.low_reports,
                "longest_streak_at_1.00": self.longest_one_streak}


class AcceptTracker:
    """The run of decode reports at exactly 1.00, over the reports the scanner sees.

    The screen only hands over reports at 1.0x; a report it skipped was not low, so the scanner
    calls `broken()` when one lies between two it saw.
    """

    def __init__(self) -> None:
        self.streak = 0  # consecutive decode reports at exactly 1.00
        self.longest = 0
        self.low_reports = 0
        self.reported = False
        self.recent: deque[float] = deque(maxlen=RECENT)

    def report(self, text: str, random_weights: bool) -> re.Match[str] | None:
        """One decode report; returns its match when it completes the first stuck streak."""
        m = ACCEPT_RX.search(text)
        if not m:
            return None
        value = float(m.group(1))
        if value < ACCEPT_LOW:
            self.low_reports += 1
        if value > 1.0:
            self.streak = 0
            return None
        self.streak += 1
        self.longest = max(self.longest, self.streak)
        # with random weights (--load-format dummy) no draft token is ever accepted: that is expected
        if self.streak >= ACCEPT_STREAK and not self.reported and not random_weights:
            self.reported = True
            return m
        return None

    def broken(self) -> None:
        self.streak = 0

    def note_recent(self, buf: bytes, start: int, end: int) -> None:
        """The last few accept lengths of a block (they are not screen hits when healthy)."""
        key = b"accept len: "
        vals: list[float] = []
        while len(vals) < RECENT and end > start:
            i = buf.rfind(key, start, end)
            if i < 0:
                break
            m = ACCEPT_RX.match(buf[i:i + 40].decode("ascii", "replace"))
            if m:
                vals.append(float(m.group(1)))
            end = i
        if vals:
            self.recent.extend(reversed(vals))

    def stats(self) -> AcceptStats:
        return AcceptStats(low_reports=self.low_reports, recent=tuple(self.recent), longest_one_streak=self.longest)
