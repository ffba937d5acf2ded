"""From what a journal or a log file holds to the message lines the catalogue is matched against.

Pure functions, no I/O:
- `clean_line` strips the prefixes real inputs carry, repeatedly and in any order: journald
  `short`/`short-precise`/`short-iso`/`short-full` (`Nov 29 07:29:01 ct129 unit[123]: `),
  container RFC 3339 timestamps (`docker logs -t`, and the CRI form `... stdout F ` that
  Kubernetes nodes store), `kubectl logs --prefix` (`[pod/NAME/CONTAINER] `), dmesg
  `[ 1234.5678] `, docker-compose `svc-1  | `, Ray / vLLM worker `(SGLangEngine pid=1, ip=10.0.0.1) `,
  `(raylet) `, torchrun `[rank0]: `, ANSI colour codes around any of them, and the server's own
  record prefix (SGLang `[2025-01-01 00:00:00 TP0] `, vLLM `ERROR 03-02 19:49:43 [file.py:12] `).
  Ray's ` [repeated 7x across cluster]` suffix goes too (the line is one event, counted once).
  Each regex is anchored and bounded, so stripping is linear in the prefix.
- `json_messages` turns one `journalctl -o json` line into its message lines; journald exports a
  MESSAGE that is not valid UTF-8 as an array of byte values.
- `TracebackTracker` groups the lines of one Python traceback (header, frames, the exception line
  and its message, chained "During handling ..." parts) so that the classifier can tell a
  consequence from a cause and see which files raised.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# Bounded, anchored alternatives; tried at position 0 until none applies (at most _MAX_STRIPS).
_PREFIX = re.compile(
    r"""(?:
      # journald short / short-precise: "Nov 29 07:29:01[.123456] host ident[pid]: "
      # (the host is a host name: "2025-..Z /usr/lib/x.py:63: FutureWarning: msg" is a timestamp and a message)
      [A-Z][a-z]{2}\ [ 0-9]?[0-9]\ [0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?\ [A-Za-z0-9_.-]{1,255}\ [^ :\[]{1,255}(?:\[[0-9]{1,10}\])?:(?:\ |$)
      # journald short-iso / short-full: "2025-11-29T07:29:01+0000 host ident[pid]: ", "Sat 2025-11-29 07:29:01 UTC host ident[pid]: "
    | (?:[A-Z][a-z]{2}\ )?[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]{1,9})?(?:Z|[+-][0-9]{2}:?[0-9]{2})?(?:\ [A-Z]{2,5})?\ [A-Za-z0-9_.-]{1,255}\ [^ :\[]{1,255}(?:\[[0-9]{1,10}\])?:(?:\ |$)
      # container runtime RFC 3339 timestamp: "2023-02-20T06:44:19.335010Z ", CRI "...Z stdout F "
    | [0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?(?:Z|[+-][0-9]{2}:?[0-9]{2})\ {1,4}(?:(?:stdout|stderr)\ [FP]\ )?
      # kubectl logs --prefix: "[pod/sglang-0/server] "
    | \[pod/[A-Za-z0-9_.-]{1,253}/[A-Za-z0-9_.-]{1,253}\]\ ?
      # ANSI colour codes (Ray and docker compose colour their prefixes)
    | (?:\x1b\[[0-9;]{0,20}m)+
      # dmesg "[26002.108918] " and dmesg -T "[Sat Nov 29 07:29:01 2025] "
    | \[\ {0,12}[0-9]{1,12}\.[0-9]{1,9}\]\ ?
    | \[[A-Z][a-z]{2}\ [A-Z][a-z]{2}\ [ 0-9]?[0-9]\ [0-9]{2}:[0-9]{2}:[0-9]{2}\ [0-9]{4}\]\ ?
      # Ray / vLLM worker "(WorkerDict pid=859188) ", "(pid=12, ip=10.0.0.1) ", "(raylet) "
    | \((?:[A-Za-z_][A-Za-z0-9_.=-]{0,80}\ ){0,3}pid=[0-9]{1,10}(?:,\ ip=[0-9A-Fa-f.:]{1,45})?\)\ ?
    | \((?:raylet|gcs_server|autoscaler|dashboard)(?:,\ ip=[0-9A-Fa-f.:]{1,45}|\ \+[0-9hms]{1,12})?\)\ ?
      # torchrun "[rank0]: " / "[rank0]:[W1120 ...]"
    | \[rank[0-9]{1,6}\]:\ ?
      # docker compose "sglang-1  | "
    | [A-Za-z0-9_.-]{1,64}\ {1,40}\|(?:\ |$)
      # a log viewer's or paste's line number "[80746] " (digits only, then a space)
    | \[[0-9]{1,9}\]\ (?=\S)
    )""",
    re.X,
)

# The server's own record prefixes: stripped too, and they mark the start of a new log record.
_RECORD = re.compile(
    r"""(?:
      # SGLang "[2025-01-01 00:00:00 TP0] "; its diffusion runtime (multimodal_gen) "[12-16 14:27:08] "
      \[(?:[0-9]{4}-)?[0-9]{2}-[0-9]{2}\ [0-9]{2}:[0-9]{2}:[0-9]{2}(?:[ A-Z0-9]{0,40})?\]\ ?
      # vLLM: "ERROR 03-02 19:49:43 [file.py:12] ", and before 0.6 "ERROR 01-12 03:08:10 engine.py:135] "
    | (?:INFO|WARNING|ERROR|DEBUG|CRITICAL|WARN)\ [0-9]{2}-[0-9]{2}\ [0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,6})?\ (?:\[[^\]]{1,200}\]|[A-Za-z0-9_.-]{1,200}:[0-9]{1,7}\])\ ?
      # Python logging's "%(asctime)s - %(name)s - %(levelname)s - " (a wrapper such as olmocr logging the server's
      # lines), and without the name
    | [0-9]{4}-[0-9]{2}-[0-9]{2}\ [0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]{1,6})?\ -\ (?:[^ ]{1,200}\ -\ )?(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\ -\ ?
      # Python logging's "%(asctime)s [%(levelname)s] %(name)s: " (sglang-omni, many launchers), the name a
      # lower-case dotted module (an exception's own name, "torch.OutOfMemoryError: ", is the message)
    | \[?[0-9]{4}-[0-9]{2}-[0-9]{2}\ [0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]{1,6})?\]?\ \[(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\]\ 
      (?:\[[A-Za-z0-9_.-]{1,200}:[0-9]{1,7}(?::[A-Za-z0-9_<>]{1,200})?\]\ ?   # DeepSpeed "[launch.py:321:sigkill_handler] "
       | [a-z_][A-Za-z0-9_.]{0,200}(?<!Error)(?<!Exception)(?<!Warning)(?<!Interrupt)(?<!Exit):\ )?
      # glog (abseil, XLA/JAX, torch C++, Ray's C++ parts): "E0523 10:00:00.123456  1234 file.cc:12] ",
      # and torch's bracketed "[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] "
    | [IWEF][0-9]{3,4}\ [0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{1,9}\ +[0-9]{1,10}\ [^ \]]{1,200}:[0-9]{1,7}\]\ ?
    | \[[IWEF][0-9]{3,4}\ [0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?\ (?:[0-9]{1,10}\ )?[^ \]]{1,200}:[0-9]{1,7}\]\ ?
    )""",
    re.X,
)
# Other starts of a new record that are kept in the text (uvicorn "INFO:     ...", logging "ERROR:root:").
RECORD_KEEP = _RECORD_KEEP = re.compile(r"(?:INFO|WARNING|ERROR|DEBUG|CRITICAL):(?: |[a-z])")

_MAX_STRIPS = 8
_RAY_REPEAT = re.compile(r"\ ?\[repeated [0-9]{1,9}x across cluster\]\s*$")
_ANSI = re.compile(r"\x1b\[[0-9;]{0,20}[A-Za-z]")


def clean_line(text: str) -> tuple[str, bool]:
    """The message without transport and logger prefixes, and whether it starts a new log record.

    Trailing whitespace is dropped; leading indentation is kept (tracebacks depend on it).
    """
    text = text.rstrip("\r\n")
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    if text.endswith("cluster]"):
        text = _RAY_REPEAT.sub("", text)
    for _ in range(_MAX_STRIPS):
        m = _PREFIX.match(text)
        if not m or m.end() == 0:
            break
        text = text[m.end():]
    new_record = False
    for _ in range(2):  # a wrapper's record around the server's own ("... - INFO - [2025-.. TP0] ")
        m = _RECORD.match(text)
        if not m or m.end() == 0:
            break
        text = text[m.end():]
        new_record = True
    if not new_record and _RECORD_KEEP.match(text):
        new_record = True
    return text.rstrip(), new_record


# ------------------------------------------------------------------ journalctl -o json


@dataclass(frozen=True)
class JsonEntry:
    messages: list[str]
    pid: int = 0
    realtime_us: int = 0
    invocation: str = ""
    identifier: str = ""
    cursor: str = ""


def _message(value: Any) -> str:
    # journald exports a non-UTF-8 MESSAGE as a list of byte values
    if isinstance(value, list):
        return bytes(v & 0xFF for v in value if isinstance(v, int)).decode("utf-8", "replace")
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def parse_json_entry(line: str) -> JsonEntry | None:
    """One `journalctl -o json` line; None when it is not a journal entry."""
    import json  # only for `journalctl -o json` input

    try:
        entry = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(entry, dict) or "MESSAGE" not in entry:
        return None
    msg = _message(entry.get("MESSAGE"))
    return JsonEntry(
        messages=msg.split("\n") if msg else [""],
        pid=_int(entry.get("_PID")),
        realtime_us=_int(entry.get("__REALTIME_TIMESTAMP")),
        invocation=str(entry.get("_SYSTEMD_INVOCATION_ID") or entry.get("INVOCATION_ID") or ""),
        identifier=str(entry.get("SYSLOG_IDENTIFIER") or ""),
        cursor=str(entry.get("__CURSOR") or ""),
    )


def json_messages(line: str) -> list[str] | None:
    entry = parse_json_entry(line)
    return None if entry is None else entry.messages


def looks_like_json_journal(sample: bytes | str) -> bool:
    """True when the first non-blank line is a journal JSON object (`journalctl -o json`)."""
    if isinstance(sample, bytes):
        sample = sample[:65536].decode("utf-8", "replace")
    for line in sample.splitlines():
        s = line.strip()
        if not s:
            continue
        return s.startswith("{") and '"MESSAGE"' in s
    return False


# ------------------------------------------------------------------ tracebacks

TRACEBACK_HEADER = "Traceback (most recent call last)"
# the lines that join the parts of a chained traceback (not CHAIN: that is the tracker's state below)
CHAIN_LINES = ("During handling of the above exception", "The above exception was the direct cause")
_FRAME = re.compile(r'\s*File "([^"]{1,1000})", line ([0-9]+)(?:, in (.{1,200}))?')
# Where an engine's own code lives: the innermost of these frames is "where it was raised".
ENGINE_PATHS = ("/sglang/", "/vllm/", "/text_generation_server/", "/tensorrt_llm/", "/ddtree_ops/", "/lmdeploy/")


@dataclass(frozen=True)
class Frame:
    path: str
    line: int
    func: str

    def short(self) -> str:
        """`sglang/srt/models/dflash.py:392 in project_target_hidden` (site-packages stripped)."""
        path = self.path
        for marker in ENGINE_PATHS + ("/site-packages/", "/dist-packages/"):
            i = path.rfind(marker)
            if i >= 0:
                path = path[i + 1:] if marker in ENGINE_PATHS else path[i + len(marker):]
                break
        return f"{path}:{self.line}" + (f" in {self.func}" if self.func else "")
_CARET = re.compile(r"\s*[\^~]+\s*$")
# what CPython's exception line starts with: the (dotted) class name, then ":" or the end
_EXC_SHAPE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,200}(?::|$)")

def is_frame(text: str) -> bool:
    return _FRAME.match(text) is not None


def frame_of(text: str) -> Frame | None:
    """The frame a traceback line names (`  File "p.py", line 3, in f`), or None."""
    m = _FRAME.match(text)
    return Frame(m.group(1), int(m.group(2)), (m.group(3) or "").strip()) if m else None


def is_caret(text: str) -> bool:
    return _CARET.match(text) is not None


IDLE, FRAMES, EXC, EXC_BLANK, CHAIN = "idle", "frames", "exc", "exc_blank", "chain"
_MAX_MESSAGE_LINES = 80
_MAX_GROUP_LINES = 4000
_MAX_BLANKS = 4


@dataclass
class TracebackTracker:
    """Which traceback (if any) each line belongs to.

    A group runs from `Traceback (most recent call last):` through the frames, the exception line
    and its message, across chained parts, and closes at the first line that cannot belong to it
    (a new log record, a non-chain line after a blank, or a size bound for hostile input).
    """

    state: str = IDLE
    group: int = 0  # id of the current (or last) group; 0 = none yet
    start_line: int = 0
    frames: list[str] = field(default_factory=list)  # paths, every part of the group
    part: list[Frame] = field(default_factory=list)  # frames of the part being read (the last chained part)
    starts: dict[int, int] = field(default_factory=dict)  # group id -> first line
    _lines: int = 0
    _msg: int = 0
    _blanks: int = 0
    _after_frame: bool = False  # the previous line was a frame (its source line may follow, unindented)

    @property
    def open(self) -> bool:
        return self.state != IDLE

    def _close(self) -> None:
        self.state = IDLE

    def _begin(self, line: int) -> None:
        self.group += 1
        self.start_line = line
        self.starts[self.group] = line
        self.frames = []
        self.part = []
        self._lines = 0

    def raised_in(self, n: int = 2) -> list[str]:
        """"path function" of the frames that raised: the innermost `n`, and the innermost engine frame."""
        part = self.part
        out = [f"{f.path} {f.func}" for f in part[-n:]]
        for f in reversed(part):
            if any(m in f.path for m in ENGINE_PATHS):
                key = f"{f.path} {f.func}"
                if key not in out:
                    out.append(key)
                break
        return out

    def innermost(self) -> list[Frame]:
        """The innermost frame, and the innermost frame of ours (ddtree_ops) and of the engine's."""
        part = self.part
        out: list[Frame] = part[-1:]
        for want in (("/ddtree_ops/",), ENGINE_PATHS):
            for f in reversed(part):
                if any(m in f.path for m in want):
                    if f not in out:
                        out.append(f)
                    break
        return out

    def note_lines(self, n: int, after_frame: bool) -> None:
        """`n` lines of frames, source lines and blanks read elsewhere (a replayed template's
        body; its frames are appended by the caller): what `step` would have counted."""
        self._lines += n
        self._after_frame = after_frame

    def step(self, text: str, new_record: bool, line: int) -> tuple[int | None, str]:
        """Feed one cleaned line; returns (group id or None, kind).

        kind is one of header, frame, code, loose (a frame's unindented source line), exc, msg,
        chain, blank, other.
        """
        if TRACEBACK_HEADER in text:
            self._after_frame = False
            if self.state != CHAIN:
                self._begin(line)
            self.part = []
            self.state, self._blanks = FRAMES, 0
            return self.group, "header"
        if self.state == IDLE:
            if text.startswith(CHAIN_LINES):
                # a chained part whose first half was cut off (excerpts, journald rate limits)
                self._begin(line)
                self.state, self._blanks = CHAIN, 0
                return self.group, "chain"
            return None, "other"
        self._lines += 1
        if self._lines > _MAX_GROUP_LINES:
            self._close()
            return None, "other"
        blank = not text.strip()
        if self.state == FRAMES:
            if blank:
                return self.group, "blank"
            m = _FRAME.match(text)
            after_frame, self._after_frame = self._after_frame, m is not None
            if m:
                self.frames.append(m.group(1))
                self.part.append(Frame(m.group(1), int(m.group(2)), (m.group(3) or "").strip()))
                return self.group, "frame"
            if text[:1] in (" ", "\t") or _CARET.match(text):
                return self.group, "code"
            if text.startswith(CHAIN_LINES):
                self.state, self._blanks = CHAIN, 0
                return self.group, "chain"
            if after_frame and not new_record and not _EXC_SHAPE.match(text):
                # CPython prints a frame's source line right under it; a paste that lost the
                # indentation still has it there ("scheduler.event_loop_normal()"). Not the
                # exception: the frames after it still count. Its text is still matched.
                return self.group, "loose"
            self.state, self._msg = EXC, 0
            return self.group, "exc"
        if self.state == EXC:
            if blank:
                self.state, self._blanks = EXC_BLANK, 1
                return self.group, "blank"
            if text.startswith(CHAIN_LINES):
                self.state, self._blanks = CHAIN, 0
                return self.group, "chain"
            self._msg += 1
            if new_record or self._msg > _MAX_MESSAGE_LINES:
                self._close()
                return None, "other"
            return self.group, "msg"
        if self.state == EXC_BLANK:
            if blank:
                self._blanks += 1
                if self._blanks > _MAX_BLANKS:
                    self._close()
                    return None, "blank"
                return self.group, "blank"
            if text.startswith(CHAIN_LINES):
                self.state, self._blanks = CHAIN, 0
                return self.group, "chain"
            self._close()
            return None, "other"
        # CHAIN: waiting for the next header
        if blank:
            self._blanks += 1
            if self._blanks > _MAX_BLANKS:
                self._close()
                return None, "blank"
            return self.group, "blank"
        self._close()
        return None, "other"
