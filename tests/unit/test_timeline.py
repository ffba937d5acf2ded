"""`make test PYTEST_ARGS=--timeline=PATH`: every test phase a worker ran, one JSON line each, and the
table bench/make_test_timeline.py makes of it (BENCHMARKS.md's `make test` section is read from these)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_run_with_a_timeline_writes_each_phase_of_each_test_once(tmp_path: Path) -> None:
    timeline = tmp_path / "t.jsonl"
    # run from a test that an xdist worker runs (`make test`), this pytest inherits PYTEST_XDIST_WORKER:
    # its controller must still not write (the first version did, and every line came twice)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1",
                           f"--timeline={timeline}", "tests/unit/test_ports.py"],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "PYTEST_XDIST_WORKER": "gw3"})
    assert proc.returncode == 0, proc.stdout[-2000:]
    rows = [json.loads(line) for line in timeline.read_text().splitlines()]
    tests = {r["id"] for r in rows}
    assert len(tests) == 3 and all(i.startswith("tests/unit/test_ports.py::") for i in tests)
    assert sorted((r["id"], r["when"]) for r in rows) == sorted((i, w) for i in tests
                                                                for w in ("setup", "call", "teardown"))
    assert all(r["w"] == "gw0" and r["stop"] >= r["start"] and r["outcome"] == "passed" for r in rows)
    table = subprocess.run([sys.executable, str(REPO / "bench" / "make_test_timeline.py"), "workers", str(timeline)],
                           capture_output=True, text=True, timeout=60)
    assert table.returncode == 0 and "| gw0 | beside the lab | 0 |" in table.stdout and "| 3 |" in table.stdout
