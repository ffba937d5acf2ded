"""SGLang's log format (the logger it configures, uvicorn's lines through it)."""

from __future__ import annotations

import logging
import sys
from functools import lru_cache
from pathlib import Path

logger = logging.getLogger("sglang.srt")
_UVICORN_LEVEL = {logging.INFO: "INFO:    ", logging.WARNING: "WARNING: ", logging.ERROR: "ERROR:   "}


class _Rank(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "rank"):
            record.rank = ""
        return True


def configure() -> None:
    """`sglang.srt.utils.common.configure_logger`: `[%(asctime)s] %(message)s`, to stderr; a
    scheduler's lines carry its rank after the time (`[... TP1] ...`, scheduler.py's prefix)."""
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s%(rank)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S",
                        stream=sys.stderr, force=True)
    for h in logging.getLogger().handlers:
        h.addFilter(_Rank())


def ranked(level: int, msg: str, prefix: str) -> None:
    """One scheduler's line with its rank prefix (' TP1'; '' for a single-rank server)."""
    logger.log(level, msg, extra={"rank": prefix})


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


def frame_in(path: Path, func: str, needle: str) -> str:
    """One traceback frame at the line of `needle` in `path` (empty when it is not there: the
    traceback just gets shorter, it never names a line that does not say this)."""
    for i, line in enumerate(_lines(str(path))):
        if needle in line:
            return f'  File "{path}", line {i + 1}, in {func}\n    {line.strip()}\n'
    return ""


@lru_cache(maxsize=64)
def _lines(path: str) -> tuple[str, ...]:
    try:
        return tuple(Path(path).read_text().splitlines())
    except OSError:
        return ()
