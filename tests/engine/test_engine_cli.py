"""`ddtree-ops engine ...`: exit codes, stdout/stderr split, no torch at CLI start-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.engine


def cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "ddtree_ops", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def test_cli_start_imports_no_torch_or_sglang() -> None:
    code = "import sys, ddtree_ops.cli.app; print(sorted(m for m in ('torch', 'transformers', 'sglang') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


@pytest.mark.parametrize("args,needle", [
    (["--prompts", "0"], "--prompts must be >= 1"),
    (["--budget", "5000"], "--budget must be in 1..2048"),
    (["--max-new-tokens", "-1", "--horizon", "99"], "--horizon must be in 1..32"),
    (["--model", "/nonexistent/model"], "not 'smollm2' and not a directory"),
    (["--shadow-share", "2"], "--shadow-share must be in [0, 1]"),
])
def test_bad_options_exit_64_with_a_clear_message(args: list[str], needle: str) -> None:
    proc = cli("engine", "verify", *args)
    assert proc.returncode == 64, proc.stderr
    assert needle in proc.stderr and proc.stdout == ""


def test_unknown_option_is_a_usage_error() -> None:
    assert cli("engine", "verify", "--bogus").returncode == 64


def test_help_lists_the_commands() -> None:
    proc = cli("engine", "--help")
    assert proc.returncode == 0 and "verify" in proc.stdout and "plugin-check" in proc.stdout


# `engine verify --json` on SmolLM2 is run once, from an empty cache, in
# test_engine_model_install.py::test_verify_converts_into_an_empty_cache_and_nowhere_else: a second
# run here cost ~30 CPU-s of `make test` and checked nothing that one does not


def test_plugin_check_command() -> None:
    pytest.importorskip("sglang")
    proc = cli("engine", "plugin-check", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["is_dflash_family"] is True and doc["algorithm"] == "DDTREE"
