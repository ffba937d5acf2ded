"""The tax and truth groups (bench/realsglang/tax.py, truth.py) end to end with the lab's stand-in in
place of SGLang: what a device call does, minus the GPU, so the call is right the first time. The
figures are the stand-in's and mean nothing; the files, their schema and the flow are checked."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from ports import free_ports
from needs import SGLANG

pytestmark = [SGLANG, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "realsglang"


def unpack(bundle: Path, where: Path) -> Path:
    with tarfile.open(bundle) as tar:
        tar.extractall(where, filter="data")
    return where / "realsglang"


def test_tax_group_writes_the_issue_schema_and_the_table(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(BENCH / "tax.py"), "--standin", "--root", str(tmp_path / "rs"),
                           "--out", str(out), "--port", str(free_ports(5)), "--reps", "2", "--tokens", "16"],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "shadow_tax.json").read_text())
    assert set(doc) == {"gpu", "sglang", "model", "params_b", "tokens", "reps", "arms"}
    assert set(doc["arms"]) == {"dflash", "dflash_twin", "ddtree_s000", "ddtree_s025", "ddtree_s100"}
    assert doc["reps"] == 2 and doc["tokens"] == 16 and 8.1 < doc["params_b"] < 8.3      # the Qwen3-8B shape
    for arm in doc["arms"].values():
        assert set(arm) == {"1", "8"} and all(len(v) == 2 and all(x > 0 for x in v) for v in arm.values())
    assert sorted(p.name for p in out.iterdir()) == ["shadow_tax.json", "tax.tar.gz"]   # at most 8 files come back
    logs = unpack(out / "tax.tar.gz", tmp_path / "x")
    summary = json.loads((logs / "summary.json").read_text())["groups"]["tax"]
    for name, r in summary.items():
        assert r["gate"]["status"] == "ready" and r["diagnose"]["verdict"] == "healthy", name
        assert "--sleep-on-idle" in r["argv"] and "--cuda-graph-max-bs-decode" in r["argv"]
        assert r["env"]["SGLANG_SIMULATE_ACC_LEN"] == "3"
        assert "/qwen3-8b" in r["argv"][r["argv"].index("--model-path") + 1]
    assert summary["ddtree_s000"]["env"]["DDTREE_SHADOW_SHARE"] == "0.0"
    assert "DDTREE shadow: top-16 taken inside the draft's CUDA graph" in (logs / "ddtree_s025.log").read_text()
    assert "DDTREE shadow: rounds=" in (logs / "ddtree_s100.log").read_text()
    assert summary["ddtree_s100"]["speculation"]["shadow"]["rounds"] > 0
    table = subprocess.run([sys.executable, str(BENCH / "tax_table.py"), str(out / "shadow_tax.json")],
                           capture_output=True, text=True, timeout=60)
    lines = table.stdout.splitlines()
    assert table.returncode in (0, 1) and "| DFLASH | " in table.stdout and "(1.000)" in table.stdout
    assert sum(ln.startswith(("PASS ", "FAIL ")) for ln in lines) == 3


def tiny_pair(where: Path) -> Path:
    """A hand-made pair directory in the layout bench/pair/train.py writes: configs and a
    tokenizer (the stand-in loads no weights), and prompts.json."""
    models = BENCH / "models"
    shutil.copytree(models / "tiny-qwen3", where / "target")
    shutil.copytree(models / "tiny-qwen3-dflash", where / "draft")
    (where / "prompts.json").write_text(json.dumps({"prompts": [[5 + i, 9, 13, 2 + i] for i in range(12)],
                                                    "text": [f"prompt {i}" for i in range(12)]}))
    return where


@pytest.mark.parametrize("engine", ["run", "made-earlier"])
def test_truth_group_serves_the_pair_and_holds_the_shadow_to_its_checks(tmp_path: Path, engine: str) -> None:
    """engine "run": truth runs the engine's decode itself; "made-earlier": the device call before
    made it (--engine-json) and truth only serves."""
    pair = tiny_pair(tmp_path / "pair")
    out = tmp_path / "out"
    fake = REPO / "tests" / "realsglang" / "fake_engine_run.py"
    source = ["--engine-run", str(fake)]
    if engine == "made-earlier":
        made = tmp_path / "engine_run.json"
        subprocess.run([sys.executable, str(fake), "--pair", str(pair), "--budget", "16", "--max-new", "48",
                        "--prompts", "10", "--no-shadow", "--out", str(made)], check=True, timeout=60)
        source = ["--engine-json", str(made), "--engine-run", str(tmp_path / "absent.py")]
    proc = subprocess.run([sys.executable, str(BENCH / "truth.py"), "--standin", "--root", str(tmp_path / "rs"),
                           "--out", str(out), "--port", str(free_ports(6)), "--pair", str(pair), "--budget", "16",
                           "--max-new", "48", "--long-max-new", "96", "--prompts", "10", *source],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "shadow_truth.json").read_text())
    assert {"sglang", "gpu", "target", "draft", "sglang_accept_len", "shadow", "engine"} <= set(doc)
    assert {"rounds", "tau_chain", "tau_tree", "recommendation", "cost_ratio"} <= set(doc["shadow"])
    assert {"tau_chain", "tau_tree", "budget", "tok_s_chain", "tok_s_tree"} <= set(doc["engine"])
    assert doc["target"]["architectures"] == ["Qwen3ForCausalLM"] and doc["draft"]["block_size"] == 8
    assert doc["engine"]["standin"] == "fake_engine_run.py" and doc["engine"]["budget"] == 16
    # the engine's per-round cost ratio reached the DDTREE servers and their report lines
    assert doc["cost_ratio_given"] == pytest.approx((2.9 / 110.0) / (2.4 / 100.0), abs=1e-4)
    assert doc["shadow"]["cost_ratio"] == pytest.approx(doc["cost_ratio_given"], abs=0.006)
    assert doc["shadow"]["cost_from"] == "DDTREE_VERIFY_COST_RATIO"
    assert doc["shadow"]["tau_tree"] is not None and doc["shadow"]["rounds"] > 0
    # the verdict's server ran the same prompts for twice the tokens; tau_tree is compared on the
    # server that decoded exactly the engine's prompts and tokens
    assert doc["shadow"]["server"] == "ddtree_s100_long" and doc["shadow_same_prompts"]["server"] == "ddtree_s100"
    assert doc["shadow"]["rounds"] > doc["shadow_same_prompts"]["rounds"] > 0
    assert doc["engine"]["prompts_asked"] == 10 and doc["engine"]["no_shadow"] is True
    assert doc["sglang_accept_len"] is not None
    names = [c["name"] for c in doc["checks"]]
    assert len(names) == 6 and all(f"{'PASS' if c['ok'] else 'FAIL'} {c['name']}" in proc.stdout for c in doc["checks"])
    assert proc.returncode == (0 if all(c["ok"] for c in doc["checks"]) else 1)
    logs = unpack(out / "truth.tar.gz", tmp_path / "x")
    summary = json.loads((logs / "summary.json").read_text())
    runs = summary["groups"]["truth"]
    assert set(runs) == {"dflash", "ddtree_s025", "ddtree_s100", "ddtree_s100_long", "dflash_temp", "ddtree_s100_temp"}
    for name, r in runs.items():
        assert "SGLANG_SIMULATE_ACC_LEN" not in r["env"], name          # no acceptance knob: real acceptance
        assert str(pair / "target") in r["argv"]
    assert runs["ddtree_s025"]["env"]["DDTREE_SHADOW_SHARE"] == "0.25"
    assert runs["dflash_temp"]["load"]["requests"] == 10                # the engine's first 10 prompts
    assert runs["ddtree_s100_long"]["load"]["completion_tokens"] == 10 * 96
    assert runs["ddtree_s100"]["load"]["completion_tokens"] == 10 * 48    # ignore_eos: exactly max_new each


def test_truth_refuses_a_pair_without_prompts_before_starting_anything(tmp_path: Path) -> None:
    pair = tiny_pair(tmp_path / "pair")
    (pair / "prompts.json").write_text(json.dumps({"text": ["no ids"]}))
    proc = subprocess.run([sys.executable, str(BENCH / "truth.py"), "--standin", "--root", str(tmp_path / "rs"),
                           "--out", str(tmp_path / "out"), "--pair", str(pair)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode != 0
    assert f"{pair / 'prompts.json'}: 'prompts' must be a non-empty list of token-id lists" in proc.stderr
    assert not (tmp_path / "rs").exists() and not (tmp_path / "out").exists()


def test_truth_takes_an_engine_run_made_earlier_only_if_it_decoded_the_same_work(tmp_path: Path) -> None:
    """The device call before truth's may run the engine (truth's own call then only serves): its
    JSON is refused, naming the difference, if its budget, tokens or prompts differ, or if the run
    was cut short, and nothing starts."""
    pair = tiny_pair(tmp_path / "pair")
    made = tmp_path / "engine_run.json"
    base = [sys.executable, str(BENCH / "truth.py"), "--standin", "--root", str(tmp_path / "rs"),
            "--out", str(tmp_path / "out"), "--pair", str(pair), "--engine-json", str(made),
            "--budget", "16", "--max-new", "48", "--prompts", "10"]
    for wrong, named in (({"budget": 32}, "'budget': 32"), ({"prompts": 32}, "'prompts': 32"),
                         ({"complete": False}, "'complete': False")):
        made.write_text(json.dumps({"tau_chain": 2.4, "tau_tree": 2.9, "budget": 16, "max_new": 48, "prompts": 10,
                                    "complete": True, **wrong}))
        proc = subprocess.run(base, capture_output=True, text=True, timeout=120, cwd=REPO)
        assert proc.returncode != 0 and f"--engine-json {made}: made with {{{named}}}" in proc.stderr, proc.stderr
        assert not (tmp_path / "rs").exists() and not (tmp_path / "out").exists()
