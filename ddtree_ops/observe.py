"""Pure parsers from what a host printed to what the tool decides on, plus thin readers.

The readers run one argv from `remote` through a Host and hand the text to a parser; the
parsers are tested on captured output, the readers against the lab.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

from ddtree_ops import remote
from ddtree_ops.diagnose.journal import parse_json_entry
from ddtree_ops.host import Host


@dataclass(frozen=True)
class UnitState:
    active: str = "unknown"  # ActiveState
    sub: str = "unknown"  # SubState
    result: str = "unknown"
    main_status: int = 0  # ExecMainStatus
    main_pid: int = 0
    restarts: int = 0  # NRestarts
    invocation: str = ""
    load: str = "unknown"
    file_state: str = ""
    fragment: str = ""
    drop_ins: tuple[str, ...] = ()

    @property
    def exists(self) -> bool:
        return self.load not in ("not-found", "unknown")

    @property
    def failed(self) -> bool:
        return self.active == "failed" or self.sub in ("auto-restart", "failed") or (
            self.result not in ("success", "unknown", ""))

    @property
    def running(self) -> bool:
        return self.active == "active" and self.sub == "running"

    def describe(self) -> str:
        extra = f", result={self.result}" if self.result not in ("success", "") else ""
        return f"{self.active}/{self.sub}{extra}, pid={self.main_pid}, restarts={self.restarts}"


def parse_systemctl_show(text: str) -> UnitState:
    kv = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            kv[key] = value

    def num(key: str) -> int:
        try:
            return int(kv.get(key, "0") or 0)
        except ValueError:
            return 0

    return UnitState(
        active=kv.get("ActiveState", "unknown"), sub=kv.get("SubState", "unknown"),
        result=kv.get("Result", "unknown"), main_status=num("ExecMainStatus"), main_pid=num("MainPID"),
        restarts=num("NRestarts"), invocation=kv.get("InvocationID", ""), load=kv.get("LoadState", "unknown"),
        file_state=kv.get("UnitFileState", ""), fragment=kv.get("FragmentPath", ""),
        drop_ins=tuple(kv.get("DropInPaths", "").split()),
    )


@dataclass(frozen=True)
class JournalLine:
    message: str
    cursor: str = ""
    invocation: str = ""
    realtime_us: int = 0
    pid: int = 0


def parse_journal_json(text: str) -> list[JournalLine]:
    """`journalctl -o json` output, one JournalLine per message line (tracebacks arrive as one
    multi-line MESSAGE or as one entry per line, depending on how the service writes)."""
    out: list[JournalLine] = []
    for raw in text.splitlines():
        entry = parse_json_entry(raw) if raw.lstrip().startswith("{") else None
        if entry is None:
            continue
        for part in entry.messages:
            out.append(JournalLine(part, entry.cursor, entry.invocation, entry.realtime_us, entry.pid))
    return out


def parse_cursor(text: str) -> str | None:
    for line in text.splitlines():
        if line.startswith("-- cursor: "):
            return line.removeprefix("-- cursor: ").strip()
    return None


# ------------------------------------------------------------------ readers


def unit_state(host: Host, unit: str) -> UnitState:
    res = host.run(remote.systemctl_show(unit), timeout=20)
    return parse_systemctl_show(res.stdout)


def journal_cursor(host: Host, unit: str) -> str | None:
    return parse_cursor(host.run(remote.journal_cursor(unit), timeout=20).stdout)


def read_files(host: Host, paths: list[str]) -> dict[str, bytes | None]:
    """Several small files in one round trip (base64 framed); None for the ones that are absent."""
    script = ('for f in "$@"; do if [ -f "$f" ]; then printf "%s\\n" "+$f"; base64 -w0 -- "$f"; '
              'printf "\\n"; else printf "%s\\n" "-$f"; fi; done')
    res = host.run(["sh", "-c", script, "sh", *paths], sudo=True, timeout=30)
    out: dict[str, bytes | None] = {p: None for p in paths}
    lines = res.stdout.splitlines()
    i = 0
    while i < len(lines):
        head = lines[i]
        if head.startswith("+") and i + 1 < len(lines):
            out[head[1:]] = base64.b64decode(lines[i + 1])
            i += 2
        else:
            i += 1
    return out
