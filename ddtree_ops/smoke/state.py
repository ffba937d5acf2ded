"""What a smoke run keeps on the control machine: the no-overlap run lock (`flock -n` in process)
and the small state file that remembers NRestarts and golden outputs between runs."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from ddtree_ops.smoke.judge import HostResult
from ddtree_ops.smoke.observe import Golden, Previous
from ddtree_ops.treestats import from_dict, to_dict

if TYPE_CHECKING:
    from ddtree_ops.profile import Profile


def default_state_dir() -> Path:
    """$DDTREE_OPS_STATE_DIR, else the XDG state home: the timer (User= sets HOME) and the
    operator's own runs share one memory of NRestarts and golden outputs."""
    if os.environ.get("DDTREE_OPS_STATE_DIR"):
        return Path(os.environ["DDTREE_OPS_STATE_DIR"])
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "ddtree-ops"


class StateStore:
    """NRestarts per host between runs (restarts rising = WARNING), the ddtree plugin's counters (the
    next check's window starts there) and recorded golden outputs.

    Lives on the control machine; written only under the run lock, so runs never race on it.
    A missing or unreadable file means "no earlier check", never a failed one.
    """

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self._hosts: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads((directory / "smoke-state.json").read_text())
            self._hosts = dict(doc.get("hosts", {}))

    def previous(self, host: str) -> Previous | None:
        h = self._hosts.get(host)
        if not isinstance(h, dict) or "restarts" not in h:
            return None
        return Previous(int(h["restarts"]), int(h.get("main_pid", 0)), str(h.get("invocation", "")),
                        float(h.get("checked_at", 0)), from_dict(h.get("ddtree")) if "ddtree" in h else None)

    def update(self, results: Sequence[HostResult], now: float) -> None:
        for r in results:
            u = r.observation.unit
            if u is not None:
                self._hosts[r.host] = {"restarts": u.restarts, "main_pid": u.main_pid,
                                       "invocation": u.invocation, "checked_at": now}
                if r.observation.counters is not None:   # the next check's window starts here
                    self._hosts[r.host]["ddtree"] = to_dict(r.observation.counters)
        doc = {"schema_version": 1, "hosts": self._hosts}
        write_atomic(self.dir / "smoke-state.json", json.dumps(doc, indent=2, sort_keys=True) + "\n")

    # -- golden outputs (shadow replay)

    def golden_path(self, host: str) -> Path:
        return self.dir / "golden" / f"{host}.json"

    def golden_for(self, p: Profile) -> Golden | None:
        if p.smoke.golden:
            return Golden(p.smoke.golden, "profile smoke.golden", exact=False)
        try:
            rec = json.loads(self.golden_path(p.name).read_text())
        except (OSError, ValueError):
            return None
        source = f"recorded on {rec.get('mode') or '?'} at {rec.get('recorded_at', '?')}"
        stale = [what for what, now, then in (
            ("prompt", p.smoke.prompt, rec.get("prompt")), ("max_new_tokens", p.smoke.max_new_tokens,
                                                            rec.get("max_new_tokens")),
            ("model", p.service.model_path, rec.get("model_path"))) if now != then]
        return Golden(str(rec.get("text", "")), source, exact=True,
                      stale=", ".join(f"{w} changed" for w in stale))

    def record_golden(self, p: Profile, result: HostResult, when: str) -> Path | None:
        """Keep what the host answered now as the output every later check must reproduce."""
        gen = result.observation.generation
        if gen is None or gen.problem or not gen.text.strip():
            return None
        rec = {"schema_version": 1, "host": p.name, "mode": result.mode, "release": result.observation.release,
               "model_path": p.service.model_path, "prompt": p.smoke.prompt,
               "max_new_tokens": p.smoke.max_new_tokens, "text": gen.text, "recorded_at": when}
        path = self.golden_path(p.name)
        write_atomic(path, json.dumps(rec, indent=2) + "\n")
        return path


def write_atomic(path: Path, text: str, *, mode: int = 0o644) -> None:
    """Temp file in the same directory, fsync, rename: readers see the old file or the new one.

    The temp name does not end in `.prom`, so node_exporter never reads a half-written file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


LOCK_PATH = "/run/lock/ddtree-smoke.lock"


def default_lock_path() -> Path:
    """/run/lock (not /tmp: tmp cleaners and PrivateTmp= would split or delete the lock)."""
    if os.environ.get("DDTREE_OPS_SMOKE_LOCK"):
        return Path(os.environ["DDTREE_OPS_SMOKE_LOCK"])
    if os.access(os.path.dirname(LOCK_PATH), os.W_OK):
        return Path(LOCK_PATH)
    if os.environ.get("XDG_RUNTIME_DIR") and os.access(os.environ["XDG_RUNTIME_DIR"], os.W_OK):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "ddtree-smoke.lock"
    return Path(tempfile.gettempdir()) / f"ddtree-smoke-{os.getuid()}.lock"


@dataclass
class RunLock:
    """`flock -n` in process. Held by the open file description, so the kernel drops it when the
    process dies however it dies: no stale lock files to clean up.

    Under cron's `flock -n LOCK ddtree-ops smoke ...` wrapper we inherit a descriptor that already
    holds the very same lock; we take that one over instead of skipping ourselves.
    """

    path: Path
    holder: str = ""  # who holds it, when we did not get it
    _fd: int | None = field(default=None, repr=False)

    def acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        inherited = _inherited_fd(self.path)
        fd = inherited if inherited is not None else _open_lock(self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                raise
            with contextlib.suppress(OSError):
                self.holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
            if inherited is None:
                os.close(fd)
            return False
        self._fd = fd
        with contextlib.suppress(OSError):  # who holds it, for the message of a skipped run
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n".encode(), 0)
        return True

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    @contextlib.contextmanager
    def held(self) -> Iterator[bool]:
        got = self.acquire()
        try:
            yield got
        finally:
            if got:
                self.release()


def _open_lock(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except PermissionError:
        # another user's lock file in sticky /run/lock: a read-only descriptor locks just as well
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


def _inherited_fd(path: Path) -> int | None:
    try:
        target = os.stat(path)
    except OSError:
        return None
    for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else ():
        fd = int(name)
        with contextlib.suppress(OSError):
            # a descriptor this process opened itself is close-on-exec (see _open_lock); one that
            # flock(1) passed down is not
            if fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC:
                continue
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                return fd
    return None
