"""The keyword screen and the keyword index: why a healthy gigabyte costs almost no Python.

Every catalogue pattern has a mandatory literal without digits (a keyword). Two structures are
built from the keywords once per catalogue:

- `Screen` finds, in raw bytes and in C, every offset where a keyword of a non-benign rule may
  start. Each keyword is reached from an *anchor byte* inside it that is rare in healthy SGLang
  serving lines. Rare anchors are found with `bytes.find` (memchr, ~10 GB/s here); the few
  common ones with one `re` pass each whose literal first byte keeps `re` on its fast prefix
  scan. Keywords that live inside healthy lines (`accept len: 1.0`) are found as whole needles.
  Only speed depends on the choice, never correctness: the screen hits a superset of the lines
  any rule can match.
- `KeywordIndex` maps a cleaned line to the rules that can match it, with one combined regex
  over all keywords, so the cost of a hit line does not grow with the number of rules.

Keywords never contain digits. Two lines that differ only in their digits therefore hold the
same keywords, reach the same candidate rules and, when none of those rules looks at digits,
get the same decision: that is what lets the scanner memoise decisions per message shape.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from collections.abc import Iterable

try:
    from re import _constants as _c  # type: ignore[attr-defined]
    from re import _parser as _sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python < 3.11
    import sre_constants as _c  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]


class CatalogueError(ValueError):
    """The catalogue file is malformed (a bug in the shipped data or a local edit)."""


# ------------------------------------------------------------------ what healthy lines look like

def _healthy_sample() -> str:
    """Representative healthy serving lines under journald (srt/managers/scheduler_components/
    metrics_reporter.py, uvicorn's access log; with and without speculative decoding, as real
    SGLang 0.5.17 prints them). Only the screen's speed depends on this sample."""
    out = []
    for i in range(40):
        ts = f"Nov 29 07:{i % 60:02d}:{(i * 7) % 60:02d} ct129 sglang-ddtree[41231]: [2025-11-29 07:{i % 60:02d}:{(i * 7) % 60:02d}"
        tp = " TP0]" if i % 3 == 0 else "]"
        n = 1 + i % 8
        accept = (f"accept len: {1.5 + (i % 25) / 10:.2f}, accept rate: 0.{(i * 13) % 97:02d}, "
                  if i % 4 else "")
        out.append(f"{ts}{tp} Decode batch, #running-req: {n}, #token: {1000 + i * 997}, token usage: 0.{i % 97:02d}, "
                   f"{accept}cuda graph: True, gen throughput (token/s): {100 + i * 31.7:.2f}, #queue-req: 0, ")
        if i % 2 == 0:
            out.append(f"{ts}{tp} Prefill batch, #new-seq: 1, #new-token: {30 + i * 41}, #cached-token: {i * 16}, "
                       f"token usage: 0.{i % 89:02d}, #running-req: {n - 1}, #queue-req: 0, #pending-token: 0, "
                       f"cuda graph: {'True' if i % 4 else 'False'}, input throughput (token/s): {11 + i * 7.3:.2f}")
        path = ("/generate", "/v1/chat/completions", "/health_generate", "/v1/completions")[i % 4]
        verb = "GET" if path.startswith("/health") else "POST"
        out.append(f'{ts}] INFO:     127.0.0.1:{38000 + i * 7} - "{verb} {path} HTTP/1.1" 200 OK')
    return "\n".join(out) + "\n"


HEALTHY_SAMPLE = _healthy_sample()  # (cheap: string formatting; the byte frequencies below are computed when needed)


def _byte_freq(sample: str) -> dict[str, float]:
    counts: dict[str, int] = {}
    for ch in sample:
        counts[ch] = counts.get(ch, 0) + 1
    total = max(1, len(sample))
    return {ch: n / total for ch, n in counts.items()}


@lru_cache(maxsize=1)
def _freq() -> dict[str, float]:
    """How often each character is in healthy serving lines: only choosing anchors needs it (parsing a
    catalogue, building the stdlib screen), not a catalogue read back from the disk cache."""
    return _byte_freq(HEALTHY_SAMPLE)
_RARE_SPACING = 1000  # a memchr loop hands over to a regex pass when its byte is denser than this
_SAMPLE = 1 << 16  # the start of a block that decides, per anchor, memchr loop or regex pass


def memchr_cost(ch: str) -> float:
    """Cost of one anchor found with a `bytes.find` loop, in units of one regex pass (measured on
    CPython 3.11, bench/diagnose_scan.py's journals: a one-byte find runs at ~18 GB/s, 1/20 of a
    pass; each occurrence costs ~0.9 us of Python, a find and a match)."""
    return 0.055 + 900.0 * _freq().get(ch, 0.0)


def regex_cost(ch: str) -> float:
    """A `re` pass whose pattern starts with this literal byte (1.0 = ~1 GB/s here)."""
    return 1.0 + 100.0 * _freq().get(ch, 0.0)


def anchor_cost(ch: str) -> float:
    return min(memchr_cost(ch), regex_cost(ch))


# ------------------------------------------------------------------ literals of a pattern

def required_literal_sets(pattern: str) -> list[list[str]]:
    """Sets of literals (any-of) such that every match of `pattern` contains one of each set."""

    def finite(seq: Any, limit: int = 64) -> list[str] | None:
        """Every string `seq` can match, when that is a small finite set of literals."""
        out = [""]
        for op, av in seq:
            if op is _c.LITERAL:
                alts = [chr(av)]
            elif op is _c.SUBPATTERN:
                alts = finite(av[-1], limit)
            elif op is _c.BRANCH:
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

    for op, av in _sre_parse.parse(pattern):
        alts = finite([(op, av)]) if op in (_c.LITERAL, _c.SUBPATTERN, _c.BRANCH) else None
        if alts is None or len(run) * len(alts) > 64:
            flush()
            if alts is not None:
                run = list(alts)
            continue
        run = [a + b for a in run for b in alts]
    flush()
    return sets


def necessary_literals(pattern: str) -> list[tuple[str, ...]]:
    """Sets of literals (any-of) of which every match of `pattern` holds one: runs of literal
    characters, and for an alternation whose every branch holds a literal, the set of one per
    branch. Looser than `required_literal_sets` (it reaches into groups with optional parts); used
    to skip a pattern's search when a line holds none of a set."""

    def sets(seq: Any) -> list[tuple[str, ...]]:
        out: list[tuple[str, ...]] = []
        run = ""
        for op, av in seq:
            if op is _c.LITERAL:
                run += chr(av)
                continue
            if run:
                out.append((run,))
                run = ""
            if op is _c.SUBPATTERN:
                out += sets(av[-1])
            elif op is _c.BRANCH:
                alts = [best(alt) for alt in av[1]]
                if all(alts):
                    out.append(tuple(dict.fromkeys(x for a in alts for x in a)))  # type: ignore[union-attr]
            elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT) and av[0] >= 1:
                out += sets(av[2])
        if run:
            out.append((run,))
        return out

    def best(seq: Any) -> tuple[str, ...] | None:
        got = sets(seq)
        return max(got, key=lambda t: min(len(x) for x in t)) if got else None

    return sets(_sre_parse.parse(pattern))


_DIGIT_RUN = re.compile(r"[0-9]+")


@lru_cache(maxsize=4096)
def literal_options(pattern: str) -> list[tuple[str, ...]]:
    """The pattern's usable keyword sets: every alternative 3+ characters long, without digits.

    A required literal with digits in it yields each of its digit-free parts (each is required
    too); an alternation yields the longest digit-free part of each alternative.
    """
    out: list[tuple[str, ...]] = []
    for s in required_literal_sets(pattern):
        if len(s) == 1:
            cands = [(part,) for part in _DIGIT_RUN.split(s[0])]
        else:
            cands = [tuple(dict.fromkeys(max(_DIGIT_RUN.split(x), key=len) for x in s))]
        for alts in cands:
            if all(len(x) >= 3 for x in alts) and alts not in out:
                out.append(alts)
    if not out:
        raise CatalogueError(f"pattern {pattern!r} has no literal of 3+ characters (without digits) outside "
                             "alternations and optional parts; the keyword screen needs one")
    # a keyword that healthy serving lines hold ('ode' of every "Decode batch" line, from
    # '[Rr]eturn ?[Cc]ode') would send each of them to Python: use the pattern's other keywords
    quiet = [alts for alts in out if not any(x in HEALTHY_SAMPLE for x in alts)]
    return quiet or out


_DIGITS = frozenset(range(ord("0"), ord("9") + 1))


@lru_cache(maxsize=4096)
def digit_sensitive(pattern: str) -> bool:
    """Whether two texts that differ only in their digits can get different answers from `pattern`.

    Digits are normalised one for one (each becomes "0"), so lengths are kept: only a literal
    digit or a character class that holds some digits but not all of them can tell them apart.
    """

    def cls_digits(items: Any) -> set[int] | None:
        got: set[int] = set()
        negate = False
        for op, av in items:
            if op is _c.NEGATE:
                negate = True
            elif op is _c.LITERAL:
                got.add(av)
            elif op is _c.RANGE:
                got.update(range(av[0], av[1] + 1))
            elif op is _c.CATEGORY:
                return None  # \d and friends are refused by the catalogue anyway
        inside = got & _DIGITS
        if negate:
            inside = _DIGITS - inside
        return inside

    def walk(seq: Any) -> bool:
        for op, av in seq:
            if op is _c.LITERAL or op is _c.NOT_LITERAL:
                if av in _DIGITS:
                    return True
            elif op is _c.IN:
                d = cls_digits(av)
                if d is None or (d and d != _DIGITS):
                    return True
            elif op is _c.SUBPATTERN:
                if walk(av[-1]):
                    return True
            elif op is _c.BRANCH:
                if any(walk(alt) for alt in av[1]):
                    return True
            elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT, _c.POSSESSIVE_REPEAT if hasattr(_c, "POSSESSIVE_REPEAT") else _c.MAX_REPEAT):
                if walk(av[2]):
                    return True
            elif op in (_c.ASSERT, _c.ASSERT_NOT):
                if walk(av[1]):
                    return True
        return False

    return walk(_sre_parse.parse(pattern))


# ------------------------------------------------------------------ choosing anchors

_MIN_SUFFIX = 3


@lru_cache(maxsize=8192)
def anchor_positions(word: str) -> list[int]:
    """Where a keyword may be found from: an ASCII byte with 2+ characters after it, whose
    suffix never occurs in healthy serving lines (else every boring line would be a hit)."""
    n = min(_MIN_SUFFIX, len(word))
    last = len(word) - n  # the last start with n characters from it
    # a suffix absent from the sample stays absent when it grows, so the good starts are 0..k-1
    lo, hi = 0, last + 1
    while lo < hi:
        mid = (lo + hi) // 2
        if word[mid:] in HEALTHY_SAMPLE:
            hi = mid
        else:
            lo = mid + 1
    ok = [i for i in range(lo) if ord(word[i]) < 128]
    return ok or [0]


def _anchor_options(word: str) -> set[str]:
    return {word[i] for i in anchor_positions(word)}


@dataclass(frozen=True)
class ScreenPlan:
    anchors: tuple[str, ...]
    per_pattern: tuple[tuple[str, ...], ...]  # the keyword set chosen for each pattern


def plan_screen(pattern_sets: list[list[tuple[str, ...]]], extra: Iterable[str] = ()) -> ScreenPlan:
    """Choose few cheap anchor bytes such that every pattern has a keyword set they cover.

    A pattern is covered when, for one of its literal sets, every alternative contains an anchor
    byte with at least 2 more characters after it. Greedy weighted set cover: each anchor costs
    what `anchor_cost` estimates. Bitmasks keep this to a few milliseconds.
    """
    n = len(pattern_sets)
    pattern_sets = [*pattern_sets, *[[(k,)] for k in extra]]
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
            return sum(1 for i in left if covered(pmasks[i], trial)) / anchor_cost(ch)

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
    cheap = sum(bit[ch] for ch in chars if anchor_cost(ch) < 0.5)
    # patterns no cheap byte can cover decide the expensive passes; cheap bytes do the rest
    forced = [i for i in everything if not covered(pmasks[i], cheap)]
    anchors = greedy(everything, greedy(forced, 0))
    for ch in sorted(chars, key=anchor_cost, reverse=True):  # drop anchors that became redundant
        if anchors & bit[ch] and all(covered(pm, anchors & ~bit[ch]) for pm in pmasks):
            anchors &= ~bit[ch]

    def selectivity(s: tuple[str, ...]) -> float:
        freq = _freq()
        return max(100.0 * min(freq.get(ch, 0.0) for ch in x) + 1.0 / len(x) for x in s)

    per = tuple(min((s for s in sets if all(mask[w] & anchors for w in s)), key=selectivity)
                for sets in pattern_sets[:n])
    return ScreenPlan(anchors=tuple(ch for ch in chars if anchors & bit[ch]), per_pattern=per)


def best_literal_set(sets: list[tuple[str, ...]]) -> tuple[str, ...]:
    """For a rule the screen does not need (benign vetoes): its most selective keyword set."""
    return min(sets, key=lambda s: max(1.0 / len(x) for x in s))


# ------------------------------------------------------------------ the screen


def trie_regex(words: list[str]) -> str:
    """A regex for an alternation of literals, factored by common prefixes (fewer branch tries)."""
    if "" in words:
        rest = [w for w in words if w]
        return "(?:" + trie_regex(rest) + ")?" if rest else ""
    groups: dict[str, list[str]] = {}
    for w in sorted(set(words)):
        groups.setdefault(w[0], []).append(w[1:])
    parts = [re.escape(ch) + trie_regex(tails) for ch, tails in groups.items()]
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


@dataclass(frozen=True)
class Screen:
    """One regex per anchor byte, and whole needles; together they hit every line a rule could match."""

    regexes: tuple[re.Pattern[bytes], ...]
    keywords: tuple[str, ...]
    anchors: tuple[str, ...]
    rare: tuple[bool, ...] = ()  # per regex: found with memchr first
    needles: tuple[bytes, ...] = ()  # found whole with bytes.find
    needle_regexes: tuple[re.Pattern[bytes], ...] = ()  # the same, for inputs dense with them

    def hits(self, buf: bytes, start: int = 0, end: int | None = None) -> list[int]:
        """Offsets where a keyword may start (a superset of the lines any rule matches)."""
        end = len(buf) if end is None else end
        found: list[int] = []
        budget = (end - start) // _RARE_SPACING + 64
        sample_end = min(end, start + _SAMPLE)
        for rx, rare in zip(self.regexes, self.rare, strict=False):
            pos = start
            if rare and (end - start <= _SAMPLE
                         or buf.count(rx.pattern[:1], start, sample_end) * _RARE_SPACING <= sample_end - start):
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
        for needle, nrx in zip(self.needles, self.needle_regexes, strict=False):
            find = buf.find
            pos = start
            seen = 0
            while True:
                i = find(needle, pos, end)
                if i < 0:
                    pos = end
                    break
                found.append(i)
                pos = i + 1
                seen += 1
                if seen > budget:
                    break
            if pos < end:
                found.extend(m.start() for m in nrx.finditer(buf, pos, end))
        found.sort()
        return found

    def describe(self) -> list[tuple[str, str, int]]:
        """(anchor, how it is found, keywords behind it): for docs and the benchmark."""
        out = [(a, "memchr" if r else "regex", len(rx.pattern)) for a, r, rx in zip(self.anchors, self.rare, self.regexes, strict=False)]
        out += [(n.decode("utf-8", "replace"), "find", 1) for n in self.needles]
        return out


def literal_database(words: list[bytes]) -> Any:
    """A Hyperscan block-mode database of literal words (ids: their positions), from the disk cache
    (diagnose.cache) when these words were compiled before by this hyperscan; compiled and stored
    otherwise."""
    import hyperscan  # compiled extension: only where a screen or an index is built

    from ddtree_ops.diagnose import cache  # stdlib only: compiled databases kept on disk

    name = f"literals-{cache.key(*words, getattr(hyperscan, '__version__', ''))}.hs"
    stored = cache.read(name)
    if stored is not None:
        try:
            db = hyperscan.loadb(stored, hyperscan.HS_MODE_BLOCK)
            db.scratch = hyperscan.Scratch(db)  # a loaded database comes without one
            return db
        except Exception:  # noqa: BLE001 - not a database this hyperscan reads: compiled below
            pass
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    db.compile(expressions=words, ids=list(range(len(words))), elements=len(words), flags=[0] * len(words),
               literal=True)
    cache.write(name, bytes(hyperscan.dumpb(db)))
    return db


class HyperscanScreen:
    """The same screen in one pass of Intel's Hyperscan (the `hyperscan` package, where it is
    installed): every keyword at once, in SIMD C. Hits are exact keyword occurrences (offsets
    inside them), so the lines it hands over are the ones any rule can match, and the reports
    are the ones the stdlib screen gives (tests/diagnose/test_scanner.py runs both)."""

    def __init__(self, keywords: tuple[str, ...], needles: tuple[str, ...]) -> None:
        import hyperscan  # compiled extension: only where a screen is built (diagnose, the gate)

        self.keywords = keywords
        self.needles = tuple(n.encode("utf-8") for n in needles)
        self._db = literal_database([k.encode("utf-8") for k in (*keywords, *needles)])
        # a scan runs without the GIL on a scratch space of its own: one per thread (the fleet and
        # service gates read several hosts' journals at once with one catalogue)
        self._local = threading.local()

    def hits(self, buf: bytes, start: int = 0, end: int | None = None) -> list[int]:
        """Offsets inside each keyword occurrence (a superset of the lines any rule matches)."""
        end = len(buf) if end is None else end
        data = buf if start == 0 and end == len(buf) else buf[start:end]
        found: list[int] = []
        add = found.append

        def on_match(_id: int, _from: int, to: int, _flags: int, _ctx: object) -> None:
            add(start + to - 1)  # the keyword's last byte: inside its line

        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = self._db.scratch.clone()
        self._db.scan(data, match_event_handler=on_match, scratch=scratch)
        found.sort()
        return found

    def describe(self) -> list[tuple[str, str, int]]:
        return [("*", "hyperscan", len(self.keywords) + len(self.needles))]


SCREEN_ENV = "DDTREE_DIAGNOSE_SCREEN"  # "python" forces the stdlib screen (tests, comparisons)


def hyperscan_available() -> bool:
    if os.environ.get(SCREEN_ENV, "").lower() == "python":
        return False
    try:
        import hyperscan  # noqa: F401  (probe only: a missing or broken wheel means the stdlib screen)
    except Exception:
        return False
    return True


SCREEN_KINDS = ("auto", "python", "hyperscan")


def build_screen(keywords: Iterable[str], anchors: Iterable[str], needles: Iterable[str] = (),
                 kind: str = "auto") -> Screen | HyperscanScreen:
    """Hyperscan where it is installed (one SIMD pass for every keyword); otherwise, for each
    keyword the suffix from its cheapest anchor byte, one trie regex per anchor. `kind` names one
    of them (benchmarks and tests compare the two); `auto` honours DDTREE_DIAGNOSE_SCREEN=python."""
    if kind not in SCREEN_KINDS:
        raise CatalogueError(f"screen kind must be one of {', '.join(SCREEN_KINDS)}")
    kws = tuple(sorted({k for k in keywords if k}))
    if kind == "hyperscan" or (kind == "auto" and hyperscan_available()):
        return HyperscanScreen(kws, tuple(needles))
    return build_python_screen(kws, anchors, needles)


def build_python_screen(keywords: Iterable[str], anchors: Iterable[str], needles: Iterable[str] = ()) -> Screen:
    """The stdlib screen: for each keyword the suffix from its cheapest anchor byte."""
    anchor_set = set(anchors)
    by_anchor: dict[str, set[str]] = {}
    kws = sorted({k for k in keywords if k})
    for k in kws:
        starts = [i for i in anchor_positions(k) if k[i] in anchor_set]
        if not starts:
            raise CatalogueError(f"keyword {k!r} has no anchor byte among {sorted(anchor_set)}")
        # the cheapest anchor byte; among equals the longest suffix (fewest false hits)
        i = min(starts, key=lambda j: (anchor_cost(k[j]), j))
        by_anchor.setdefault(k[i], set()).add(k[i:])
    items = sorted(by_anchor.items())
    regexes = [re.compile(trie_regex(sorted(sufs)).encode("utf-8")) for _, sufs in items]
    rare = tuple(memchr_cost(ch) < regex_cost(ch) for ch, _ in items)
    return Screen(regexes=tuple(regexes), keywords=tuple(kws), anchors=tuple(ch for ch, _ in items), rare=rare,
                  needles=tuple(n.encode("utf-8") for n in needles),
                  needle_regexes=tuple(re.compile(re.escape(n.encode("utf-8"))) for n in needles))


# ------------------------------------------------------------------ the keyword index


class HyperscanKeywordIndex:
    """The keyword index in one Hyperscan database (where it is installed): the same answers as
    `KeywordIndex` (the rules whose keywords a line holds), from a database kept on disk instead of a
    regex of every keyword compiled in each process (the largest part of `diagnose`'s start-up)."""

    def __init__(self, rule_keywords: list[tuple[str, ...]]) -> None:
        by_kw: dict[str, set[int]] = {}
        for i, kws in enumerate(rule_keywords):
            for k in kws:
                by_kw.setdefault(k, set()).add(i)
        self._words = sorted(by_kw)
        self._rules = [tuple(sorted(by_kw[w])) for w in self._words]
        self._db = literal_database([w.encode("utf-8") for w in self._words]) if self._words else None
        self._local = threading.local()

    def candidates(self, text: str) -> tuple[int, ...]:
        db = self._db
        if db is None:
            return ()
        found: list[int] = []
        add = found.append

        def on_match(wid: int, _from: int, _to: int, _flags: int, _ctx: object) -> None:
            add(wid)

        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = db.scratch.clone()
        db.scan(text.encode("utf-8", "surrogateescape"), match_event_handler=on_match, scratch=scratch)
        if not found:
            return ()
        rules = self._rules
        if len(found) == 1:
            return rules[found[0]]
        got: set[int] = set()
        for w in found:
            got.update(rules[w])
        return tuple(sorted(got))


def keyword_index(rule_keywords: list[tuple[str, ...]], kind: str = "auto") -> KeywordIndex | HyperscanKeywordIndex:
    """The keyword index: Hyperscan's where it is installed (and the screen is), the regex otherwise."""
    if kind == "hyperscan" or (kind == "auto" and hyperscan_available()):
        return HyperscanKeywordIndex(rule_keywords)
    return KeywordIndex(rule_keywords)


class KeywordIndex:
    """Cleaned line -> the rules (by catalogue order) whose keywords it holds, in one regex."""

    def __init__(self, rule_keywords: list[tuple[str, ...]]) -> None:
        by_kw: dict[str, set[int]] = {}
        for i, kws in enumerate(rule_keywords):
            for k in kws:
                by_kw.setdefault(k, set()).add(i)
        words = sorted(by_kw)
        # a match at one offset stands for every keyword that is a prefix of it there
        self._rules: dict[str, tuple[int, ...]] = {}
        for w in words:
            got: set[int] = set()
            for j in range(1, len(w) + 1):
                got |= by_kw.get(w[:j], set())
            self._rules[w] = tuple(sorted(got))
        self._rx = re.compile(trie_regex(words)) if words else None

    def candidates(self, text: str) -> tuple[int, ...]:
        rx = self._rx
        if rx is None:
            return ()
        search = rx.search
        rules = self._rules
        m = search(text)
        if m is None:
            return ()
        first = rules[m.group()]
        m2 = search(text, m.start() + 1)
        if m2 is None:
            return first  # the common case: one keyword in the line
        got = set(first)
        while m2 is not None:
            got.update(rules[m2.group()])
            m2 = search(text, m2.start() + 1)
        return tuple(sorted(got))
