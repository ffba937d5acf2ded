"""A disk cache for what loading the catalogue computes, so `diagnose --log` starts in a blink
(issue 31: it spent half a second before reading a line, parsing 420 patterns and compiling the
keyword screen).

Two kinds of entry, each named by the hash of everything it is built from:
- the parsed catalogue (JSON): the catalogue's text and the source of the modules that parse it;
- the keyword screen's compiled Hyperscan database: its keywords and the hyperscan version.

Where: $DDTREE_OPS_CACHE, else $XDG_CACHE_HOME/ddtree-ops, else ~/.cache/ddtree-ops. The cache is
only ever an accelerator: an entry that cannot be read, is not ours (another owner, not a regular
file), is cut short or altered (its SHA-256 is checked), or does not decode is ignored and rebuilt;
a directory that cannot be written is left alone. Entries are written whole (a temporary file
renamed into place), readable by the owner only. Nothing here raises.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

CACHE_ENV = "DDTREE_OPS_CACHE"
MAGIC = b"ddtree-ops cache 1\n"
MAX_BYTES = 64 << 20  # an entry larger than this is not one of ours


def cache_dir() -> Path:
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "ddtree-ops" if xdg else Path.home() / ".cache" / "ddtree-ops"


def key(*parts: bytes | str) -> str:
    """A name for what is built from `parts` (their SHA-256)."""
    h = hashlib.sha256()
    for p in parts:
        b = p.encode("utf-8") if isinstance(p, str) else p
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()[:40]


def read(name: str) -> bytes | None:
    """The entry's payload, or None when there is none we can trust."""
    try:
        path = cache_dir() / name
        st = os.stat(path, follow_symlinks=False)
        if not (st.st_mode & 0o170000 == 0o100000) or st.st_uid != os.getuid() or st.st_size > MAX_BYTES:
            return None
        data = path.read_bytes()
    except (OSError, ValueError):
        return None
    if not data.startswith(MAGIC):
        return None
    head, _, payload = data[len(MAGIC):].partition(b"\n")
    if head != hashlib.sha256(payload).hexdigest().encode("ascii"):
        return None  # cut short or altered
    return payload


def write(name: str, payload: bytes) -> bool:
    """Store the entry whole; False (and nothing left behind) when the directory cannot be written."""
    tmp = ""
    try:
        d = cache_dir()
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=d)
        with os.fdopen(fd, "wb") as fh:
            fh.write(MAGIC + hashlib.sha256(payload).hexdigest().encode("ascii") + b"\n" + payload)
        os.chmod(tmp, 0o600)
        os.replace(tmp, d / name)
        return True
    except (OSError, ValueError):
        if tmp:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return False
