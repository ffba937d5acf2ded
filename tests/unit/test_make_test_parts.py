"""`make test` runs two pytest processes at once (tests/conftest.py's `--part`): the lab files, those
tests/labkit.py's LAB_ORDER names, in three xdist workers, and every other file beside them. Each part
collects only its own files, and a lab test in a file no lab group names is refused, not left to neither
part; bench/make_test_timeline.py reads the two reports a run then prints, and the CPU samples of
bench/make_test_cpu.py."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import labkit
import pytest

REPO = Path(__file__).resolve().parents[2]
LAB_FILES = {f for files in labkit.LAB_ORDER.values() for f in files}


def collected(*args: str) -> set[str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-o", "addopts=", *args], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return {line.split("::", 1)[0] for line in proc.stdout.splitlines() if "::" in line}


def test_the_lab_part_collects_exactly_the_lab_groups_files() -> None:
    assert collected("--part", "lab") == LAB_FILES


def test_the_part_beside_collects_every_file_but_those() -> None:
    files = collected("--part", "beside", "tests/smoke")
    assert "tests/smoke/test_smoke_lab.py" in LAB_FILES and "tests/smoke/test_smoke_lab.py" not in files
    assert {"tests/smoke/test_smoke_outputs.py", "tests/smoke/test_smoke_verdict.py"} <= files


def fake_item(nodeid: str, lab: bool) -> SimpleNamespace:
    return SimpleNamespace(nodeid=nodeid, get_closest_marker=lambda name: object() if lab and name == "lab" else None)


def test_a_lab_test_in_a_file_no_lab_group_names_is_refused_by_the_part_beside() -> None:
    items = [fake_item("tests/unit/test_x.py::test_a", False), fake_item("tests/lab/test_new_lab.py::test_b", True)]
    with pytest.raises(pytest.UsageError, match=r"LAB_ORDER: tests/lab/test_new_lab\.py;"):
        labkit.no_lab_tests_beside(items)
    labkit.no_lab_tests_beside(items[:1])  # no lab test: nothing to say


def table(*args: str) -> str:
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "make_test_timeline.py"), *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_a_run_of_two_parts_reads_as_the_longer_and_the_sum(tmp_path: Path) -> None:
    log = tmp_path / "run26.log"
    log.write_text("\n".join([
        "================ 3300 passed, 9 skipped in 700.10s (0:11:40) ================",
        "make test: the lab tests (pytest --part lab -n 3):",
        "=========== 1 failed, 225 passed in 812.50s (0:13:32) ===========",
        "ci: passed in 14 min 30 s from an empty cache"]) + "\n")
    assert "| run26 | 14 min 30 s | 13 min 32 s | 1 failed, 3525 passed, 9 skipped |" in table("runs", str(log))


def test_the_cpu_table_puts_each_process_in_its_kind(tmp_path: Path) -> None:
    procs = [
        {"pid": 10, "ppid": 9, "comm": "python", "cg": "/ddtree-lab-ct129/payload/system.slice/sglang.service",
         "cmd": "/opt/sglang/venv/bin/python -m sglang.launch_server --model-path /models/Qwen3-8B", "cpu": 1.75},
        {"pid": 11, "ppid": 9, "comm": "python", "cg": "/ddtree-lab-ct200/payload/system.slice/sglang.service",
         "cmd": "/opt/sglang/venv/bin/python -m sglang.launch_server --model-path /models/Qwen3-8B", "cpu": 1.25},
        {"pid": 12, "ppid": 8, "comm": "python", "cg": "/", "cmd": "/x/.venv/bin/python -m ddtree_ops deploy ct129",
         "cpu": 0.75},
        {"pid": 13, "ppid": 2, "comm": "kdamond.0", "cg": "/", "cmd": "", "cpu": 4.0},
    ]
    f = tmp_path / "run.cpu.json.gz"
    f.write_bytes(gzip.compress(json.dumps(procs).encode()))
    out = table("cpu", str(f))
    assert "| lab host: the SGLang stand-in (its starts, and the processes they fork) | 3 | 39% | 2 |" in out
    assert "| control: ddtree-ops commands the tests start | 1 | 10% | 1 |" in out
    assert "| machine: kdamond.0 (not started by the run) | 4 | 52% | 1 |" in out
