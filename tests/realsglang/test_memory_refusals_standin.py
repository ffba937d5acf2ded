"""The runner's memory and refusals groups end to end with the lab's stand-in in place of SGLang:
the probe files land in the layout bench/results/memory_probes/ takes and bench/memory_table.py
reads, a probe without a draft drops every --speculative-* flag, and a refusal records preflight's
verdict naming the profile key before the server is started anyway. What a device call would do,
minus the GPU (a broken runner would cost the coordinator's one call)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from ports import free_ports
from needs import SGLANG

pytestmark = [SGLANG, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_memory_probe_files_and_a_refusal_through_the_runner(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "realsglang" / "run.py"), "--standin", "--root", str(tmp_path / "rs"),
         "--out", str(out), "--port", str(free_ports(40)), "memory", "refusals",
         "--only", "mem_1p7b_90_plain,refuse_context"],
        capture_output=True, text=True, timeout=400, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with tarfile.open(out / "realsglang.tar.gz") as tar:
        tar.extractall(tmp_path / "x", filter="data")
    bundle = tmp_path / "x" / "realsglang"
    (probe_path,) = (bundle / "memory_probes").glob("*_mem_1p7b_90_plain.json")
    probe = json.loads(probe_path.read_text())
    assert (bundle / "memory_probes" / probe["log"]).exists()
    assert probe["server"].startswith("lab stand-in")  # never mistaken for SGLang's numbers
    s = probe["settings"]
    assert s["draft"] is None and s["draft_config"] is None and s["mem_fraction_static"] == 0.9
    assert not [a for a in s["argv"] if a.startswith("--speculative-")]
    assert probe["preflight"]["free_mib"] == 143771 and probe["preflight"]["gpu_source"] == "nvidia-smi"
    assert any("KV Cache is allocated" in line for line in probe["sglang_lines"])
    # bench/memory_table.py predicts it again from the file alone, as the committed-probe test does
    spec = importlib.util.spec_from_file_location("memory_table", REPO / "bench" / "memory_table.py")
    assert spec and spec.loader
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    probe["_path"] = probe_path.name
    row = table.row(probe)
    assert row["predicted"] == probe["preflight"]["predicted_tokens"] and row["real"] > 0
    assert "$ nvidia-smi --query-gpu=index,pci.bus_id" in (bundle / "gpu_facts.txt").read_text()

    summary = json.loads((bundle / "summary.json").read_text())
    ref = summary["groups"]["refusals"]["refuse_context"]["refusal"]
    assert ref["refused"] and ref["names_key"] and ref["key"] == "memory.context_length"
    assert ref["server_died"] and ref["exit"] not in (None, 0)
    assert "greater than the derived context_length" in (bundle / "refuse_context.log").read_text()
