"""The scanner: lines in, findings out, incrementally. Pure: no I/O, no clock.

How a scan works (and why it is fast on a healthy gigabyte and on a flood of one warning):
1. A keyword screen (`screen.Screen`) runs over whole blocks of raw bytes in C: memchr for
   anchor bytes that are rare in healthy SGLang serving lines, one `re` pass for each common
   one, so a boring line costs no Python work at all.
2. A hit line's decision is memoised per message shape (the raw line with every digit made
   "0"): a million copies of one warning are one dictionary lookup each once their rule has
   kept its `MAX_PER_RULE` examples. Keywords hold no digits, so the shape decides the
   candidate rules; a decision is only memoised when none of them looks at digits.
3. Otherwise the line is decoded, stripped of journald/container/Ray/rank prefixes
   (`journal.clean_line`), and one combined keyword regex (`screen.KeywordIndex`) names the
   few rules that can match it; they are tried in catalogue order (first match wins). The cost
   of a hit line does not grow with the number of rules.
4. A line that opens a Python traceback switches to line-by-line mode until the traceback ends,
   so that the exception line, its chained parts and the frames that raised it are known:
   rules can require where an exception was raised (`raised_in`), not only what it says.
5. What the log says about the start (`context.LaunchContext`) is kept: after a requested stop,
   shutdown noise is benign; an ambiguous message is named from the context by a resolver.
6. The root cause is chosen over findings, not lines (`root.choose_root`).

`Scanner` is the incremental form (the deploy gate feeds it each poll's new lines);
`classify(lines)` is `Scanner().feed(lines)` + `report()`, and feeding in chunks gives the same
report as feeding everything at once.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import IO, Any

from ddtree_ops.diagnose import ending, journal
from ddtree_ops.diagnose.catalogue import (ACCEPT, Catalogue, Rule, build_rx, index_for, load_catalogue, lookback_rx,
                                           screen_for)
from ddtree_ops.diagnose.context import DECLINE, RESOLVERS, Clues, LaunchContext, Resolution, note_launch, note_visible
from ddtree_ops.diagnose.facts import ACCEPT_STREAK, AcceptTracker, MemoryFacts, parse_memory
from ddtree_ops.diagnose.findings import Finding, Report, crash_signature
from ddtree_ops.diagnose.replay import (ACCEPT_B, DIGIT0, HELD_ROLES, MAX_MATCH_CHARS, MAX_PER_RULE, SHUTDOWN_ROLES, Run,
                                        Learning, Template, TracebackReplay)
from ddtree_ops.diagnose.fingerprint import describe
from ddtree_ops.diagnose.root import choose_root, verdict_of

MAX_TEXT_CHARS = 2000  # what a finding keeps of its line
MAX_MEMO = 1 << 16  # message shapes remembered (then forgotten at once: a flood has few shapes)
LOOKBACK_BYTES = 1 << 16  # how far back a stop or start of the unit is looked for before shutdown noise
ORPHAN_BYTES = 1 << 15  # how far back the frames of a traceback without its header are read
ORPHAN_LINES = 400
SPEC_LOOKBACK_BYTES = 2048  # "right before": a native abort this close to a speculative setting
BUILD_LINES, BUILD_BYTES = 40, 8192  # how far above a build tool's exit status its error line is looked for
_SPEC_SETTING_RX = re.compile(rb"[Ss]peculative|speculative_|EAGLE|NEXTN|DFLASH|DDTREE|draft model|draft_model")
# a line that can end a traceback: what the frames before it were raising
_EXC_START = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,200}(?:Error|Exception|Exit|Interrupt|Warning)(?::|$)")
_XID_RX = re.compile(r"NVRM: Xid \([^)]{0,64}\): ([0-9]{1,4})")
# source lines a traceback quotes, seen without their frame line (an excerpt that starts inside
# them): the raising statement, or an indented f-string literal with a {placeholder} (a message
# template, never a message: a logged message has its placeholders filled in)
_RAISE_CODE = re.compile(r"\s*raise [A-Za-z_][A-Za-z0-9_.]*\(|\s+[rb]?f[\"'].{0,400}\{[^}]{1,200}\}")
_INLINE_RAISE = re.compile(r'(", line [0-9]+, in [^ ]{1,200} )raise [A-Za-z_][A-Za-z0-9_.]{0,200}\(')
# Positive evidence that a server served (besides the ready milestone, the catalogue's server_ready
# rule): SGLang's batch reports (srt/managers/scheduler_components/metrics_reporter.py: "Decode
# batch. #running-req" / "Prefill batch. #new-seq" in 0.4, with a comma since: a request is being
# served) and uvicorn's access line of a generation request or a health check that generated,
# answered 200. Never screened (every healthy line holds one): looked for from the end of each
# block with bytes.rfind, only the last one counts.
_BATCHES = ((b"Decode batch", (b"#running-req",), "decode batch"), (b"Prefill batch", (b"#new-seq",), "prefill batch"))
_OK_B = b'" 200'
_SERVED_RX = re.compile(rb'"(?:POST|GET) /(?:generate|v1/(?:chat/)?completions|v1/responses|health_generate)'
                        rb'[^" ]{0,200} HTTP/[0-9.]{1,3}" 200')
_SERVED_TRIES = 16  # access lines of other paths tried from the end before one regex pass over the block


def _to_bytes(line: str | bytes) -> bytes:
    if isinstance(line, bytes):
        return line
    return line.encode("utf-8", "surrogateescape")




class Scanner(TracebackReplay):
    """Incremental classifier: feed lines as they arrive, ask for the report at any time.

    `feed()` returns the findings confirmed by the new lines. A specific cause is returned at
    once (the gate fails on it in the same poll); generic evidence inside a traceback (its
    header, a wrapper, an unnamed exception) is held until the traceback ends or `report()` is
    called, so a poll boundary inside a traceback never reports an unexplained crash before the
    line that explains it arrives.
    """

    replay = True  # repeated tracebacks replayed from templates, and runs of them counted in bulk (replay.py)

    def __init__(self, catalogue: Catalogue | None = None) -> None:
        self.cat = catalogue or load_catalogue()
        self.screen = screen_for(self.cat)
        self._index = index_for(self.cat)
        self._lookback_rx = lookback_rx(self.cat)  # looked up once: hashing a catalogue is not free
        self._summary_rx, self._build_error_rx = build_rx(self.cat)
        self._rules = self.cat.rules
        # an exception no rule names is kept as the catalogue's generic backstop's evidence
        self._backstop = next((r for r in self.cat.rules if r.role == "backstop"), None)
        self._defer = {r.id: r.defer_within for r in self.cat.rules if r.defer_within}
        self._tb = journal.TracebackTracker()
        self._ctx = LaunchContext()
        self._memo: dict[bytes, int] = {}  # message shape -> rule index (-1: no rule)
        self._line = 0  # input lines consumed so far
        self._findings: list[Finding] = []
        self._pending: list[Finding] = []  # inside the open traceback
        self._pending_n: list[tuple[str, str]] = []  # (rule id, role) of held findings whose rule has its examples
        self._templates: dict[bytes, Template] = {}  # a traceback header's shape -> the body that followed it
        self._learning: Learning | None = None  # the traceback being read line by line, to become a template
        self._consumed = 0  # bytes offset of the end of the last line a replayed traceback consumed
        self._replayed: tuple[int, bytes, int] | None = None  # the last replayed traceback: group, template, winner
        self._closers: dict[bytes, tuple[bytes, int]] = {}  # template -> the line shape that closed it, its decision
        self._runs: dict[tuple[bytes, str, bytes], Run | None] = {}  # (template, class, closer) -> its run
        self._hits: list[int] = []  # the screen's hits in the block being scanned
        self._replays = self._bulk = 0
        self._end = 0  # the end of the block being scanned
        self._per_rule: dict[str, int] = {}
        self._suppressed: dict[str, int] = {}
        self._first_fatal: Finding | None = None
        self._ready_line: int | None = None
        self._last_ready: int | None = None  # the last ready milestone (a later start may follow the first)
        self._served: tuple[int, str] | None = None  # the last decode report or served request: (line, what)
        self._memory = MemoryFacts()
        self._accept = AcceptTracker()
        self._harmless_record = -2  # the line of the last benign record that covers the traceback after it
        self._tb_head: tuple[int, str] = (0, "")  # the open traceback group and the text of its first line
        self._raw = b""  # the line being read, as the log has it
        self._claimed: dict[str, int] = {}  # rule id -> lines it claimed (info and benign rules too)
        self._json: bool | None = None  # decided on the first non-blank input
        self._partial = b""  # an incomplete last line from feed_bytes
        self._buf: bytes = b""  # the block being scanned, and the offset of the current line in it
        self._cur = 0
        self._seen_to = 0  # the block was looked back at up to here
        self._carry = b""  # the end of the previous block that was not looked back at
        self._tail = b""  # the last ORPHAN_BYTES of the previous blocks
        self._end_lines: list[int] = []  # the input line numbers of the last lines scanned (ending.ENDING_LINES)
        self._block: tuple[int, int, list[int] | None] = (0, 0, None)  # start, line base, line map

    # ---------------------------------------------------------------- public API

    @property
    def first_fatal(self) -> Finding | None:
        return self._first_fatal

    @property
    def lines(self) -> int:
        return self._line

    @property
    def replayed(self) -> tuple[int, int]:
        """(tracebacks replayed from a template, events of runs counted in bulk): how the input was read."""
        return self._replays, self._bulk

    @property
    def context(self) -> LaunchContext:
        return self._ctx

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

    def feed_screened(self, data: bytes, hits: list[int], where: list[int], newlines: int) -> list[Finding]:
        """Feed a block of whole lines whose screen was run elsewhere (`classify_path`): `hits` are
        the screen's offsets, `where[i]` the block line index of hits[i], `newlines` its line count."""
        if self._partial:
            raise ValueError("feed_screened after a partial line: feed whole lines")
        if self._json is None and data.strip():
            self._json = journal.looks_like_json_journal(data[:65536])
        if self._json:
            return self._feed_block(data)
        before = len(self._findings)
        self._scan(data, None, screened=(hits, where, newlines))
        return self._findings[before:]

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
        if root is None:
            # nothing fatal: a log whose last records are a process's death is still a crash
            root = self._died_at_end()
            if root is not None:
                findings = sorted([*findings, root], key=lambda f: (f.line, f.rule_id))
        serving = self.serving()
        verdict = verdict_of(root, findings, serving is not None)
        return Report(verdict=verdict, root_cause=root, findings=findings, lines=self._line,
                      ready_line=self._ready_line, memory=self._memory, accept=self._accept.stats(),
                      suppressed=dict(self._suppressed), launch=self._ctx.to_json(), claimed=dict(self._claimed),
                      serving=serving)

    def serving(self) -> tuple[int, str] | None:
        """The last positive evidence of serving in what was read, as (line, what), when it comes
        after the last start of the server (a `server_args` line): a ready milestone, a decode
        report or a served request. None: nothing read shows this start served."""
        got = [(line, what) for line, what in ((self._last_ready or 0, "ready"), *(self._served and [self._served] or []))
               if line]
        if not got:
            return None
        line, what = max(got)
        return (line, what) if line > (self._ctx.launch_line or 0) else None

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
              start: int = 0, end: int | None = None,
              screened: tuple[list[int], list[int], int] | None = None) -> None:
        """The complete lines in buf[start:end]; `line_map[i]` is the input line of block line i.

        `screened` (offsets, their line indices in the block, newlines in the block) is the
        screen's work done elsewhere (`classify_path` runs it in worker processes).
        """
        end = len(buf) if end is None else end
        base = self._line
        pos = start  # byte offset of the next unprocessed line
        idx = 0  # its index in the block
        accept_from = start  # offset after the last accept-len report the screen saw
        count = buf.count
        find = buf.find
        accept = self._accept
        self._buf, self._seen_to = buf, start  # for _lookback: lines before start were not looked at
        self._block = (start, base, line_map)
        self._end = end

        def lineno(i: int) -> int:
            return line_map[i] if line_map is not None else base + i + 1

        def slow_until_closed() -> None:
            # line by line while a traceback is open
            nonlocal pos, idx
            while self._tb.open and pos < end:
                e = find(b"\n", pos, end)
                e = e if e >= 0 else end
                self._cur = pos
                more = self._line_full(buf[pos:e], lineno(idx), hit=None)
                if more:  # a replayed traceback: its lines are done
                    pos, idx = self._consumed + 1, idx + 1 + more
                else:
                    pos, idx = e + 1, idx + 1
            if not self._tb.open:
                self._settle_group()

        slow_until_closed()
        line_full = self._line_full
        if screened is not None:
            hits, where = screened[0], screened[1]
        else:
            hits, where = (self.screen.hits(buf, pos, end) if pos < end else []), None
        self._hits = hits
        for k, h in enumerate(hits):
            if h < pos:
                continue  # already handled (same line, or inside a traceback read line by line)
            ls = buf.rfind(b"\n", pos, h) + 1
            if ls < pos:
                ls = pos
            idx = where[k] if where is not None else idx + count(b"\n", pos, ls)
            e = find(b"\n", ls, end)
            if e < 0:
                e = end
            if accept.streak and find(ACCEPT_B, ls, e) >= 0 and count(ACCEPT_B, accept_from, ls):
                # an accept-len report the screen skipped lies between the previous low one and
                # this one: it was not low, so the streak of 1.00s is broken
                accept.broken()
            self._cur = ls
            more = line_full(buf[ls:e], line_map[idx] if line_map is not None else base + idx + 1, hit=h - ls)
            if more:  # a traceback replayed from its template: the lines it consumed are done
                e = self._consumed
                idx += more
            if accept.streak:
                accept_from = e  # reports after this line decide whether the streak holds
            pos, idx = e + 1, idx + 1
            if self._tb.open:
                slow_until_closed()
        if accept.streak and count(ACCEPT_B, accept_from, end):
            accept.broken()
        accept.note_recent(buf, start, end)
        served = _last_served(buf, start, end)
        # what was not looked back at yet: its end may hold a stop that explains the next block
        tail_from = max(self._seen_to, end - LOOKBACK_BYTES)
        self._carry = buf[tail_from:end] if tail_from < end else b""
        # the last lines of the block, for frames whose exception line opens the next one
        self._tail = (self._tail + buf[max(start, end - ORPHAN_BYTES):end])[-ORPHAN_BYTES:]
        self._buf = b""
        if physical is not None:
            self._line = base + physical
        elif screened is not None:
            self._line = base + screened[2]
        elif pos <= end:
            self._line = base + idx + count(b"\n", pos, end)
        else:  # the last line had no newline: it is not a complete line
            self._line = base + idx - 1
        if served is not None:
            if line_map is not None:
                i = count(b"\n", start, served[0])
                self._served = (line_map[i] if i < len(line_map) else self._line, served[1])
            else:  # counted from the end: the last such line is usually near it
                self._served = (self._line - count(b"\n", served[0], end) + 1, served[1])
        # the input line of each of the last lines, beside the tail that holds their text
        last = line_map[-ending.ENDING_LINES:] if line_map is not None else \
            range(max(base, self._line - ending.ENDING_LINES) + 1, self._line + 1)
        self._end_lines = (self._end_lines + list(last))[-ending.ENDING_LINES:]

    def _lookback(self) -> None:
        """Apply the unit's start/stop lines that the screen skipped, up to the current line.

        Called only before shutdown noise would become a finding: the region since the last look
        (at most LOOKBACK_BYTES, and the tail of the previous block) is searched once.
        """
        rx = self._lookback_rx
        upto = self._cur
        lo = max(self._seen_to, upto - LOOKBACK_BYTES)
        carry = self._carry
        self._seen_to, self._carry = max(self._seen_to, upto), b""
        if rx is None:
            return
        if carry:  # the previous block's end, not looked at yet (its lines have no number here)
            for m in rx.finditer(carry):
                self._start_or_stop(carry, m, None)
        if self._buf and lo < upto:
            # searched in place (no copy): a healthy stretch costs one failed search
            m = rx.search(self._buf, lo, upto)
            while m is not None:
                self._start_or_stop(self._buf, m, lo)
                m = rx.search(self._buf, m.end(), upto)

    def _start_or_stop(self, region: bytes, m: re.Match[bytes], lo: int | None) -> None:
        """A start or stop keyword found by `_lookback` in `region`: note it if a rule says so."""
        base = 0 if lo is None else lo
        ls = max(base, region.rfind(b"\n", base, m.start()) + 1)
        le = region.find(b"\n", m.end())
        text, _ = journal.clean_line(region[ls:le if le >= 0 else len(region)].decode("utf-8", "replace"))
        for i in self._index.candidates(text):
            rule = self._rules[i]
            if rule.context in ("start", "stop") and rule.search(text):
                self._claimed[rule.id] = self._claimed.get(rule.id, 0) + 1
                self._note_context(rule, text, self._lineno_at(ls) if lo is not None else 0)
                break

    def _spec_setting_just_before(self) -> bool:
        """Whether one of the few lines before the current one is about speculative decoding."""
        if not self._buf:
            return False
        cur, block_start = self._cur, self._block[0]
        recent = (self._tail + self._buf[block_start:cur] if cur - block_start < SPEC_LOOKBACK_BYTES
                  else self._buf[cur - SPEC_LOOKBACK_BYTES:cur])
        return _SPEC_SETTING_RX.search(recent[-SPEC_LOOKBACK_BYTES:]) is not None

    def _build_error_above(self) -> tuple[int, str] | None:
        """The nearest line above the current one (up to BUILD_LINES lines and BUILD_BYTES, the
        previous blocks' tail included, so a poll boundary changes nothing) that is a compiler's,
        linker's or shell's own error line: (its input line, its text)."""
        rx, summary = self._build_error_rx, self._summary_rx
        if rx is None or summary is None or not self._buf:
            return None
        block_start = self._block[0]
        lo = max(block_start, self._cur - BUILD_BYTES)
        seen = 0
        end = self._cur
        while end > lo and seen < BUILD_LINES:  # this block's lines above the current one
            nl = self._buf.rfind(b"\n", lo, end - 1)
            if nl < 0 and lo > block_start:
                return None  # the window's first line may be cut
            s = nl + 1 if nl >= 0 else lo  # (the block's first line starts at the block)
            text = journal.clean_line(self._buf[s:end].decode("utf-8", "replace"))[0]
            if rx.search(text) and not summary.search(text):
                return self._lineno_at(s), text.strip()
            end, seen = s, seen + 1
        if lo > block_start or not self._tail:
            return None
        tail = self._tail[-BUILD_BYTES:].split(b"\n")[:-1]  # the previous blocks' last lines
        numbers = self._end_lines
        for k in range(1, min(len(tail), len(numbers), BUILD_LINES - seen) + 1):
            text = journal.clean_line(tail[-k].decode("utf-8", "replace"))[0]
            if rx.search(text) and not summary.search(text):
                return numbers[-k], text.strip()
        return None

    def _adopt_orphan_frames(self, lineno: int) -> None:
        """An exception line after frames but no `Traceback` header (a pasted excerpt, a header lost
        to a rate limit): the frames before it are read back, so where it was raised is known."""
        if self._buf:
            cur, block_start = self._cur, self._block[0]
            # the previous blocks' tail joins on only where this block's start is within reach
            region = (self._tail + self._buf[block_start:cur] if cur - block_start < ORPHAN_BYTES
                      else self._buf[cur - ORPHAN_BYTES:cur])
        else:
            region = self._tail
        end = len(region)
        back: list[str] = []
        frames = 0
        while end > 0 and len(back) < ORPHAN_LINES:
            s = region.rfind(b"\n", 0, end - 1) + 1 if end > 0 else 0
            line = region[s:end].rstrip(b"\n")
            text, _ = journal.clean_line(line.decode("utf-8", "replace"))
            if journal.is_frame(text):
                frames += 1
            elif not (text[:1] in (" ", "\t") or not text.strip() or journal.is_caret(text)):
                break
            back.append(text)
            if s == 0:
                break
            end = s
        while back and not journal.is_frame(back[-1]):
            back.pop()  # the group starts at its first frame
        if not frames or not back:
            return
        start = lineno - len(back)
        self._tb.step(journal.TRACEBACK_HEADER, True, start)
        self._tb_head = (self._tb.group, back[-1].strip())  # the group's first line is its first frame
        for text in reversed(back):
            self._tb.step(text, False, start)

    def _lineno_at(self, offset: int) -> int:
        """The input line number of the line at `offset` of the current block."""
        start, base, line_map = self._block
        i = self._buf.count(b"\n", start, offset)
        return line_map[i] if line_map is not None and i < len(line_map) else base + i + 1

    # ---------------------------------------------------------------- lines

    def _line_full(self, raw: bytes, lineno: int, hit: int | None) -> int:
        """One line read in full; returns how many lines after it were read with it (a traceback
        replayed from its template, ending at `self._consumed`), else 0."""
        self._raw = raw  # the line as the log has it: an unnamed failure's logger prefix is read from it
        key: bytes | None = None
        if len(raw) > MAX_MATCH_CHARS:
            center = hit if hit is not None else 0
            lo = max(0, center - MAX_MATCH_CHARS // 2)
            raw = raw[lo: lo + MAX_MATCH_CHARS]
        elif not self._tb.open:
            key = raw.translate(DIGIT0)
            tpl = self._templates.get(key) if self._templates and self.replay else None
            if tpl is not None:
                more = self._replay(tpl, raw, lineno)
                if more:
                    return more
            known = self._memo.get(key)
            if known is not None and self._memoised(known):
                return 0
        text, new_record = journal.clean_line(raw.decode("utf-8", "replace"))
        was_open = self._tb.open
        if not was_open and _EXC_START.match(text) and (self._buf or self._tail):
            self._adopt_orphan_frames(lineno)
        group, kind = self._tb.step(text, new_record, lineno)
        if kind == "header" and group != self._tb_head[0]:
            self._tb_head = (group, text.strip())
            self._learning = Learning(key, text.strip(), len(raw)) if self.replay and key is not None \
                and self._tb.start_line == lineno \
                and self._block[2] is None else None
        elif self._learning is not None:
            self._learn(raw, text, kind, new_record)
        if was_open and group is None:
            self._settle_group()
            if kind == "other" and key is None and len(raw) <= MAX_MATCH_CHARS:
                # the line that closed a traceback is read like any line outside one: its shape's
                # decision applies (a server failing every request: the next record after each)
                key = raw.translate(DIGIT0)
                known = self._memo.get(key)
                if known is not None and self._memoised(known):
                    if self._replayed is not None and self._replayed[0] == self._tb.group:
                        self._closers[self._replayed[1]] = (key, known)  # what follows this template
                    return 0
        if kind in ("frame", "code") or (group is None and _RAISE_CODE.match(text)):
            # source code quoted by a traceback (`raise HFValidationError(`, `f"Cannot reach {url}"`), with or without its
            # frame line (pasted excerpts), is not an error message
            return 0
        has_accept = ACCEPT in text
        if has_accept:
            self._accept_line(text, lineno)
        if "CUDA_VISIBLE_DEVICES" in text:
            note_visible(self._ctx, text)  # which cards this start was given, where the log says it
            has_accept = True  # (its value is not in the message shape: never memoised)
        cands = self._index.candidates(text)
        seen = text
        if '", line ' in text:
            # a traceback flattened onto one line (CloudWatch, a pasted block): the `raise X(` its
            # frames quote is source code, not the error (blanked, so offsets stay the line's)
            seen = _INLINE_RAISE.sub(lambda r: r.group(1) + " " * (r.end() - r.start(1) - len(r.group(1))), text)
        rule, m, named = self._match(seen, group, cands)
        if kind == "header" and self._learning is not None and (cands or has_accept):
            self._learning = None  # a header line that says more than the header is read in full each time
        if key is not None and kind == "other" and group is None and not has_accept \
                and (rule is None or rule.plain) and not self._digits_matter(text, cands):
            if len(self._memo) >= MAX_MEMO:
                self._memo.clear()
            self._memo[key] = -1 if rule is None else rule.order
        self._decided(rule, m, named, text, lineno, group, kind)
        return 0

    def _decided(self, rule: Rule | None, m: re.Match[str] | None, named: Resolution | None, text: str,
                 lineno: int, group: int | None, kind: str) -> None:
        """What the rule that claimed a line (or none) makes of it."""
        if rule is not None:
            self._claimed[rule.id] = self._claimed.get(rule.id, 0) + 1
        if rule is None:
            if kind == "exc" and group is not None and self._backstop is not None:
                # a traceback ended in an exception no rule names: keep it as generic evidence
                self._add(self._backstop, text, text, lineno, group)
            return
        if rule.severity == "info":
            self._info(rule, text, lineno)
            return
        if rule.context is not None:
            self._note_context(rule, text, lineno)
        # the match and the rest of its sentence: still a substring of the line (the gate finds
        # the journal entry by it), but readable ("undefined symbol: _ZNK3c10...", not "undefined symbol: ")
        evidence = text[m.start(): max(m.end(), min(len(text), m.start() + 160))] if m is not None else text
        if rule.role == "backstop":
            evidence = text.strip()[:300]
        self._add(rule, text, evidence, lineno, group, named)

    def _memoised(self, known: int) -> bool:
        """Apply a memoised decision for a line's shape; False when the line must be read (its
        rule has not kept its examples yet)."""
        if known < 0:
            return True  # a shape that no rule claims (a screen false positive)
        rid = self._rules[known].id
        self._claimed[rid] = self._claimed.get(rid, 0) + 1
        n = self._per_rule.get(rid, 0)
        if n >= MAX_PER_RULE:
            # the rule has its examples: this copy is only counted
            self._per_rule[rid] = n + 1
            self._suppressed[rid] = self._suppressed.get(rid, 0) + 1
            return True
        self._claimed[rid] -= 1  # read in full below, where it is claimed again
        return False

    def _digits_matter(self, text: str, cands: tuple[int, ...]) -> bool:
        """Whether a candidate rule has a pattern that tells digits apart and whose keyword is in
        this line (then lines of this shape may get different answers: no memo)."""
        rules = self._rules
        return any(rules[i].digit_sensitive and any(k in text for k in rules[i].sensitive_literals) for i in cands)

    def _match(self, text: str, group: int | None,
               cands: tuple[int, ...]) -> tuple[Rule | None, re.Match[str] | None, Resolution | None]:
        """The first rule (by priority) that claims the line, its match, and what its resolver named.

        A resolver may decline (`DECLINE`): the log's context does not support the rule's cause,
        and the next rule gets the line."""
        rules = self._rules
        raised: list[str] | None = None
        for i in cands:
            rule = rules[i]
            if rule.frames or rule.raised_in:
                if group is None:
                    continue
                if rule.frames and not any(fr in path for path in self._tb.frames for fr in rule.frames):
                    continue
                if rule.raised_in:
                    if raised is None:
                        raised = self._tb.raised_in()
                    if not any(fr in path for path in raised for fr in rule.raised_in):
                        continue
            m = rule.search(text)
            if m is None:
                continue
            named: Resolution | None = None
            if rule.resolve is not None:
                named = RESOLVERS[rule.resolve][0](Clues(
                    self._ctx, text, self._tb.part if group is not None else [], group is not None,
                    self._spec_setting_just_before, self.cat.key_of))
                if named is DECLINE:
                    continue
            return rule, m, named
        return None, None, None

    def _info(self, rule: Rule, text: str, lineno: int) -> None:
        if rule.context is not None:
            self._note_context(rule, text, lineno)
        elif rule.id == "server_ready":
            if self._ready_line is None or "ready to roll" in text:
                self._ready_line = lineno
            self._last_ready = lineno
        else:
            self._memory = parse_memory(text, self._memory)

    def _note_context(self, rule: Rule, text: str, lineno: int) -> None:
        ctx = self._ctx
        what = rule.context
        if what == "launch":
            note_launch(ctx, text, lineno)
        elif what == "start":
            ctx.stop_line = None
        elif what == "stop":
            if ctx.stop_line is None:
                ctx.stop_line = lineno or max(1, self._line)
        elif what == "capture_on":
            if ctx.capture is None:
                ctx.capture = True
        elif what == "capture_off":
            ctx.capture = False
        elif what == "plugin_seen":
            ctx.plugin_seen = True

    def _accept_line(self, text: str, lineno: int) -> None:
        m = self._accept.report(text, random_weights=self._ctx.load_format == "dummy")
        if m is None:
            return
        # the evidence is a substring: the gate finds the entry by it
        self._record(self._derived("accept_len_stuck_at_one", {"streak": str(ACCEPT_STREAK)}, lineno, text,
                                   m.group(0), "cause"))

    def _derived(self, rule_id: str, facts: dict[str, str], lineno: int, text: str, evidence: str,
                 role: str) -> Finding:
        """A finding the scanner builds from more than one line (catalogue.DERIVED)."""
        v = self.cat.derived_finding(rule_id)
        meaning, remedy = v.filled(facts)
        return Finding(label=v.label, severity=v.severity, line=lineno, text=text[:MAX_TEXT_CHARS], evidence=evidence,
                       remedy=remedy, profile_key=v.profile_key, direction=v.direction, rule_id=rule_id, role=role,
                       meaning=meaning)

    def _add(self, rule: Rule, text: str, evidence: str, lineno: int, group: int | None,
             named: Resolution | None = None) -> None:
        severity, label, hardware, direction = rule.severity, rule.label, False, rule.direction
        remedy, meaning, profile_key = rule.remedy, rule.meaning, rule.profile_key
        variant, facts, context = None, {}, ""
        if rule.xid_hardware:
            m = _XID_RX.search(text)
            code = int(m.group(1)) if m else -1
            hardware = code in rule.xid_hardware
            variant, facts = rule.variant("hardware" if hardware else "application"), {"code": str(code)}
        elif named is not None:
            variant, facts, context = rule.variant(named.variant), named.facts, named.context
            if "algorithm" in facts:
                facts = {**facts, "algorithm_check": self.cat.algorithm_check(facts["algorithm"])}
        if variant is not None:
            label, severity, direction, profile_key = variant.label, variant.severity, variant.direction, variant.profile_key
            meaning, remedy = variant.filled(facts)
            if rule.xid_hardware and not hardware and code in (13, 31):
                label = "illegal_memory_access"  # the application Xids of a bad memory access
        if rule.role in SHUTDOWN_ROLES and severity in ("fatal", "warning") and self._buf:
            self._lookback()
        if self._ctx.stop_line is not None and rule.role in SHUTDOWN_ROLES and severity in ("fatal", "warning"):
            severity = "benign"
            meaning = (f"Shutdown after the stop requested at line {self._ctx.stop_line}, not a crash. " + meaning).strip()
        if rule.covers_traceback and severity == "benign":
            self._harmless_record = lineno
        elif rule.role == "backstop" and group is not None and self._tb.starts.get(group) == self._harmless_record + 1:
            # the traceback logger.exception printed under a record that says it is normal
            severity = "benign"
            meaning = (f"Part of the harmless record at line {self._harmless_record} (its logger attached the "
                       f"traceback), not a crash. " + meaning).strip()
        if (rule.role in ("cause", "wrapper", "downstream") and self._summary_rx is not None
                and self._summary_rx.search(text) and self._per_rule.get(rule.id, 0) < MAX_PER_RULE):
            # a build tool's exit status over the compiler's or shell's own error line: that line wins
            above = self._build_error_above()
            if above is not None:
                context = "; ".join(x for x in (context, f"the build tool's line {lineno}: {text.strip()[:200]}") if x)
                lineno, text, evidence = above[0], above[1], above[1][:300]
        held = group is not None and self._tb.open and rule.role in HELD_ROLES
        if self._per_rule.get(rule.id, 0) >= MAX_PER_RULE:
            # the rule has its examples: count this one without building it (a held one when its
            # traceback settles, as a built one would have been)
            if held:
                self._pending_n.append((rule.id, rule.role))
            else:
                self._per_rule[rule.id] += 1
                self._suppressed[rule.id] = self._suppressed.get(rule.id, 0) + 1
            return
        frames: tuple[str, ...] = ()
        signature = ""
        if group is not None and self._tb.part and self._per_rule.get(rule.id, 0) < MAX_PER_RULE:
            inner = self._tb.innermost()
            frames = tuple(f.short() for f in inner)
            if rule.role == "backstop" and label == "unclassified_crash":
                signature = crash_signature(text, self._tb.part)
        description = None
        if label == "unclassified_crash" and rule.role in ("backstop", "consequence"):
            # a failure no rule names: its component, exception and fingerprint (issue 31)
            description = describe(text, self._tb.part if group is not None else [],
                                   self._raw.decode("utf-8", "replace"), self.cat.components)
            if rule.role == "backstop":
                remedy, profile_key = description.component.remedy, description.component.profile_key
        f = Finding(label=label, severity=severity, line=lineno, text=text[:MAX_TEXT_CHARS],
                    evidence=evidence[:MAX_TEXT_CHARS], remedy=remedy, profile_key=profile_key,
                    direction=direction, rule_id=rule.id, role=rule.role, meaning=meaning,
                    group=group, hardware=hardware, frames=frames, signature=signature, context=context,
                    description=description)
        if held:
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

    def _died_at_end(self) -> Finding | None:
        """The process's death the input ends in (`ending.death_at_end`), when no stop was
        requested and no harmless record attached it; None otherwise."""
        tail = self._tail
        if not tail or not self._end_lines:
            return None
        self._lookback()  # a stop the screen skipped makes the ending a stop
        if self._ctx.stop_line is not None:
            return None
        raw = tail.split(b"\n")
        if tail.endswith(b"\n"):
            raw.pop()
        if len(tail) >= ORPHAN_BYTES:
            raw = raw[1:]  # the first line may be cut
        n = min(len(raw), len(self._end_lines))
        texts = [ln.decode("utf-8", "replace") for ln in raw[len(raw) - n:]]
        numbers = self._end_lines[len(self._end_lines) - n:]
        hit = ending.death_at_end(texts)
        if hit is None:
            return None
        cite, first = numbers[hit[0]], numbers[hit[1]]
        if first - 1 <= self._harmless_record <= cite:
            return None  # the traceback a record that calls itself normal attached
        if any(f.line == cite and f.severity == "benign" for f in self._findings):
            return None  # a line the catalogue knows as harmless (a rejected request's ValueError)
        text = journal.clean_line(texts[hit[0]])[0].strip()
        died = self._derived("process_died_at_end", {}, cite, text, text[:300], "backstop")
        frames = [fr for t in texts[hit[1]:hit[0] + 1] if (fr := journal.frame_of(journal.clean_line(t)[0])) is not None]
        what = describe(text, frames, texts[hit[0]], self.cat.components)
        return replace(died, remedy=what.component.remedy, profile_key=what.component.profile_key, description=what,
                       frames=tuple(f.short() for f in frames[-1:]))

    def _pending_settled(self) -> list[Finding]:
        """Findings of a traceback still open at report time (the input ended inside it)."""
        out = list(self._pending)
        rule = self._backstop
        if rule is not None and self._tb.open and not any(f.role != "consequence" for f in out) \
                and not any(role != "consequence" for _, role in self._pending_n):
            start = self._tb.starts.get(self._tb.group, 0)
            covered = self._ctx.stop_line is not None or start == self._harmless_record + 1
            severity = "benign" if covered else rule.severity
            # the group's first line as the log has it: its header, or its first frame where the
            # header was lost (an excerpt): the evidence is on the line cited
            head = self._tb_head[1] if self._tb_head[0] == self._tb.group and self._tb_head[1] else journal.TRACEBACK_HEADER
            what = describe(head, self._tb.part, head, self.cat.components)
            out.append(Finding(label=rule.label, severity=severity, line=start, text=head,
                               evidence=head[:300], remedy=what.component.remedy,
                               profile_key=what.component.profile_key, direction=None, rule_id=rule.id,
                               role="backstop", meaning=rule.meaning, group=self._tb.group,
                               frames=tuple(f.short() for f in self._tb.innermost()), description=what))
        return out

    def _settle_group(self) -> None:
        if self._pending_n:
            for rid, _ in self._pending_n:
                self._per_rule[rid] = self._per_rule.get(rid, 0) + 1
                self._suppressed[rid] = self._suppressed.get(rid, 0) + 1
            self._pending_n = []
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        for f in pending:
            self._record(f)


def _last_served(buf: bytes, start: int, end: int) -> tuple[int, str] | None:
    """The offset of the last line in buf[start:end] that shows serving (a decode or prefill report,
    a served request), and what it is; None when there is none. Found from the end with
    bytes.rfind: a block without any costs a few passes of memchr-speed search."""
    best: tuple[int, str] | None = None
    for needle, tails, what in _BATCHES:
        i = buf.rfind(needle, start, end)
        while i >= 0:
            j = i + len(needle)
            if buf[j:j + 2] in (b". ", b", ") and buf.startswith(tails, j + 2):
                ls = buf.rfind(b"\n", start, i) + 1
                if best is None or ls > best[0]:
                    best = (ls, what)
                break
            i = buf.rfind(needle, start, i)
    lo = best[0] if best is not None else start
    i, tries = buf.rfind(_OK_B, lo, end), 0
    while i >= 0 and tries < _SERVED_TRIES:
        ls = buf.rfind(b"\n", start, i) + 1
        if _SERVED_RX.search(buf, ls, i + len(_OK_B)):
            return (ls, "served request")
        i, tries = buf.rfind(_OK_B, lo, ls), tries + 1
    if i >= 0:
        # many 200s of other paths (metrics scrapes): one pass of the regex over what is left
        last = None
        for last in _SERVED_RX.finditer(buf, lo, i + len(_OK_B)):
            pass
        if last is not None:
            return (buf.rfind(b"\n", start, last.start()) + 1, "served request")
    return best


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

