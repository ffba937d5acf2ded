"""bench/make_test_cpu.py's samples read by bench/make_test_timeline.py: where `make test`'s CPU went, by
kind of process (BENCHMARKS.md's table is made from a committed run's samples)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def table(*args: str) -> str:
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "make_test_timeline.py"), *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


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
