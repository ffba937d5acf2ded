"""SGLang's log format and tracebacks that point into the host's real sglang source."""

from __future__ import annotations

import logging
import os
import sys
from functools import lru_cache
from pathlib import Path

logger = logging.getLogger("sglang.srt")
_UVICORN_LEVEL = {logging.INFO: "INFO:    ", logging.WARNING: "WARNING: ", logging.ERROR: "ERROR:   "}


def configure() -> None:
    """`sglang.srt.utils.common.configure_logger`: `[%(asctime)s] %(message)s`, to stderr."""
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S",
                        stream=sys.stderr, force=True)


def info(msg: str) -> None:
    logger.info(msg)


def warning(msg: str) -> None:
    logger.warning(msg)


def error(msg: str) -> None:
    logger.error(msg)


def uvicorn(level: int, msg: str) -> None:
    """uvicorn's lines as SGLang configures them: `[ts] INFO:     Started server process [123]`."""
    logger.log(level, f"{_UVICORN_LEVEL[level]} {msg}")


@lru_cache(maxsize=1)
def sglang_dir() -> Path | None:
    try:
        import sglang

        return Path(sglang.__file__).parent
    except Exception:  # noqa: BLE001 - the unit tests run without the venv's sglang
        return None


def frame(rel: str, func: str, needle: str, *, back_to: str | None = None) -> str:
    """One traceback frame at the line of `needle` in the installed sglang source (empty when the
    source moved: the traceback just gets shorter, it never lies about a line)."""
    root = sglang_dir()
    if root is None:
        return ""
    path = root / rel
    lines = _lines(str(path))
    for i, line in enumerate(lines):
        if needle in line:
            if back_to:
                j = i
                while j > 0 and back_to not in lines[j]:
                    j -= 1
                i = j if back_to in lines[j] else i
            return f'  File "{path}", line {i + 1}, in {func}\n    {lines[i].strip()}\n'
    return ""


@lru_cache(maxsize=64)
def _lines(path: str) -> tuple[str, ...]:
    try:
        return tuple(Path(path).read_text().splitlines())
    except OSError:
        return ()


def traceback_text(frames: list[str], exc_line: str) -> str:
    return "Traceback (most recent call last):\n" + "".join(f for f in frames if f) + exc_line


def scheduler_crash(tb: str) -> None:
    """What SGLang prints when the scheduler child dies, then how the launcher ends: the child logs the
    traceback and sends SIGQUIT; the parent's handler kills the whole process tree, itself by SIGKILL."""
    error(f"Scheduler hit an exception: {tb}")
    error("Received sigquit from a child process. It usually means the child failed.")
    pid = os.getpid()
    info(f"kill_process_tree called: parent_pid={pid}, include_parent=True, pid={pid}")
    for h in logging.getLogger().handlers:
        h.flush()
    sys.stderr.flush()
    sys.stdout.flush()
    os.kill(pid, 9)
