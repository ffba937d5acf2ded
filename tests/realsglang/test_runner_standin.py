"""The real-SGLang runner (bench/realsglang/run.py), end to end on this machine with the lab's
stand-in in place of the server: what a device call would do, minus the GPU. It keeps the
tooling from rotting between device sessions (a broken runner would cost a whole device call)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from needs import SGLANG

pytestmark = SGLANG

REPO = Path(__file__).resolve().parents[2]


def free_pair() -> int:
    for base in range(41000, 49000, 37):
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", base))
                b.bind(("127.0.0.1", base + 1))
            return base
        except OSError:
            continue
    raise RuntimeError("no two free ports")


@pytest.mark.slow  # ~30 s
def test_serve_group_through_render_gate_smoke_and_the_tax_arms(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "realsglang" / "run.py"), "--standin", "--root", str(tmp_path / "rs"),
         "--out", str(out), "--port", str(free_pair()), "serve", "--only", "dflash,ddtree_s025",
         "--reps", "1", "--tokens", "16"],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with tarfile.open(out / "realsglang.tar.gz") as tar:
        tar.extractall(tmp_path / "x", filter="data")
    summary = json.loads((tmp_path / "x" / "realsglang" / "summary.json").read_text())
    serve = summary["groups"]["serve"]
    assert set(serve) == {"dflash", "ddtree_s025"}
    for name, r in serve.items():
        # the launch line is render's, the verdict the deploy gate's own state machine
        assert r["argv"][:2] == ["-m", "sglang.launch_server"] and "--load-format" in r["argv"]
        assert r["gate"]["status"] == "pass", r["gate"]
        assert r["smoke"]["status_line"].startswith("DDTREE-SMOKE OK"), r["smoke"]
        assert r["diagnose"]["verdict"] == "healthy" and r["expect_label"] == "healthy"
        assert r["exit"] is not None                      # stopped by SIGTERM to its process group
    assert serve["ddtree_s025"]["env"]["SGLANG_PLUGINS"] == "ddtree"
    assert "--speculative-algorithm" in serve["ddtree_s025"]["argv"]
    tax = serve["dflash"]["shadow_tax"]
    assert set(tax) == {"dflash", "ddtree-share-0.25"}
    assert all(v > 0 for arm in tax.values() for vals in arm.values() for v in vals)
    cli = serve["ddtree_s025"]["cli_smoke"]
    assert json.loads(cli["stdout"])["command"] == "smoke"    # the operator's command ran, local transport
    assert summary["plugin_check"]["exit"] == 0 and '"is_dflash_family": true' in summary["plugin_check"]["stdout"]
    logs = {p.name for p in (tmp_path / "x" / "realsglang").glob("*.log")}
    assert logs == {"dflash.log", "ddtree_s025.log"}
