"""Tracebacks that repeat, read at the speed of their bytes (issue 31: a server that fails every
request leaves a journal of request tracebacks whose messages all differ).

A traceback read line by line from its header becomes a *template*: its header's shape, its body
(frames, their source lines, blanks) and its exception line's prefix, digits made 0. A later
traceback whose header and body have that shape is *replayed*: the tracker gets its frames (read
from the lines themselves) and its exception line is read without cleaning the prefix again.

When the line that closes a replayed traceback and the next traceback repeat the same event (the
closing line, the header, the body, the exception prefix and class, digits aside), the events that
follow are a *run*: one regex recognises each event in C, and an event whose message holds no
keyword of the screen and no literal any other rule needs (`Check`) is counted in bulk, as reading
it line by line would count it, once its rules have kept their examples. The last event of a run is
replayed exactly, so what follows reads the same tracker state. tests/diagnose/test_replay.py holds
every report to the one the line-by-line reading gives.

`TracebackReplay` is a mixin of `scanner.Scanner` (it reads and updates the scanner's state); the
constants both share live here.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ddtree_ops.diagnose import journal
from ddtree_ops.diagnose.catalogue import ACCEPT
from ddtree_ops.diagnose.screen import (HyperscanScreen, Screen, build_screen, hyperscan_available, necessary_literals,
                                        plan_screen)

if TYPE_CHECKING:
    from ddtree_ops.diagnose.catalogue import Catalogue, Rule

MAX_MATCH_CHARS = 16384  # a hit inside a longer line is matched in a window around the hit
MAX_PER_RULE = 50  # findings kept per rule (the rest are counted): a 1 GB journal stays small
DIGIT0 = bytes.maketrans(b"0123456789", b"0000000000")
ACCEPT_B = ACCEPT.encode()
HELD_ROLES = ("wrapper", "backstop", "consequence", "death")  # held while their traceback is still open
# after a requested stop these are shutdown, not a crash (a specific cause still counts)
SHUTDOWN_ROLES = ("consequence", "death", "backstop", "downstream")

# an exception line as CPython prints it (a dotted class, then ':' or the end): nothing after the
# log prefix can be stripped from it, and the tracker reads it as the exception
EXC_TEXT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,200}(?::|$)")
RECORD_KEEP = journal.RECORD_KEEP
TEMPLATE_BYTES = 1 << 16  # a traceback body longer than this is read line by line
MAX_TEMPLATES = 256


@dataclass
class Learning:
    """A traceback being read line by line from its header, on its way to become a template."""

    key: bytes  # the header line's shape (digits made 0)
    header: str  # the header's text
    header_bytes: int
    body: bytes = b""  # the body's raw lines
    n: int = 0
    frames: list[tuple[int, int]] = field(default_factory=list)  # (offset in the body, prefix bytes) per frame line
    after_frame: bool = False


@dataclass(frozen=True)
class Run:
    """Events that repeat a replayed traceback: their shape as one regex, and what counts them."""

    rx: re.Pattern[bytes]  # closer line, header, body, exception prefix and class; the message as `msg`
    many: re.Pattern[bytes]  # as many such events in a row as there are (its groups: the last one's)
    lines: int  # lines per event
    check: Check | None  # the patterns that would claim the exception line instead of the winner
    winner: int  # the rule that claims the exception line (-1: none, the backstop keeps it)
    held: bool  # the winner is held until its traceback settles


UNSET: Any = object()
# What a run's message must not hold besides a keyword or a literal another rule needs: an accept-length
# report (the scanner counts one below 1.10 as low; no keyword holds "accept len: 0.95"). The visible
# cards are a keyword of the screen, and the `raise X(` of a traceback flattened onto a line that the
# scanner blanks changes no answer a keyword or literal of a rule would not already stop the run for.
_NOT_IN_MESSAGE = (ACCEPT_B,)


class Check:
    """Whether any of some patterns matches an exception line of a run, cheaply: each pattern needs one
    of the literals of each of its necessary sets (screen.necessary_literals), so a line that holds
    none of the literals of one such set per pattern (a set its class alone does not satisfy) needs
    no search at all; the literals are looked for in one pass (the keyword screen's machinery)."""

    def __init__(self, patterns: list[str], cls: str, kind: str) -> None:
        self.patterns = patterns
        self.full: re.Pattern[str] | None = None  # compiled when a line needs it
        needles: list[str] = []
        self.screen: HyperscanScreen | Screen | None = None
        for p in patterns:
            sets = [s for s in necessary_literals(p) if s and not any(x in cls for x in s)]
            if not sets:
                return  # the class alone may satisfy it: every line is searched in full
            needles += max(sets, key=lambda s: min(len(x) for x in s))  # the set with the longest literals
        words = sorted(set(needles))
        if kind == "hyperscan" or (kind == "auto" and hyperscan_available()):
            self.screen = HyperscanScreen(tuple(words), ())
        else:  # the stdlib screen's own machinery: rare anchor bytes found with memchr
            self.screen = build_screen(words, plan_screen([[(w,)] for w in words]).anchors, kind="python")

    def needles(self, buf: bytes, start: int, end: int) -> list[int] | None:
        """Offsets in buf[start:end] where a literal may be (None: every line must be searched)."""
        return None if self.screen is None else self.screen.hits(buf, start, end)

    def search(self, line: bytes) -> bool:
        """Whether a pattern matches `line` (an exception line's text, UTF-8)."""
        if self.full is None:
            self.full = re.compile("|".join(f"(?:{p})" for p in self.patterns))
        return self.full.search(line.decode("utf-8", "replace").rstrip()) is not None


def shape_rx(shape: bytes) -> bytes:
    """A regex for lines of this shape (digits made 0): every 0 any digit, the rest literally
    (re.escape leaves digits alone)."""
    return re.escape(shape).replace(b"0", b"[0-9]")


@dataclass(frozen=True)
class Template:
    """A traceback's header, body and exception-line prefix, digits made 0: a later traceback of
    the same shape is replayed (a server that fails every request prints thousands of them)."""

    key: bytes  # the header line's shape
    header: str
    header_bytes: int
    body: bytes
    n: int
    frames: tuple[tuple[int, int], ...]
    after_frame: bool
    plen: int  # the exception line's prefix, in bytes
    exc_prefix: bytes
    exc_record: bool  # that prefix is a record prefix (clean_line's new_record)




class TracebackReplay:
    """The scanner's side of templates and runs (mixed into `scanner.Scanner`, whose state it reads)."""

    # the scanner's state and its steps (scanner.Scanner): declared for the type checker
    cat: Catalogue
    _rules: tuple[Rule, ...]
    _backstop: Rule | None
    _tb: journal.TracebackTracker
    _replays: int
    _bulk: int

    def _learn(self, raw: bytes, text: str, kind: str, new_record: bool) -> None:
        """The traceback opened by the header being learnt goes on: keep its body (frames, their
        source lines, blanks); at its exception line, keep the template."""
        lr = self._learning
        assert lr is not None
        encoded = text.encode("utf-8", "surrogateescape")
        stripped = raw.rstrip()
        if not stripped.endswith(encoded) or b"\x1b" in raw:
            self._learning = None  # a prefix clean_line does more with than strip (colours): not a template
            return
        plen = len(stripped) - len(encoded)
        if kind in ("frame", "code", "blank"):
            if kind == "frame":
                lr.frames.append((len(lr.body), plen))
            lr.body += raw + b"\n"
            lr.n += 1
            lr.after_frame = kind == "frame" or (kind == "blank" and lr.after_frame)
            if len(lr.body) > TEMPLATE_BYTES:
                self._learning = None
            return
        if kind == "exc" and lr.n:
            if len(self._templates) >= MAX_TEMPLATES:
                self._templates.clear()
            self._templates[lr.key] = Template(
                key=lr.key, header=lr.header, header_bytes=lr.header_bytes, body=lr.body.translate(DIGIT0), n=lr.n,
                frames=tuple(lr.frames), after_frame=lr.after_frame, plen=plen,
                exc_prefix=raw[:plen].translate(DIGIT0), exc_record=new_record and not bool(RECORD_KEEP.match(text)))
        self._learning = None

    def _replay(self, tpl: Template, raw: bytes, lineno: int) -> int:
        """A traceback header whose body, line for line (digits aside), is a template's: the body is
        replayed into the tracker (its frames read from the lines themselves) and the exception line
        is read without cleaning its prefix again. Returns the lines consumed after the header (0:
        not this template; nothing changed)."""
        buf, end = self._buf, self._end
        if not buf or self._block[2] is not None or len(raw) != tpl.header_bytes:
            return 0
        b0 = self._cur + len(raw) + 1
        b1 = b0 + len(tpl.body)
        if b1 >= end or buf[b0:b1].translate(DIGIT0) != tpl.body:
            return 0
        e = buf.find(b"\n", b1, end)
        if e < 0:
            return 0
        exc = buf[b1:e]
        if (len(exc) > MAX_MATCH_CHARS or exc[:tpl.plen].translate(DIGIT0) != tpl.exc_prefix or b"\x1b" in exc
                or exc.endswith(b"cluster]")):
            return 0
        text = exc[tpl.plen:].decode("utf-8", "replace").rstrip()
        if (not EXC_TEXT.match(text) or ACCEPT in text or "CUDA_VISIBLE_DEVICES" in text or '", line ' in text
                or text.startswith(journal.CHAIN_LINES)):
            return 0
        tb = self._tb
        group, _ = tb.step(tpl.header, True, lineno)
        self._tb_head = (group or 0, tpl.header)
        self._learning = None
        for off, plen in tpl.frames:
            ls = b0 + off
            fr = journal.frame_of(buf[ls + plen:buf.find(b"\n", ls, b1)].decode("utf-8", "replace"))
            if fr is not None:  # (always: the shape is a frame's)
                tb.frames.append(fr.path)
                tb.part.append(fr)
        tb.note_lines(tpl.n, tpl.after_frame)
        record = tpl.exc_record or bool(RECORD_KEEP.match(text))
        exc_line = lineno + tpl.n + 1
        self._cur, self._raw = b1, exc
        group, kind = tb.step(text, record, exc_line)
        self._consumed = e
        cands = self._index.candidates(text)
        rule, m, named = self._match(text, group, cands)
        self._decided(rule, m, named, text, exc_line, group, kind)
        self._replayed = (tb.group, tpl.key, -1 if rule is None else rule.order)
        self._replays += 1
        return tpl.n + 1 + self._run(tpl, text, cands, exc_line)

    def _run(self, tpl: Template, text: str, cands: tuple[int, ...], exc_line: int) -> int:
        """The traceback just replayed, repeated: each later event of the same shape (the line that
        closes the previous one, the header, the body, the exception line, digits aside) whose
        message no other rule can claim is counted in bulk, as reading it line by line would count
        it, once both its rules have kept their examples. The last event is replayed exactly. Returns
        the lines consumed (after `self._consumed`, which moves to the last event's end)."""
        closer = self._closers.get(tpl.key)
        m0 = EXC_TEXT.match(text)
        if closer is None or m0 is None or self._replayed is None:
            return 0
        winner = self._replayed[2]
        cut = m0.end()
        while cut < len(text) and text[cut] == " ":
            cut += 1  # the class, its colon and the space after it (where a keyword like "Error: " ends)
        cls = text[:cut]
        nxt, hdr = self._consumed + 1, self._consumed + 2 + len(closer[0])
        if (self._buf[nxt:hdr - 1].translate(DIGIT0) != closer[0]
                or self._buf[hdr:hdr + len(tpl.key)].translate(DIGIT0) != tpl.key):
            return 0  # the next lines are not this closer and this header again: no run here
        spec_key = (tpl.key, cls, closer[0])
        spec = self._runs.get(spec_key, UNSET)
        if spec is UNSET:
            spec = self._runs[spec_key] = self._run_spec(tpl, cls, closer, winner, cands)
        if spec is None or spec.winner != winner:
            return 0
        per_rule = self._per_rule
        w_id = self._rules[winner].id if winner >= 0 else (self._backstop.id if self._backstop else "")
        c_id = self._rules[closer[1]].id if closer[1] >= 0 else ""
        if per_rule.get(w_id, 0) < MAX_PER_RULE or (c_id and per_rule.get(c_id, 0) < MAX_PER_RULE):
            return 0
        buf, end, hits = self._buf, self._end, self._hits
        rx, check, pos = spec.rx, spec.check, self._consumed + 1
        # the literals other rules need, found in one pass over the rest of the block
        needles = check.needles(buf, pos, end) if check is not None else []
        # An event's keywords (and literals) outside its message are the same in every event (the
        # same bytes, digits aside, and neither holds a digit): the first event's count outside its
        # message is every event's, so one search per event tells whether its message holds one.
        k = 0
        last: re.Match[bytes] | None = None
        m = rx.match(buf, pos, end)
        if m is None:
            return 0
        ms = m.start("msg")
        h_prev, n_prev = bisect_left(hits, pos), (bisect_left(needles, pos) if needles is not None else 0)
        h_base, n_base = bisect_left(hits, ms) - h_prev, (bisect_left(needles, ms) - n_prev if needles is not None else 0)
        match = rx.match
        # Most runs are clean throughout: their events, matched at once, hold just the keywords and
        # literals the events' own shape holds, and none of the lines a message must not hold.
        run = spec.many.match(buf, pos, end)
        run_end = run.end() if run is not None else pos
        n = buf.count(b"\n", pos, run_end) // spec.lines
        if (run is not None and bisect_left(hits, run_end) - h_prev == n * h_base
                and (check is None or (needles is not None and bisect_left(needles, run_end) - n_prev == n * n_base))
                and all(buf.count(w, pos, run_end) == n * buf.count(w, pos, ms) for w in _NOT_IN_MESSAGE)):
            k, last, m = n, run, None  # (`run`'s groups are its last event's)
        while m is not None:  # otherwise, event by event: the first that holds one ends the run
            me = m.end("msg")
            h_end = bisect_left(hits, me)
            if h_end - h_prev != h_base:
                break  # a keyword in the message: a rule may claim it, read it in full
            t = buf[m.start("exc"):me]
            if any(w in t for w in _NOT_IN_MESSAGE):
                break
            if check is not None:
                n_end = bisect_left(needles, me) if needles is not None else 0
                if (needles is None or n_end - n_prev != n_base) and check.search(t):
                    break  # another rule's pattern matches the message: read it in full
                n_prev = n_end
            k, last, pos, h_prev = k + 1, m, me + 1, h_end
            m = match(buf, pos, end)
        if last is None:
            return 0
        # what reading the k events line by line does: each closer settles the traceback before it
        # and is counted; each exception line is claimed (and held until its traceback settles)
        self._settle_group()
        if c_id:
            self._claimed[c_id] = self._claimed.get(c_id, 0) + k
            per_rule[c_id] += k
            self._suppressed[c_id] = self._suppressed.get(c_id, 0) + k
        if winner >= 0:
            self._claimed[w_id] = self._claimed.get(w_id, 0) + k
        wrule = self._rules[winner] if winner >= 0 else self._backstop
        assert wrule is not None
        settled = k - 1 if spec.held else k
        per_rule[w_id] += settled
        self._suppressed[w_id] = self._suppressed.get(w_id, 0) + settled
        tb = self._tb
        first = exc_line + 2  # the first event's header line (its closer is the line before)
        # (the events before the last get their group ids but no start line: no finding of theirs is kept,
        # and only a kept finding's group is looked up; a journal of them stays small)
        tb.group += k - 1
        # the last event, exactly: header, frames, exception line
        hline = first + (k - 1) * spec.lines
        b0 = last.start("body")
        group, _ = tb.step(tpl.header, True, hline)
        self._tb_head = (group or 0, tpl.header)
        for off, plen in tpl.frames:
            ls = b0 + off
            fr = journal.frame_of(buf[ls + plen:buf.find(b"\n", ls, last.start("exc"))].decode("utf-8", "replace"))
            if fr is not None:
                tb.frames.append(fr.path)
                tb.part.append(fr)
        tb.note_lines(tpl.n, tpl.after_frame)
        t = buf[last.start("exc"):last.end("msg")].decode("utf-8", "replace").rstrip()
        group, _ = tb.step(t, tpl.exc_record or bool(RECORD_KEEP.match(t)), hline + tpl.n + 1)
        self._cur, self._raw = last.start("prefix"), buf[last.start("prefix"):last.end("msg")]
        if spec.held:
            self._pending_n.append((w_id, wrule.role))
        # (no look-back for a stop: an event holds no start or stop line, and its message none that a
        # start/stop rule reads, or the run would have ended before it)
        self._consumed = last.end("msg")
        self._replayed = (tb.group, tpl.key, winner)
        self._bulk += k
        return k * spec.lines

    def _run_spec(self, tpl: Template, cls: str, closer: tuple[bytes, int], winner: int,
                  cands: tuple[int, ...]) -> Run | None:
        """How to recognise the events that repeat a replayed traceback (None: they cannot be counted
        in bulk: a rule that reads context or resolves its cause claims the exception line)."""
        rules = self._rules
        wrule = rules[winner] if winner >= 0 else self._backstop
        if wrule is None or not wrule.plain or wrule.covers_traceback or wrule.severity == "info":
            return None
        if closer[1] >= 0 and not rules[closer[1]].plain:
            return None
        # the candidates of the exception line that its frames do not rule out, the winner aside, and
        # the start/stop rules the screen does not look for: a message any of them matches is read in full
        tb = self._tb
        raised = tb.raised_in()
        alive = [i for i in cands if i != winner and not (
            (rules[i].frames and not any(fr in path for path in tb.frames for fr in rules[i].frames))
            or (rules[i].raised_in and not any(fr in path for path in raised for fr in rules[i].raised_in)))]
        pats = [p for i in alive for p in rules[i].patterns]
        pats += [p for r in rules if r.context in ("start", "stop") for p in r.patterns]
        check = Check(pats, cls, self.cat.screen_kind) if pats else None
        lines = 1 + 1 + tpl.n + 1
        event = (shape_rx(closer[0]) + b"\n" + shape_rx(tpl.key) + b"\n(?P<body>" + shape_rx(tpl.body) + b")(?P<prefix>"
                 + shape_rx(tpl.exc_prefix) + b")(?P<exc>" + re.escape(cls.encode("utf-8")) + b")(?P<msg>[^\n]*)\n")
        held = wrule.role in HELD_ROLES
        return Run(rx=re.compile(event, re.S), many=re.compile(b"(?:" + event + b")+", re.S), lines=lines, check=check,
                   winner=winner, held=held)

