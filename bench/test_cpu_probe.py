"""Each test's CPU: a pytest plugin, and the summary of what it wrote.

As a plugin (`-p test_cpu_probe`, with bench/ on PYTHONPATH), it appends one JSON line per test to
$CPUPROBE_OUT: the test's id, the CPU of the pytest process itself during it ("self") and of the
processes it started and waited for ("children": the `ddtree-ops` commands, the engine's subprocesses),
its wall time, and for lab tests the hosts it holds and the CPU each lab host's cgroup used meanwhile
("host_delta": with several workers, a host's figure also counts what other workers' tests did there).

    CPUPROBE_OUT=lab.jsonl PYTHONPATH=bench python -m pytest -p test_cpu_probe -m lab -n 3 --dist loadgroup
    python bench/test_cpu_probe.py lab.jsonl [more.jsonl ...]
"""

from __future__ import annotations

import collections
import glob
import json
import os
import resource
import sys
import time
from typing import Any, Iterator

import pytest

OUT = os.environ.get("CPUPROBE_OUT", "cpuprobe.jsonl")


def _cpu() -> tuple[float, float]:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime


def _hosts() -> dict[str, float]:
    out = {}
    for f in glob.glob("/sys/fs/cgroup/unified/ddtree-lab-*/cpu.stat"):
        name = f.split("/")[-2].removeprefix("ddtree-lab-")
        with open(f) as fh:
            for line in fh:
                if line.startswith("usage_usec"):
                    out[name] = int(line.split()[1]) / 1e6
    return out


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Iterator[None]:
    s0, c0 = _cpu()
    t0, h0 = time.time(), _hosts()
    yield
    s1, c1 = _cpu()
    h1 = _hosts()
    hosts = [a for m in item.iter_markers("hosts") for a in m.args]
    with open(OUT, "a") as fh:
        fh.write(json.dumps({"id": item.nodeid, "self": s1 - s0, "children": c1 - c0, "wall": time.time() - t0,
                             "w": os.environ.get("PYTEST_XDIST_WORKER", ""), "t0": t0,
                             "host_delta": {k: h1.get(k, 0) - h0.get(k, 0) for k in set(h0) | set(h1)},
                             "hosts": hosts}) + "\n")


def summary(paths: list[str]) -> None:
    for path in paths:
        rows = [json.loads(line) for line in open(path)]
        own = sum(r["self"] for r in rows)
        kids = sum(r["children"] for r in rows)
        print(f"{path}: {len(rows)} tests; the pytest process {own:.0f} CPU-s, the processes it started "
              f"{kids:.0f} CPU-s, {own + kids:.0f} in all")
        by_dir: collections.Counter[str] = collections.Counter()
        for r in rows:
            by_dir[r["id"].split("/")[1]] += r["self"] + r["children"]
        print("  by test directory: " + ", ".join(f"{d} {v:.0f}" for d, v in by_dir.most_common()))


if __name__ == "__main__":
    summary(sys.argv[1:])
