"""`diagnose --log FILE` on a large journal: the keyword screen in worker processes.

The screen is a pure function of the bytes, so slices of the file are screened at once in forked
workers while this process runs the (sequential) scanner over their hits in order; the report is
the one `scanner.classify_stream` gives.
"""

from __future__ import annotations

import os
import stat
from array import array
from typing import Any

from ddtree_ops.diagnose import journal
from ddtree_ops.diagnose.catalogue import Catalogue, load_catalogue, screen_for
from ddtree_ops.diagnose.findings import Report
from ddtree_ops.diagnose.scanner import Scanner, classify_stream

PARALLEL_MIN_BYTES = 64 << 20  # below this a file is read in one process (forking costs more)
_WORKER: dict[str, Any] = {}


def _screen_chunk(job: tuple[str, int, int]) -> tuple[bytes, bytes, int]:
    """In a worker: the screen's hits in one newline-aligned slice of the file, with the block line
    index of each, and the slice's newline count (arrays as bytes: cheap to send back)."""
    path, start, end = job
    with open(path, "rb") as fh:
        data = os.pread(fh.fileno(), end - start, start)
    screen = screen_for(_WORKER["cat"])
    hits = screen.hits(data)
    where = array("q")
    count = data.count
    prev, idx = 0, 0
    for h in hits:
        ls = data.rfind(b"\n", prev, h) + 1
        if ls > prev:
            idx += count(b"\n", prev, ls)
            prev = ls
        where.append(idx)
    return array("q", hits).tobytes(), where.tobytes(), data.count(b"\n")


def _chunks(path: str, size: int, n: int, step: int | None = None) -> list[tuple[int, int]]:
    """`n` slices of the file (or slices of `step` bytes) that end on a newline."""
    bounds = [0]
    step = step or max(1 << 20, size // n)
    with open(path, "rb") as fh:
        fd = fh.fileno()
        pos = step
        while pos < size:
            tail = os.pread(fd, 1 << 16, pos)
            nl = tail.find(b"\n")
            while nl < 0 and tail:
                pos += len(tail)
                tail = os.pread(fd, 1 << 16, pos)
                nl = tail.find(b"\n")
            if nl < 0:
                break
            cut = pos + nl + 1
            if cut > bounds[-1]:
                bounds.append(cut)
            pos = cut + step
    if bounds[-1] < size:
        bounds.append(size)
    return list(zip(bounds, bounds[1:]))


def classify_path(path: str, catalogue: Catalogue | None = None, workers: int | None = None,
                  min_bytes: int = PARALLEL_MIN_BYTES, chunk_bytes: int | None = None) -> Report:
    """Classify a file; a large text journal has its keyword screen run in `workers` processes.

    The screen is a pure function of the bytes, so slices of the file are screened at once in
    forked workers while this process runs the (sequential) scanner over their hits in order;
    the report is the one `classify_stream` gives. JSON journals, small files, pipes and one-CPU
    hosts are read in one process.
    """
    import multiprocessing  # only for large files: most runs never fork

    cat = catalogue or load_catalogue()
    if workers is None:
        # the scanner itself needs a core: workers only pay where there are spare ones
        # (on a 2-CPU host they made a 200 MB journal slower, bench/results/diagnose.md)
        cpus = os.cpu_count() or 1
        workers = min(cpus - 1, 8) if cpus >= 4 and os.getloadavg()[0] < cpus - 1 else 1
    st = os.stat(path)
    with open(path, "rb") as fh:
        head = fh.read(65536)
        if (workers < 2 or st.st_size < min_bytes or not stat.S_ISREG(st.st_mode)
                or journal.looks_like_json_journal(head)):
            fh.seek(0)
            return classify_stream(fh, cat)
    screen_for(cat)  # built before forking: the workers inherit it
    _WORKER["cat"] = cat
    jobs = [(path, s, e) for s, e in _chunks(path, st.st_size, workers * 4, chunk_bytes)]
    sc = Scanner(cat)
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(workers) as pool, open(path, "rb") as fh:
        for (_, s, e), (hits_b, where_b, nl) in zip(jobs, pool.imap(_screen_chunk, jobs), strict=True):
            data = os.pread(fh.fileno(), e - s, s)
            hits, where = array("q"), array("q")
            hits.frombytes(hits_b)
            where.frombytes(where_b)
            sc.feed_screened(data, hits.tolist(), where.tolist(), nl)
    sc.finish()
    return sc.report()
