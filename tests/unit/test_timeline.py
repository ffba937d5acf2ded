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


def test_the_runs_table_reads_wall_pytest_and_the_cpu_speed_from_ci_logs(tmp_path: Path) -> None:
    """One row per `.ci/run` log; the fixed loop's CPU-s (the speed of the CPU the run got) where the log
    has them, "-" in a log from before .ci/run printed them, "failed" where no wall time was printed."""
    (tmp_path / "run30.log").write_text(
        "ci: 2 CPUs, load average 0.32 2.11 2.63 at the start; a fixed loop took 0.84 CPU-s\n"
        "============ 3527 passed, 9 skipped in 842.21s (0:14:02) ============\n"
        "ci: passed in 15 min 6 s from an empty cache (load average 2.54 3.17 3.16 at the end; "
        "the fixed loop took 0.52 CPU-s)\n")
    (tmp_path / "run28.log").write_text(
        "ci: 2 CPUs, load average 1.35 2.02 2.76 at the start\n"
        "============ 3528 passed, 9 skipped in 931.40s (0:15:31) ============\n"
        "ci: passed in 17 min 6 s from an empty cache (load average 3.0 3.1 3.2 at the end)\n")
    (tmp_path / "run41.log").write_text(  # 779.80 s: 13 min 0 s, not "12 min 60 s"
        "ci: 2 CPUs, load average 0.63 3.06 3.71 at the start; a fixed loop took 0.57 CPU-s\n"
        "================= 3531 passed, 9 skipped in 779.80s (0:12:59) ==================\n"
        "ci: passed in 14 min 13 s from an empty cache (load average 3.70 4.28 4.12 at the end; "
        "the fixed loop took 0.54 CPU-s)\n")
    (tmp_path / "run27.log").write_text(
        "ci: 2 CPUs, load average 1.0 1.0 1.0 at the start; a fixed loop took 0.61 CPU-s\n"
        "============ 1 failed, 3526 passed, 9 skipped in 909.10s (0:15:09) ============\n")
    table = subprocess.run([sys.executable, str(REPO / "bench" / "make_test_timeline.py"), "runs",
                            *(str(tmp_path / f"run{n}.log") for n in (27, 28, 30, 41))],
                           capture_output=True, text=True, timeout=60)
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[2:] == [
        "| run27 | failed | 15 min 9 s | 1 failed, 3526 passed, 9 skipped | 0.61 |",
        "| run28 | 17 min 6 s | 15 min 31 s | 3528 passed, 9 skipped | - |",
        "| run30 | 15 min 6 s | 14 min 2 s | 3527 passed, 9 skipped | 0.84 / 0.52 |",
        "| run41 | 14 min 13 s | 13 min 0 s | 3531 passed, 9 skipped | 0.57 / 0.54 |",
    ]


def test_a_lab_tests_wait_for_its_hosts_is_shown_apart_and_not_counted_twice(tmp_path: Path) -> None:
    """conftest's `lab_hosts_held` writes a "hostwait" line inside the test's setup: the table shows it in its
    own column, and the setup alone counts in the worker's busy time."""
    lab = "tests/deploy/test_deploy_lab.py::test_x@lab-ct129"
    rows = [{"w": "gw0", "id": lab, "when": "setup", "start": 100.0, "stop": 130.0, "outcome": "passed"},
            {"w": "gw0", "id": lab, "when": "hostwait", "start": 100.0, "stop": 125.0, "outcome": "passed"},
            {"w": "gw0", "id": lab, "when": "call", "start": 130.0, "stop": 140.0, "outcome": "passed"},
            {"w": "gw0", "id": lab, "when": "teardown", "start": 140.0, "stop": 142.0, "outcome": "passed"}]
    timeline = tmp_path / "t.jsonl"
    timeline.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = subprocess.run([sys.executable, str(REPO / "bench" / "make_test_timeline.py"), "workers", str(timeline)],
                           capture_output=True, text=True, timeout=60)
    assert table.returncode == 0, table.stderr
    assert "| gw0 | lab-ct129 | 0 | 42 | 42 | 25 | 1 |" in table.stdout
    assert "| gw0 | tests/deploy/test_deploy_lab.py | 0 | 42 | 42 | 25 | 1 |" in table.stdout


def test_the_load_table_reads_the_machines_busy_cpus_and_the_vms_own_processes(tmp_path: Path) -> None:
    """bench/make_test_load.sh's lines (uptime, busy ticks, PID 1's ticks, kdamond's, processes): the CPUs
    busy per minute are tick deltas over time deltas; the VM's own processes' CPU-s are their deltas."""
    busy, lines = 100_000, []
    for i in range(25):  # 5 s apart: both CPUs busy in minute 0 (1000 ticks per 5 s), one in minute 1
        lines.append(f"{1000 + 5 * i} {busy} {50 + i} {70 + 2 * i} 80")
        busy += 1000 if i < 12 else 500
    path = tmp_path / "run99.vm.txt"
    path.write_text("\n".join(lines) + "\n")
    table = subprocess.run([sys.executable, str(REPO / "bench" / "make_test_timeline.py"), "load", str(path)],
                           capture_output=True, text=True, timeout=60)
    assert table.returncode == 0, table.stderr
    assert "| 0 | 2.00 |" in table.stdout and "| 1 | 1.00 |" in table.stdout
    assert "120 s sampled: 180 CPU-s busy (1.50 CPUs on average); PID 1 (the VM's process_api) 0.2 CPU-s, " \
           "kdamond 0.5 CPU-s" in table.stdout
