"""`python -m ddtree_ops.cli.app` is the same command as `ddtree-ops` and `python -m ddtree_ops`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "HOME": str(ROOT / "no-home")})


def test_module_app_runs_the_cli() -> None:
    app = _run("-m", "ddtree_ops.cli.app", "render", "ct129", "--mode", "nextn")
    package = _run("-m", "ddtree_ops", "render", "ct129", "--mode", "nextn")
    assert app.returncode == package.returncode == 0, app.stderr
    assert app.stdout == package.stdout and "[Service]" in app.stdout


def test_module_app_keeps_the_exit_codes() -> None:
    bare, package = _run("-m", "ddtree_ops.cli.app"), _run("-m", "ddtree_ops")
    assert bare.returncode == package.returncode == 64          # no command: usage, as `ddtree-ops` alone
    assert "Usage" in bare.stdout + bare.stderr
    bad = _run("-m", "ddtree_ops.cli.app", "render", "ct129", "--set", "memory.mem_fraction_static=1.4")
    assert bad.returncode == 64 and "memory.mem_fraction_static: 1.4 is not in (0, 1)" in bad.stderr
