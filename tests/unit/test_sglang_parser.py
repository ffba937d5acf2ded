"""Every rendered launch argv goes through sglang 0.5.23's real argument parser.

The parser takes `--speculative-algorithm` as a free string, so for DDTREE it cannot check the
name; that is resolved by SpeculativeAlgorithm.from_string after plugins load (preflight runs
exactly that on the host, see test_preflight_script_*)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from needs import SGLANG

from ddtree_ops.preflight import SGLANG_CHECK
from ddtree_ops.profile import MODES, load_profile
from ddtree_ops.render import render

REPO = Path(__file__).resolve().parents[2]
pytestmark = SGLANG

BATCH = r'''
import contextlib, io, json, sys
from sglang.srt.server_args import prepare_server_args
results = []
for argv in json.loads(sys.stdin.read()):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            sa = prepare_server_args(argv)
        results.append({"ok": True, "algo": sa.speculative_algorithm, "mfs": sa.mem_fraction_static,
                        "draft_tokens": sa.speculative_num_draft_tokens})
    except SystemExit:
        results.append({"ok": False, "error": err.getvalue().strip().splitlines()[-1]})
print(json.dumps(results))
'''


@pytest.fixture(scope="module")
def parsed() -> dict[str, dict]:
    cases, argvs = [], []
    for host in ("ct129", "ct200"):
        p = load_profile(host, directory=REPO / "profiles")
        for mode in MODES:
            cases.append(f"{host}/{mode}")
            argvs.append(list(render(p, mode, environ={}).argv[3:]))
        argvs.append(list(render(load_profile(host, overrides=["memory.cuda_graph=false"],
                                              directory=REPO / "profiles"), "dflash", environ={}).argv[3:]))
        cases.append(f"{host}/dflash-no-graph")
    cases.append("bad-flag")
    argvs.append(argvs[0] + ["--speculative-ddtree-budget", "8"])
    res = subprocess.run([sys.executable, "-c", BATCH], input=json.dumps(argvs), capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return dict(zip(cases, json.loads(res.stdout.strip().splitlines()[-1])))


@pytest.mark.parametrize("case", [f"{h}/{m}" for h in ("ct129", "ct200") for m in (*MODES, "dflash-no-graph")])
def test_real_parser_accepts_rendered_argv(parsed: dict[str, dict], case: str) -> None:
    assert parsed[case]["ok"], parsed[case]
    mode = case.split("/")[1]
    expected = {"nextn": "NEXTN", "dflash": "DFLASH", "ddtree-shadow": "DDTREE", "ddtree": "DDTREE",
                "dflash-no-graph": "DFLASH"}[mode]
    assert parsed[case]["algo"] == expected


def test_real_parser_refuses_unknown_flags(parsed: dict[str, dict]) -> None:
    assert not parsed["bad-flag"]["ok"]
    assert "unrecognized arguments: --speculative-ddtree-budget 8" in parsed["bad-flag"]["error"]


def test_preflight_script_reports_parse_errors() -> None:
    """The very script preflight runs with the host's interpreter."""
    res = subprocess.run([sys.executable, "-c", SGLANG_CHECK, json.dumps(["--model-path", "m", "--port", "abc"]), ""],
                         capture_output=True, text=True, timeout=300)
    doc = json.loads(res.stdout.rpartition("\x1d")[2])
    assert doc["sglang"] == "0.5.23"
    assert "invalid int value: 'abc'" in doc["parse"]
