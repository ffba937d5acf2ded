#!/usr/bin/env python3
"""Write the test-scale pair's fixed corpus (`text/cpython-3.11.7-lib.jsonl.xz`) from a CPython
3.11.7 `Lib/` directory. Run once by a maintainer; the tests only read the file it wrote.

    python3 bench/pair/make_text.py [--lib /path/to/cpython-3.11.7/Lib]

The files are ordinary pure-Python modules of the standard library (PSF License Version 2, whose
text is `text/LICENSE-CPython.txt`), chosen for plain code of moderate size: 43 files, 453 kB of text (103 kB compressed).
Each line of the output is {"key": "stdlib/<path>", "text": ...}, in key order. The script
refuses a Lib of another Python (the files would differ) and prints the content hash that
`corpus.SHIPPED_SHA256` must hold.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import sys
import sysconfig
from pathlib import Path

FILES = (
    "abc.py", "bisect.py", "cmd.py", "code.py", "codeop.py", "colorsys.py", "copy.py", "csv.py", "filecmp.py",
    "fileinput.py", "fnmatch.py", "genericpath.py", "getopt.py", "gettext.py", "glob.py", "graphlib.py", "heapq.py",
    "json/__init__.py", "json/decoder.py", "json/encoder.py", "json/scanner.py", "keyword.py", "linecache.py",
    "netrc.py", "numbers.py", "operator.py", "posixpath.py", "queue.py", "quopri.py", "reprlib.py", "sched.py",
    "secrets.py", "selectors.py", "shlex.py", "stat.py", "string.py", "textwrap.py", "timeit.py", "token.py",
    "types.py", "wave.py", "weakref.py", "zipapp.py",
)
VERSION = "3.11.7"
OUT = Path(__file__).resolve().parent / "text" / f"cpython-{VERSION}-lib.jsonl.xz"


def lines(lib: Path) -> bytes:
    out = []
    for name in sorted(FILES):
        text = (lib / name).read_text(encoding="utf-8")
        out.append(json.dumps({"key": f"stdlib/{name}", "text": text}, ensure_ascii=False, sort_keys=True))
    return ("\n".join(out) + "\n").encode("utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]),
                    help="a CPython 3.11.7 Lib directory (default: this interpreter's, if it is 3.11.7)")
    args = ap.parse_args(argv)
    if args.lib == Path(sysconfig.get_paths()["stdlib"]) and sys.version.split()[0] != VERSION:
        print(f"make_text: this is Python {sys.version.split()[0]}, not {VERSION}; pass --lib", file=sys.stderr)
        return 64
    data = lines(args.lib)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    tmp = OUT.with_name(OUT.name + ".tmp")
    tmp.write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    tmp.replace(OUT)
    print(f"{OUT}: {len(FILES)} files, {len(data):,} bytes of JSON lines; content sha256 "
          f"{hashlib.sha256(data).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
