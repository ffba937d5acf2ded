"""Classify a journal or log: lines in, findings and a root cause out. Pure: no I/O, no clock.

How a scan works (and why it is fast on a healthy gigabyte):
1. A keyword screen runs over whole blocks of raw bytes in C. Every catalogue pattern has a
   mandatory literal; from each literal the catalogue picks a substring starting at a byte that
   is rare in healthy SGLang serving lines, grouped so that few distinct first bytes cover all of
   them. Each first byte becomes one regex `b(?:rest|rest...)`, which `re` searches with its
   literal-prefix fast path, so a boring line costs no Python work at all.
2. Only the lines the screen hits are decoded, stripped of journald/container/Ray/rank prefixes
   (`journal.clean_line`) and matched against the rules in catalogue order (first match wins).
3. A line that opens a Python traceback switches to line-by-line mode until the traceback ends,
   so that the exception line, its chained parts and the files that raised are known.
4. The root cause is chosen over findings, not lines: the first cause in time, where a wrapper
   yields to the cause inside it, an NCCL/watchdog echo yields to an earlier unexplained crash,
   and secondary symptoms only explain a failure when nothing else does.

`Scanner` is the incremental form (the deploy gate feeds it each poll's new lines);
`classify(lines)` is `Scanner().feed(lines)` + `report()`, and feeding in chunks gives the same
report as feeding everything at once.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field, replace
from functools import lru_cache, cache
from importlib import resources
from pathlib import Path
from typing import IO, Any
from collections.abc import Iterable, Iterator

from ddtree_ops.diagnose import journal

LABELS = (
    "healthy", "benign_warning", "kv_pool_too_small", "cuda_oom", "host_oom", "cuda_lib_load",
    "abi_mismatch", "cuda_driver_incompatible", "unsupported_gpu_arch", "cuda_graph_capture",
    "illegal_memory_access", "nccl_error", "watchdog_timeout", "port_bind_error", "model_not_found",
    "hf_download_blocked", "tokenizer_error", "spec_decode_misconfig", "flashinfer_jit_error",
    "triton_compile_error", "hidden_capture_missing", "bad_launch_flags", "unclassified_crash",
)
SEVERITIES = ("fatal", "warning", "benign", "info")
ROLES = ("cause", "wrapper", "downstream", "consequence", "backstop", "benign", "info")
DIRECTIONS = (None, "raise", "lower")

MAX_MATCH_CHARS = 16384  # a hit inside a longer line is matched in a window around the hit
MAX_TEXT_CHARS = 2000  # what a finding keeps of its line
MAX_PER_RULE = 50  # findings kept per rule (the rest are counted): a 1 GB journal stays small
ACCEPT_LOW = 1.10  # below this the drafter is not helping
ACCEPT_STREAK = 3  # consecutive decode reports at exactly 1.00 that mean "capture is missing"

# Representative healthy SGLang serving lines under journald (formats from
# srt/managers/scheduler_components/metrics_reporter.py and uvicorn's access log): the screen
# picks keyword bytes that are rare here and suffixes that never occur here. Only speed depends
# on this sample, never correctness.
def _healthy_sample() -> str:
    out = []
    for i in range(40):
        ts = f"Nov 29 07:{i % 60:02d}:{(i * 7) % 60:02d} ct129 sglang-ddtree[41231]: [2025-11-29 07:{i % 60:02d}:{(i * 7) % 60:02d}"
        tp = " TP0]" if i % 3 == 0 else "]"
        n = 1 + i % 8
        out.append(f"{ts}{tp} Decode batch, #running-req: {n}, #token: {1000 + i * 997}, token usage: 0.{i % 97:02d}, "
                   f"accept len: {1.5 + (i % 25) / 10:.2f}, accept rate: 0.{(i * 13) % 97:02d}, cuda graph: True, "
                   f"gen throughput (token/s): {100 + i * 31.7:.2f}, #queue-req: 0, ")
        if i % 2 == 0:
            out.append(f"{ts}{tp} Prefill batch, #new-seq: 1, #new-token: {30 + i * 41}, #cached-token: {i * 16}, "
                       f"token usage: 0.{i % 89:02d}, #running-req: {n - 1}, #queue-req: 0, #pending-token: 0, ")
        path = ("/generate", "/v1/chat/completions", "/health_generate", "/v1/completions")[i % 4]
        verb = "GET" if path.startswith("/health") else "POST"
        out.append(f'{ts}] INFO:     127.0.0.1:{38000 + i * 7} - "{verb} {path} HTTP/1.1" 200 OK')
    return "\n".join(out) + "\n"


_HEALTHY_SAMPLE = _healthy_sample()


# ------------------------------------------------------------------ catalogue


@dataclass(frozen=True)
class Rule:
    id: str
    label: str
    severity: str
    role: str
    patterns: tuple[str, ...]
    order: int
    meaning: str = ""
    remedy: str = ""
    direction: str | None = None
    profile_key: str | None = None
    references: tuple[str, ...] = ()
    frames: tuple[str, ...] = ()
    defer_within: int = 0
    xid_hardware: frozenset[int] = frozenset()
    literals: tuple[str, ...] = ()  # any-of: a line matching any pattern holds one of these

    def search(self, text: str) -> re.Match[str] | None:
        for rx in _compiled(self.patterns):
            m = rx.search(text)
            if m:
                return m
        return None


@cache
def _compiled(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p) for p in patterns)


class CatalogueError(ValueError):
    """The catalogue file is malformed (a bug in the shipped data or a local edit)."""


# Not valid in POSIX ERE or ambiguous between Python and grep -E.
_NON_PORTABLE = re.compile(r"\\[dDsSwWbBAZ0-9]|\(\?|\*\?|\+\?|\?\?|\}\?")


def _required_literal_sets(pattern: str) -> list[list[str]]:
    """Sets of literals (any-of) such that every match of `pattern` contains one of each set."""
    try:
        from re import _constants as c  # type: ignore[attr-defined]
        from re import _parser as sre_parse  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - Python < 3.11
        import sre_constants as c  # type: ignore[no-redef]
        import sre_parse  # type: ignore[no-redef]

    def finite(seq: Any, limit: int = 64) -> list[str] | None:
        """Every string `seq` can match, when that is a small finite set of literals."""
        out = [""]
        for op, av in seq:
            if op is c.LITERAL:
                alts = [chr(av)]
            elif op is c.SUBPATTERN:
                alts = finite(av[-1], limit)
            elif op is c.BRANCH:
                alts = []
                for alt in av[1]:
                    sub = finite(alt, limit)
                    if sub is None:
                        return None
                    alts += sub
            else:
                return None
            if alts is None or len(out) * len(alts) > limit:
                return None
            out = [a + b for a in out for b in alts]
        return out

    # consecutive literal and small-alternation items multiply out into one literal set
    sets: list[list[str]] = []
    run: list[str] = [""]

    def flush() -> None:
        nonlocal run
        if run != [""]:
            sets.append(run)
        run = [""]

    for op, av in sre_parse.parse(pattern):
        alts = finite([(op, av)]) if op in (c.LITERAL, c.SUBPATTERN, c.BRANCH) else None
        if alts is None or len(run) * len(alts) > 64:
            flush()
            if alts is not None:
                run = list(alts)
            continue
        run = [a + b for a in run for b in alts]
    flush()
    return sets


def _byte_freq(sample: str) -> dict[str, float]:
    counts: dict[str, int] = {}
    for ch in sample:
        counts[ch] = counts.get(ch, 0) + 1
    total = max(1, len(sample))
    return {ch: n / total for ch, n in counts.items()}


_FREQ = _byte_freq(_HEALTHY_SAMPLE)
_RARE = 0.001  # below this share of bytes an anchor is found with memchr, not a regex pass
_RARE_SPACING = 1000  # memchr loop gives up when the anchor is denser than 1 per this many bytes


def _anchor_cost(ch: str) -> float:
    """Relative cost per MB of screening for one anchor byte (measured on CPython 3.11).

    A regex pass with a one-byte literal prefix runs at ~1.3 GB/s and slows with the byte's
    frequency; a memchr loop is ~10x faster but pays ~0.6 us of Python per occurrence.
    """
    f = _FREQ.get(ch, 0.0)
    return min(0.15 + 800.0 * f, 1.0 + 19.0 * f) if f < _RARE else 1.0 + 19.0 * f


def _literal_options(pattern: str) -> list[tuple[str, ...]]:
    """The pattern's usable literal sets (every alternative 3+ characters long)."""
    sets = [tuple(s) for s in _required_literal_sets(pattern) if all(len(x) >= 3 for x in s)]
    if not sets:
        raise CatalogueError(f"pattern {pattern!r} has no literal of 3+ characters outside "
                             "alternations and optional parts; the keyword screen needs one")
    return sets


@dataclass(frozen=True)
class Catalogue:
    rules: tuple[Rule, ...]
    version: int = 1
    anchors: tuple[str, ...] = ()  # the keyword screen's anchor bytes (see plan_screen)

    @property
    def by_id(self) -> dict[str, Rule]:
        return {r.id: r for r in self.rules}

    def patterns(self) -> list[str]:
        """Every pattern, in priority order (what `grep -E -f` gets in the benchmark)."""
        return [p for r in self.rules for p in r.patterns]


def _rule(raw: dict[str, Any], order: int) -> Rule:
    where = f"rule {raw.get('id', f'#{order}')!r}"
    for key in ("id", "label", "severity", "role", "patterns"):
        if key not in raw:
            raise CatalogueError(f"{where}: missing {key!r}")
    if raw["label"] not in LABELS:
        raise CatalogueError(f"{where}: label {raw['label']!r} is not one of the fixed labels")
    if raw["severity"] not in SEVERITIES:
        raise CatalogueError(f"{where}: severity must be one of {', '.join(SEVERITIES)}")
    if raw["role"] not in ROLES:
        raise CatalogueError(f"{where}: role must be one of {', '.join(ROLES)}")
    patterns = raw["patterns"]
    if not isinstance(patterns, list) or not patterns or not all(isinstance(p, str) for p in patterns):
        raise CatalogueError(f"{where}: patterns must be a non-empty list of strings")
    for p in patterns:
        if _NON_PORTABLE.search(p):
            raise CatalogueError(f"{where}: pattern {p!r} uses syntax outside the Python/ERE subset")
        try:
            re.compile(p)
        except re.error as exc:
            raise CatalogueError(f"{where}: pattern {p!r} does not compile: {exc}") from None
        _literal_options(p)
    remedy = raw.get("remedy") or {}
    if remedy.get("direction") not in DIRECTIONS:
        raise CatalogueError(f"{where}: remedy.direction must be raise, lower or null")
    return Rule(
        id=str(raw["id"]), label=raw["label"], severity=raw["severity"], role=raw["role"],
        patterns=tuple(patterns), order=order, meaning=" ".join(str(raw.get("meaning", "")).split()),
        remedy=" ".join(str(remedy.get("text", "")).split()), direction=remedy.get("direction"),
        profile_key=remedy.get("profile_key"), references=tuple(str(r) for r in raw.get("references", [])),
        frames=tuple(raw.get("frames", [])), defer_within=int(raw.get("defer_within", 0)),
        xid_hardware=frozenset(int(x) for x in raw.get("xid_hardware", [])),
    )


def parse_catalogue(text: str) -> Catalogue:
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CatalogueError(f"catalogue is not valid YAML: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rules"), list):
        raise CatalogueError("catalogue must be a mapping with a 'rules' list")
    rules = tuple(_rule(raw, i) for i, raw in enumerate(doc["rules"]))
    # every pattern's keywords, chosen together with the screen's anchor bytes
    plan = plan_screen([_literal_options(p) for r in rules for p in r.patterns])
    chosen = iter(plan.per_pattern)
    rules = tuple(replace(r, literals=tuple(dict.fromkeys(x for _ in r.patterns for x in next(chosen))))
                  for r in rules)
    seen: set[str] = set()
    for r in rules:
        if r.id in seen:
            raise CatalogueError(f"rule id {r.id!r} appears twice")
        seen.add(r.id)
    return Catalogue(rules=rules, version=int(doc.get("version", 1)), anchors=plan.anchors)


@lru_cache(maxsize=4)
def load_catalogue(path: str | None = None) -> Catalogue:
    """The shipped catalogue (or one at `path`, for experiments); parsed once per process."""
    if path is None:
        text = resources.files("ddtree_ops.diagnose").joinpath("catalogue.yaml").read_text("utf-8")
    else:
        text = Path(path).read_text("utf-8")
    return parse_catalogue(text)


# ------------------------------------------------------------------ the keyword screen

# Keywords the engine itself needs besides the catalogue's.
_ACCEPT = "accept len: "
_ACCEPT_B = _ACCEPT.encode()
_EXTRA_KEYWORDS = (journal.TRACEBACK_HEADER, "accept len: 1.0")


def _trie_regex(words: list[str]) -> str:
    """A regex for an alternation of literals, factored by common prefixes (fewer branch tries)."""
    if "" in words:
        rest = [w for w in words if w]
        return "(?:" + _trie_regex(rest) + ")?" if rest else ""
    groups: dict[str, list[str]] = {}
    for w in sorted(set(words)):
        groups.setdefault(w[0], []).append(w[1:])
    parts = [re.escape(ch) + _trie_regex(tails) for ch, tails in groups.items()]
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


@dataclass(frozen=True)
class Screen:
    """One regex per anchor byte; together they hit every line any rule could match."""

    regexes: tuple[re.Pattern[bytes], ...]
    keywords: tuple[str, ...]
    anchors: tuple[str, ...]

    rare: tuple[bool, ...] = ()  # per regex: its anchor byte is rare in healthy lines

    def hits(self, buf: bytes, start: int = 0, end: int | None = None) -> list[int]:
        """Offsets where a keyword starts (a superset of the lines any rule matches)."""
        end = len(buf) if end is None else end
        found: list[int] = []
        budget = (end - start) // _RARE_SPACING + 64
        for rx, rare in zip(self.regexes, self.rare, strict=False):
            pos = start
            if rare:
                # memchr for a byte that healthy lines almost never contain; if this input is
                # full of it after all, hand the rest of the block to the regex engine
                anchor = rx.pattern[:1]
                match = rx.match
                find = buf.find
                seen = 0
                while True:
                    i = find(anchor, pos, end)
                    if i < 0:
                        pos = end
                        break
                    if match(buf, i):
                        found.append(i)
                    pos = i + 1
                    seen += 1
                    if seen > budget:
                        break
            if pos < end:
                found.extend(m.start() for m in rx.finditer(buf, pos, end))
        found.sort()
        return found


@dataclass(frozen=True)
class ScreenPlan:
    anchors: tuple[str, ...]
    per_pattern: tuple[tuple[str, ...], ...]  # the keyword set chosen for each pattern


_MIN_SUFFIX = 3


def _anchor_positions(word: str) -> list[int]:
    """Where a keyword may be found from: an ASCII byte with 2+ characters after it, whose
    suffix never occurs in healthy serving lines (else every boring line would be a hit)."""
    n = min(_MIN_SUFFIX, len(word))
    ok = [i for i in range(len(word) - n + 1) if ord(word[i]) < 128 and word[i:] not in _HEALTHY_SAMPLE]
    return ok or [0]


def _anchor_options(word: str) -> set[str]:
    return {word[i] for i in _anchor_positions(word)}


def plan_screen(pattern_sets: list[list[tuple[str, ...]]]) -> ScreenPlan:
    """Choose few cheap anchor bytes such that every pattern has a keyword set they cover.

    A pattern is covered when, for one of its literal sets, every alternative contains an anchor
    byte with at least 3 more characters after it. Greedy weighted set cover: each anchor costs
    what `_anchor_cost` estimates. Bitmasks keep this to a few milliseconds.
    """
    pattern_sets = [*pattern_sets, *[[(k,)] for k in _EXTRA_KEYWORDS]]
    words = {w for sets in pattern_sets for s in sets for w in s}
    chars = sorted(set().union(*(_anchor_options(w) for w in words))) if words else []
    bit = {ch: 1 << i for i, ch in enumerate(chars)}
    mask = {w: sum(bit[ch] for ch in _anchor_options(w)) for w in words}
    pmasks = [[[mask[w] for w in s] for s in sets] for sets in pattern_sets]

    def covered(pm: list[list[int]], anchors: int) -> bool:
        return any(all(m & anchors for m in s) for s in pm)

    def greedy(todo: list[int], anchors: int) -> int:
        left = [i for i in todo if not covered(pmasks[i], anchors)]
        def gain(ch: str, anchors: int, left: list[int]) -> float:
            trial = anchors | bit[ch]
            return sum(1 for i in left if covered(pmasks[i], trial)) / _anchor_cost(ch)

        while left:
            free = [ch for ch in chars if not anchors & bit[ch]]
            best = max(free, key=lambda ch: (gain(ch, anchors, left), -ord(ch)))
            if gain(best, anchors, left) == 0:
                # no single byte completes a set: take the one in the most keywords
                best = max(free, key=lambda ch: sum(1 for i in left for s in pmasks[i] for m in s if m & bit[ch]))
            anchors |= bit[best]
            left = [i for i in left if not covered(pmasks[i], anchors)]
        return anchors

    everything = list(range(len(pattern_sets)))
    cheap = sum(bit[ch] for ch in chars if _anchor_cost(ch) < 0.5)
    # patterns no cheap byte can cover decide the expensive passes; cheap bytes do the rest
    forced = [i for i in everything if not covered(pmasks[i], cheap)]
    anchors = greedy(everything, greedy(forced, 0))
    for ch in sorted(chars, key=_anchor_cost, reverse=True):  # drop anchors that became redundant
        if anchors & bit[ch] and all(covered(pm, anchors & ~bit[ch]) for pm in pmasks):
            anchors &= ~bit[ch]

    def selectivity(s: tuple[str, ...]) -> float:
        return max(100.0 * min(_FREQ.get(ch, 0.0) for ch in x) + 1.0 / len(x) for x in s)

    per = tuple(min((s for s in sets if all(mask[w] & anchors for w in s)), key=selectivity)
                for sets in pattern_sets[: len(pattern_sets) - len(_EXTRA_KEYWORDS)])
    return ScreenPlan(anchors=tuple(ch for ch in chars if anchors & bit[ch]), per_pattern=per)


def build_screen(keywords: Iterable[str], anchors: Iterable[str]) -> Screen:
    """For each keyword the suffix from its rarest anchor byte; one trie regex per anchor."""
    anchor_set = set(anchors)
    by_anchor: dict[str, set[str]] = {}
    kws = sorted({k for k in keywords if k})
    for k in kws:
        starts = [i for i in _anchor_positions(k) if k[i] in anchor_set]
        if not starts:
            raise CatalogueError(f"keyword {k!r} has no anchor byte among {sorted(anchor_set)}")
        # the rarest anchor byte; among equals the longest suffix (fewest false hits)
        i = min(starts, key=lambda j: (_anchor_cost(k[j]), j))
        by_anchor.setdefault(k[i], set()).add(k[i:])
    items = sorted(by_anchor.items())
    regexes = [re.compile(_trie_regex(sorted(sufs)).encode("utf-8")) for _, sufs in items]
    rare = tuple(_FREQ.get(ch, 0.0) < _RARE for ch, _ in items)
    return Screen(regexes=tuple(regexes), keywords=tuple(kws), anchors=tuple(ch for ch, _ in items), rare=rare)


@lru_cache(maxsize=4)
def _screen_for(cat: Catalogue) -> Screen:
    kws = [lit for r in cat.rules for lit in r.literals]
    return build_screen([*kws, *_EXTRA_KEYWORDS], cat.anchors)


# ------------------------------------------------------------------ results


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

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label, "severity": self.severity, "line": self.line, "evidence": self.evidence,
            "text": self.text, "remedy": self.remedy, "profile_key": self.profile_key,
            "direction": self.direction, "rule_id": self.rule_id, "role": self.role,
            **({"hardware": True} if self.hardware else {}),
        }


@dataclass(frozen=True)
class MemoryFacts:
    """SGLang's own memory report, for comparison with the preflight prediction."""

    kv_tokens: int | None = None  # "KV Cache is allocated. #tokens: N"
    k_size_gb: float | None = None
    v_size_gb: float | None = None
    max_total_num_tokens: int | None = None
    available_gpu_mem_gb: float | None = None  # after startup, in the max_total_num_tokens line
    weights_gb: float | None = None  # "Load weight end ... mem usage=X GB"
    cuda_graph_gb: float | None = None  # "Capture cuda graph end ... mem usage=X GB"
    pool_end_avail_gb: float | None = None  # "Memory pool end. avail mem=X GB"
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


@dataclass(frozen=True)
class Report:
    verdict: str  # healthy | degraded | failed
    root_cause: Finding | None
    findings: list[Finding]
    lines: int = 0
    ready_line: int | None = None
    memory: MemoryFacts = field(default_factory=MemoryFacts)
    accept: AcceptStats = field(default_factory=AcceptStats)
    suppressed: dict[str, int] = field(default_factory=dict)  # rule id -> findings not kept

    @property
    def fatal(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "fatal"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    def to_json(self) -> dict[str, Any]:
        rc = None
        if self.root_cause is not None:
            f = self.root_cause
            rc = {"label": f.label, "line": f.line, "evidence": f.evidence, "remedy": f.remedy,
                  "text": f.text, "profile_key": f.profile_key, "direction": f.direction,
                  "rule_id": f.rule_id, "meaning": f.meaning, **({"hardware": True} if f.hardware else {})}
        doc: dict[str, Any] = {
            "verdict": self.verdict,
            "root_cause": rc,
            "findings": [f.to_json() for f in self.findings],
            "lines": self.lines,
            "ready_line": self.ready_line,
        }
        if self.memory.any():
            doc["memory"] = self.memory.to_json()
        if self.accept.recent:
            doc["accept_len"] = self.accept.to_json()
        if self.suppressed:
            doc["suppressed"] = dict(self.suppressed)
        return doc


# ------------------------------------------------------------------ number parsers

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
    (re.compile(r"Capture (?:[a-z ]{0,40}CUDA graph|cuda graph) end\..{0,400}?mem usage=" + _NUM + " GB"), (("cuda_graph_gb", float),)),
    (re.compile(r"Memory pool end\. avail mem=" + _NUM + " GB"), (("pool_end_avail_gb", float),)),
)
_ACCEPT_RX = re.compile(r"accept len: ([0-9]+\.[0-9]+)")
_XID_RX = re.compile(r"NVRM: Xid \([^)]{0,64}\): ([0-9]{1,4})")


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


# ------------------------------------------------------------------ the scanner


def _to_bytes(line: str | bytes) -> bytes:
    if isinstance(line, bytes):
        return line
    return line.encode("utf-8", "surrogateescape")


_HELD_ROLES = ("wrapper", "backstop", "consequence")  # held while their traceback is still open
_ROLE_IN_GROUP = {"cause": 0, "downstream": 0, "wrapper": 1, "backstop": 2, "consequence": 3}
_ROLE_CLASS = {"cause": 0, "downstream": 0, "wrapper": 0, "backstop": 1, "consequence": 2}


class Scanner:
    """Incremental classifier: feed lines as they arrive, ask for the report at any time.

    `feed()` returns the findings confirmed by the new lines. A specific cause is returned at
    once (the gate fails on it in the same poll); generic evidence inside a traceback (its
    header, a wrapper, an unnamed exception) is held until the traceback ends or `report()` is
    called, so a poll boundary inside a traceback never reports an unexplained crash before the
    line that explains it arrives.
    """

    def __init__(self, catalogue: Catalogue | None = None) -> None:
        self.cat = catalogue or load_catalogue()
        self.screen = _screen_for(self.cat)
        self._rules = self.cat.rules
        self._by_id = self.cat.by_id
        self._defer = {r.id: r.defer_within for r in self.cat.rules if r.defer_within}
        self._tb = journal.TracebackTracker()
        self._line = 0  # input lines consumed so far
        self._findings: list[Finding] = []
        self._pending: list[Finding] = []  # inside the open traceback
        self._per_rule: dict[str, int] = {}
        self._suppressed: dict[str, int] = {}
        self._first_fatal: Finding | None = None
        self._ready_line: int | None = None
        self._memory = MemoryFacts()
        self._recent: deque[float] = deque(maxlen=16)
        self._low_reports = 0
        self._streak = 0  # consecutive decode reports at exactly 1.00
        self._longest = 0
        self._streak_reported = False
        self._json: bool | None = None  # decided on the first non-blank input
        self._partial = b""  # an incomplete last line from feed_bytes

    # ---------------------------------------------------------------- public API

    @property
    def first_fatal(self) -> Finding | None:
        return self._first_fatal

    @property
    def lines(self) -> int:
        return self._line

    def feed(self, lines: Iterable[str | bytes]) -> list[Finding]:
        """Feed whole lines (str or bytes, without or with their newline)."""
        parts = [_to_bytes(ln).rstrip(b"\r\n") for ln in lines]
        if not parts:
            return []
        return self._feed_block(b"\n".join(parts) + b"\n")

    def feed_bytes(self, data: bytes) -> list[Finding]:
        """Feed raw bytes from a file or pipe; a trailing partial line waits for the next call."""
        out: list[Finding] = []
        start = 0
        if self._partial:
            nl = data.find(b"\n")
            if nl < 0:
                self._partial += data
                return out
            out += self._feed_block(self._partial + data[: nl + 1])
            self._partial, start = b"", nl + 1
        cut = data.rfind(b"\n")
        if cut < start:
            self._partial = data[start:]
            return out
        # the block is scanned in place: no copy of megabytes per call
        out += self._feed_block(data, start, cut + 1)
        self._partial = data[cut + 1:]
        return out

    def finish(self) -> list[Finding]:
        """End of input: the partial last line and any open traceback are settled."""
        out: list[Finding] = []
        if self._partial:
            out += self._feed_block(self._partial + b"\n")
            self._partial = b""
        return out

    def report(self) -> Report:
        findings = sorted([*self._findings, *self._pending_settled()], key=lambda f: (f.line, f.rule_id))
        root = choose_root(findings, self._tb.starts, self._defer)
        verdict = verdict_of(root, findings)
        accept = AcceptStats(low_reports=self._low_reports,
                             recent=tuple(self._recent), longest_one_streak=self._longest)
        return Report(verdict=verdict, root_cause=root, findings=findings, lines=self._line,
                      ready_line=self._ready_line, memory=self._memory, accept=accept,
                      suppressed=dict(self._suppressed))

    # ---------------------------------------------------------------- blocks

    def _feed_block(self, buf: bytes, start: int = 0, end: int | None = None) -> list[Finding]:
        end = len(buf) if end is None else end
        if self._json is None and buf[start:end].strip():
            self._json = journal.looks_like_json_journal(buf[start:start + 65536])
        before = len(self._findings)
        if self._json:
            self._feed_json(buf[start:end])
        else:
            self._scan(buf, None, start=start, end=end)
        return self._findings[before:]

    def _feed_json(self, buf: bytes) -> None:
        """`journalctl -o json`: every entry is parsed; its message lines keep the entry's number."""
        out: list[bytes] = []
        line_map: list[int] = []
        first = self._line
        for i, raw in enumerate(buf.split(b"\n")[:-1]):
            text = raw.decode("utf-8", "replace")
            msgs = journal.json_messages(text) if text.lstrip().startswith("{") else None
            for msg in (msgs if msgs is not None else [text]):
                out.append(msg.encode("utf-8", "surrogateescape"))
                line_map.append(first + i + 1)
        self._scan(b"\n".join(out) + b"\n" if out else b"", line_map, physical=buf.count(b"\n"))

    def _scan(self, buf: bytes, line_map: list[int] | None, physical: int | None = None,
              start: int = 0, end: int | None = None) -> None:
        """The complete lines in buf[start:end]; `line_map[i]` is the input line of block line i."""
        end = len(buf) if end is None else end
        base = self._line
        n_lines = buf.count(b"\n", start, end)
        pos = start  # byte offset of the next unprocessed line
        idx = 0  # its index in the block
        accept_from = start  # offset after the last accept-len report the screen saw

        def lineno(i: int) -> int:
            return line_map[i] if line_map is not None else base + i + 1

        def take_line() -> tuple[int, int]:
            e = buf.find(b"\n", pos, end)
            return pos, (e if e >= 0 else end)

        def slow_until_closed() -> None:
            # line by line while a traceback is open
            nonlocal pos, idx
            while self._tb.open and pos < end:
                s, e = take_line()
                self._line_full(buf[s:e], lineno(idx), hit=None)
                pos, idx = e + 1, idx + 1
            if not self._tb.open:
                self._settle_group()

        slow_until_closed()
        for h in (self.screen.hits(buf, pos, end) if pos < end else ()):
            if h < pos:
                continue  # already handled (same line, or inside a traceback read line by line)
            ls = max(buf.rfind(b"\n", pos, h) + 1, pos)
            idx += buf.count(b"\n", pos, ls)
            pos = ls
            s, e = take_line()
            if self._streak and buf.find(_ACCEPT_B, s, e) >= 0:
                # an accept-len report the screen skipped lies between the previous low one and
                # this one: it was not low, so the streak of 1.00s is broken
                if buf.count(_ACCEPT_B, accept_from, s):
                    self._streak = 0
            if self._streak or buf.find(_ACCEPT_B, s, e) >= 0:
                accept_from = e
            self._line_full(buf[s:e], lineno(idx), hit=h - s)
            pos, idx = e + 1, idx + 1
            slow_until_closed()
        if self._streak and buf.count(_ACCEPT_B, accept_from, end):
            self._streak = 0
        self._note_recent_accepts(buf, start, end)
        self._line = base + (physical if physical is not None else n_lines)

    def _note_recent_accepts(self, buf: bytes, start: int, end: int) -> None:
        # the last few accept lengths of the block (they are not screen hits when healthy)
        key = _ACCEPT_B
        vals: list[float] = []
        while len(vals) < self._recent.maxlen and end > start:  # type: ignore[operator]
            i = buf.rfind(key, start, end)
            if i < 0:
                break
            m = _ACCEPT_RX.match(buf[i:i + 40].decode("ascii", "replace"))
            if m:
                vals.append(float(m.group(1)))
            end = i
        if vals:
            self._recent.extend(reversed(vals))

    # ---------------------------------------------------------------- lines

    def _line_full(self, raw: bytes, lineno: int, hit: int | None) -> None:
        if len(raw) > MAX_MATCH_CHARS:
            center = hit if hit is not None else 0
            lo = max(0, center - MAX_MATCH_CHARS // 2)
            raw = raw[lo: lo + MAX_MATCH_CHARS]
        text, new_record = journal.clean_line(raw.decode("utf-8", "replace"))
        was_open = self._tb.open
        group, kind = self._tb.step(text, new_record, lineno)
        if was_open and group is None:
            self._settle_group()
        if kind in ("frame", "code"):
            return  # source code quoted by a traceback (`raise HFValidationError(`) is not an error
        if _ACCEPT in text:
            self._accept_line(text, lineno)
        rule, m = self._match(text, group)
        if rule is None:
            if kind == "exc" and group is not None:
                # a traceback ended in an exception no rule names: keep it as generic evidence
                self._add(self._by_id["python_exception"], text, text, lineno, group)
            return
        if rule.severity == "info":
            self._info(rule, text, lineno)
            return
        # the match and the rest of its sentence: still a substring of the line (the gate finds
        # the journal entry by it), but readable ("undefined symbol: _ZNK3c10...", not "undefined symbol: ")
        evidence = text[m.start(): max(m.end(), min(len(text), m.start() + 160))] if m is not None else text
        if rule.role == "backstop":
            evidence = text.strip()[:300]
        self._add(rule, text, evidence, lineno, group)

    def _match(self, text: str, group: int | None) -> tuple[Rule | None, re.Match[str] | None]:
        for rule in self._rules:
            if not any(lit in text for lit in rule.literals):
                continue
            if rule.frames and (group is None or not any(fr in path for path in self._tb.frames
                                                          for fr in rule.frames)):
                continue
            m = rule.search(text)
            if m is not None:
                return rule, m
        return None, None

    def _info(self, rule: Rule, text: str, lineno: int) -> None:
        if rule.id == "server_ready":
            if self._ready_line is None or "ready to roll" in text:
                self._ready_line = lineno
        else:
            self._memory = parse_memory(text, self._memory)

    def _accept_line(self, text: str, lineno: int) -> None:
        m = _ACCEPT_RX.search(text)
        if not m:
            return
        value = float(m.group(1))
        if value < ACCEPT_LOW:
            self._low_reports += 1
        if value <= 1.0:
            self._streak += 1
            self._longest = max(self._longest, self._streak)
            if self._streak >= ACCEPT_STREAK and not self._streak_reported:
                self._streak_reported = True
                self._add_accept_finding(text, lineno)
        else:
            self._streak = 0

    def _add_accept_finding(self, text: str, lineno: int) -> None:
        f = Finding(
            label="hidden_capture_missing", severity="fatal", line=lineno, text=text[:MAX_TEXT_CHARS],
            evidence=_ACCEPT_RX.search(text).group(0),  # type: ignore[union-attr]  (a substring: the gate finds the entry by it)
            remedy=("No drafted token is ever accepted: the draft sees no target hidden states. For DDTREE install "
                    "the ddtree plugin in service.python so DDTREE registers as DFlash-family; check the draft's "
                    "dflash_config.target_layer_ids (modes.<mode>.draft_model_path)."),
            profile_key="service.python", direction=None, rule_id="accept_len_stuck_at_one", role="cause",
            meaning=f"Speculative decoding runs but the acceptance length stayed at exactly 1.00 in {ACCEPT_STREAK} "
                    "consecutive decode reports: no drafted token is ever accepted.")
        self._record(f)

    def _add(self, rule: Rule, text: str, evidence: str, lineno: int, group: int | None) -> None:
        severity, label, hardware = rule.severity, rule.label, False
        remedy = rule.remedy
        if rule.xid_hardware:
            m = _XID_RX.search(text)
            code = int(m.group(1)) if m else -1
            hardware = code in rule.xid_hardware
            if not hardware:
                severity = "warning"
                label = "illegal_memory_access" if code in (13, 31) else "unclassified_crash"
                remedy = "Application Xid: treat it as the software error it accompanies."
            else:
                remedy = (f"Hardware Xid {code}: do not roll back the software; drain the host and reset the GPU "
                          "(or reboot / service it).")
        f = Finding(label=label, severity=severity, line=lineno, text=text[:MAX_TEXT_CHARS],
                    evidence=evidence[:MAX_TEXT_CHARS], remedy=remedy, profile_key=rule.profile_key,
                    direction=rule.direction, rule_id=rule.id, role=rule.role, meaning=rule.meaning,
                    group=group, hardware=hardware)
        if group is not None and self._tb.open and f.role in _HELD_ROLES:
            # generic evidence waits for the end of its traceback, where a specific cause may follow
            self._pending.append(f)
        else:
            self._record(f)

    def _record(self, f: Finding) -> None:
        n = self._per_rule.get(f.rule_id, 0)
        self._per_rule[f.rule_id] = n + 1
        if n >= MAX_PER_RULE:
            self._suppressed[f.rule_id] = self._suppressed.get(f.rule_id, 0) + 1
            return
        self._findings.append(f)
        if f.severity == "fatal" and self._first_fatal is None:
            self._first_fatal = f

    def _pending_settled(self) -> list[Finding]:
        """Findings of a traceback still open at report time (the input ended inside it)."""
        out = list(self._pending)
        if self._tb.open and not any(f.role != "consequence" for f in out):
            start = self._tb.starts.get(self._tb.group, 0)
            rule = self._by_id["python_exception"]
            out.append(Finding(label=rule.label, severity=rule.severity, line=start, text=journal.TRACEBACK_HEADER,
                               evidence=journal.TRACEBACK_HEADER, remedy=rule.remedy, profile_key=None,
                               direction=None, rule_id=rule.id, role="backstop", meaning=rule.meaning,
                               group=self._tb.group))
        return out

    def _settle_group(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        for f in pending:
            self._record(f)


# ------------------------------------------------------------------ root cause


def verdict_of(root: Finding | None, findings: list[Finding]) -> str:
    """DESIGN.md's verdicts: a root cause fails the start; warnings alone degrade it."""
    if root is not None:
        return "failed"
    return "degraded" if any(f.severity == "warning" for f in findings) else "healthy"


def choose_root(findings: list[Finding], group_starts: dict[int, int] | None = None,
                defer: dict[str, int] | None = None) -> Finding | None:
    """The first fatal event in time, read the way an engineer reads a log.

    Per event (a traceback, or a line outside any traceback) the most specific finding stands
    for it. Then: the first event with a cause; a wrapper yields to a cause inside it or within
    its `defer_within` lines; an NCCL/watchdog echo yields to an earlier unexplained crash;
    secondary symptoms explain the failure only when nothing else does.
    """
    fatal = [f for f in findings if f.severity == "fatal"]
    if not fatal:
        return None
    starts = group_starts or {}
    reps: dict[Any, Finding] = {}
    first_line: dict[Any, int] = {}
    for f in fatal:
        key = ("g", f.group) if f.group is not None else ("l", f.line)
        first_line[key] = min(first_line.get(key, f.line), starts.get(f.group, f.line) if f.group else f.line)
        cur = reps.get(key)
        if cur is None or (_ROLE_IN_GROUP.get(f.role, 4), f.line) < (_ROLE_IN_GROUP.get(cur.role, 4), cur.line):
            reps[key] = f
    events = sorted(reps.items(), key=lambda kv: (first_line[kv[0]], kv[1].line))
    causes = [(k, f) for k, f in events if _ROLE_CLASS.get(f.role) == 0]
    backstops = [(k, f) for k, f in events if _ROLE_CLASS.get(f.role) == 1]
    root: Finding | None = None
    if causes:
        key, root = causes[0]
        if root.role == "downstream":
            earlier = [f for k, f in backstops if first_line[k] < first_line[key]]
            if earlier:
                return earlier[0]
    elif backstops:
        root = backstops[0][1]
    else:
        root = events[0][1]
    return _deferred(root, fatal, (defer or {}).get(root.rule_id, 0))


def _deferred(root: Finding, fatal: list[Finding], window: int) -> Finding:
    """A wrapper or banner yields to the cause it announces (same traceback or the next lines)."""
    if root.role not in ("wrapper", "consequence"):
        return root
    for f in fatal:
        if f.line < root.line or f is root or f.role not in ("cause", "downstream"):
            continue
        same_group = root.group is not None and f.group == root.group
        if same_group or (window and f.line - root.line <= window):
            return f
    return root


# ------------------------------------------------------------------ entry points


def classify(lines: Iterable[str | bytes], catalogue: Catalogue | None = None) -> Report:
    """Classify whole lines (pure)."""
    sc = Scanner(catalogue)
    batch: list[str | bytes] = []
    for ln in lines:
        batch.append(ln)
        if len(batch) >= 8192:
            sc.feed(batch)
            batch = []
    if batch:
        sc.feed(batch)
    sc.finish()
    return sc.report()


def classify_bytes(data: bytes, catalogue: Catalogue | None = None) -> Report:
    sc = Scanner(catalogue)
    sc.feed_bytes(data)
    sc.finish()
    return sc.report()


def iter_blocks(stream: IO[bytes], size: int = 4 << 20) -> Iterator[bytes]:
    while True:
        block = stream.read(size)
        if not block:
            return
        yield block


def classify_stream(stream: IO[bytes], catalogue: Catalogue | None = None, block_size: int = 4 << 20) -> Report:
    """Classify a binary stream (a file, stdin) in blocks, without holding it in memory."""
    sc = Scanner(catalogue)
    for block in iter_blocks(stream, block_size):
        sc.feed_bytes(block)
    sc.finish()
    return sc.report()
