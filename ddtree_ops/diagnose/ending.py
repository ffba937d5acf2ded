"""How a log ends: a process that died in the last records is never a healthy log (issue 20).

The catalogue names causes line by line; this reads only the end of the input. When nothing in
the log is fatal and its last records are a process's death, the log is a crash (unclassified):
a server that printed an uncaught exception, a cut traceback, `terminate called`, a fatal signal
or a non-zero exit, and nothing after it, is not serving. This is a principle about where a log
stops, not a wording: it holds for exceptions and launchers no rule has seen.

What is not an ending:
- a traceback followed by further records (the process logged a caught exception and went on);
- an exception that is a stop (KeyboardInterrupt, a CancelledError, SystemExit with code 0);
- more than a few unprefixed lines after it (a log without record prefixes that went on).
The caller also leaves alone an ending after a requested stop and a traceback that a harmless
record attached (`Scanner.report`).

Pure: lines in, the index of the line to cite out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ddtree_ops.diagnose import journal

ENDING_LINES = 400  # how far back from the end the last event is read
_MAX_PLAIN_AFTER = 6  # unprefixed, unindented lines after a death that can still be its message
# an exception line: a (dotted) class name ending as exception classes do, an optional
# "(Inner)" (Ray's RayTaskError(ValueError)), then ':' or the end
_EXC = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,200}(?:Error|Exception|Exit|Interrupt|Fault|Failure)"
                  r"(?:\([A-Za-z0-9_.]{1,200}\))?(?::|$)")
# exceptions that end a process on purpose (an operator's Ctrl-C, a task cancelled at shutdown,
# sys.exit() / sys.exit(0))
_STOP = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_.]{0,200}\.)?(?:KeyboardInterrupt|CancelledError|GeneratorExit"
                   r"|SystemExit(?:: 0)?$)")
# a process's death in the words of whoever saw it: libstdc++'s terminate, the shell's report of
# a fatal signal (with its script line and pid, or bare), CPython's faulthandler, a Rust panic,
# a parent that was sent SIGQUIT by a child, a fatal signal's name, and a non-zero exit status as
# launchers, multiprocessing, subprocess and systemd word it
_DEATH = re.compile(
    r"terminate called (?:after|without|recursively)"
    r"|(?:^|[0-9] )(?:Segmentation fault|Bus error|Illegal instruction|Floating point exception|Aborted|Killed)"
    r"(?: \(core dumped\))?(?: |$)"
    r"|\(core dumped\)"
    r"|Fatal Python error"
    r"|panicked at "
    r"|[Ss]igquit|SIG(?:QUIT|ABRT|SEGV|BUS|ILL|FPE|KILL)(?:[^A-Z]|$)"
    r"|[Ee]xit(?:ed)?(?: with)? ?(?:code|status)[ :=]{0,3}[(]?-?[1-9]"
    r"|exitcode[ :=]{0,3}-?[1-9]"
    r"|[Rr]eturn ?code[ :=]{0,3}-?[1-9]"
    r"|code=(?:exited, status=[1-9]|killed|dumped)")


def death_at_end(lines: Sequence[str]) -> tuple[int, int] | None:
    """(index of the line to cite, index where the ending event starts) when the last records of
    `lines` (message lines, oldest first, at most ENDING_LINES) are a process's death; else None.

    The line cited is the last death or exception line of the ending; a traceback cut before its
    exception line is cited by its first line (header or frame)."""
    items = [journal.clean_line(ln) for ln in lines[-ENDING_LINES:]]
    offset = max(0, len(lines) - ENDING_LINES)
    plain = 0
    cite: int | None = None
    first: int | None = None
    chained = False  # a chain line was just passed: the line above it is the earlier part's exception
    for i in range(len(items) - 1, -1, -1):
        text, record = items[i]
        s = text.strip()
        if not s or journal.is_caret(text):
            continue
        if cite is None and first is None and (_EXC.match(text) or _DEATH.search(text)):
            if _STOP.match(text):
                return None
            cite = first = i
            continue
        if text.startswith(journal.CHAIN_LINES):
            first, chained = i, True  # the earlier part of a chained traceback is the same event
            continue
        if chained and not record:
            # CPython prints the earlier part's exception line right above the chain line (a blank
            # between), whatever its class is called
            first, chained = i, False
            continue
        if journal.is_frame(text) or journal.TRACEBACK_HEADER in text:
            first = i
            continue
        if text[:1] in (" ", "\t"):
            continue  # a frame's source line, an indented message line
        if cite is not None or first is not None:
            break  # before the ending event: not part of it
        if record:
            return None  # a record after it: the log went on
        plain += 1
        if plain > _MAX_PLAIN_AFTER:
            return None
    if first is None:
        return None
    if cite is None:
        if not any(journal.is_frame(items[j][0]) for j in range(first, len(items))):
            return None
        cite = first
    return offset + cite, offset + first
