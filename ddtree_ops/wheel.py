"""A wheel of the in-tree DDTree engine, for installing the SGLang plugin into a host's venv.

Built in memory from the package's own files (pure Python, no build backend needed): only
`ddtree_ops/__init__.py`, `ddtree_ops/engine/` and `ddtree_ops/treestats.py` (standard library only),
which import nothing else from the tool (tests/unit/test_wheel_contents.py holds that). It is
versioned `<version>+g<digest of those files>`, so the host is checked for exactly the engine
being deployed and an upgrade of the ops side alone restarts nothing. The entry point is the one
SGLang's plugin loader looks for (group `sglang.srt.plugins`).
"""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ddtree_ops import __version__

DIST = "ddtree_ops"
# the plugin SGLang loads, and the tree verify backend of each SGLang release that has one (sglang_backend)
ENTRY_POINTS = ("[sglang.srt.plugins]\nddtree = ddtree_ops.engine.sglang_plugin:register\n\n"
                "[ddtree_ops.tree_verify]\n0.5.17 = ddtree_ops.engine.sglang_backend_0517:Backend\n")
_SUFFIXES = (".py", ".yaml", ".json", ".tmpl")


@dataclass(frozen=True)
class Wheel:
    filename: str
    version: str
    data: bytes


def _files() -> list[tuple[str, bytes]]:
    root = Path(__file__).resolve().parent
    # treestats: the verdict the plugin computes inside SGLang and smoke and promote recompute here
    paths = [root / "__init__.py", root / "treestats.py", *sorted((root / "engine").rglob("*"))]
    return [(f"{DIST}/{p.relative_to(root).as_posix()}", p.read_bytes()) for p in paths
            if p.is_file() and p.suffix in _SUFFIXES and "__pycache__" not in p.parts]


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def pack(dist: str, name: str, version: str, files: list[tuple[str, bytes]], entry_points: str,
         summary: str = "") -> Wheel:
    """A pure-Python wheel of `files` (archive path, bytes) with its dist-info: reproducible
    (fixed timestamps) and installable by `pip install --no-deps`."""
    info = f"{dist}-{version}.dist-info"
    top = sorted({path.split("/", 1)[0].removesuffix(".py") for path, _ in files})
    meta = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: {summary}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: ddtree-ops\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": entry_points.encode(),
        f"{info}/top_level.txt": "".join(f"{t}\n" for t in top).encode(),
    }
    buf = io.BytesIO()
    record = []
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in [*files, *meta.items()]:
            zf.writestr(zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0)), data)
            record.append(f"{path},{_record_hash(data)},{len(data)}")
        record.append(f"{info}/RECORD,,")
        zf.writestr(zipfile.ZipInfo(f"{info}/RECORD", date_time=(2020, 1, 1, 0, 0, 0)), "\n".join(record) + "\n")
    return Wheel(f"{dist}-{version}-py3-none-any.whl", version, buf.getvalue())


def build() -> Wheel:
    files = _files()
    digest = hashlib.sha256()
    for name, data in files:
        digest.update(name.encode() + b"\0" + data + b"\0")
    version = f"{__version__}+g{digest.hexdigest()[:10]}"
    return pack(DIST, "ddtree-ops", version, files, ENTRY_POINTS, "ddtree-ops (DDTree engine SGLang plugin)")
