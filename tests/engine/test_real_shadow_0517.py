"""What real SGLang 0.5.17 printed and served with the DDTREE plugin on the H200 (runs 4 and 5,
tests/data/real-sglang/0.5.17): the shadow accounting reaches the journal and /metrics, and the
smoke check reads the real gauges as an operator would see them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ddtree_ops.engine.sglang_shadow import REGISTERED
from ddtree_ops.smoke.parse import parse_metrics_shadow

REAL = Path(__file__).resolve().parents[1] / "data" / "real-sglang" / "0.5.17"
REPORT = re.compile(r"DDTREE shadow: rounds=(\d+) .*tau_chain=([\d.]+) .*tau_tree_lower=([\d.]+)")


def _reports(name: str) -> list[tuple[int, float, float]]:
    text = (REAL / name).read_text(errors="replace")
    return [(int(m.group(1)), float(m.group(2)), float(m.group(3))) for m in REPORT.finditer(text)]


def test_fixed_plugin_accounts_on_real_0517_and_the_broken_one_did_not() -> None:
    fixed, broken = _reports("5_ddtree_s025.log"), _reports("4_ddtree_s025.log")
    assert broken == []                                   # the run that found the TARGET_VERIFY mode
    assert "mode TARGET_VERIFY" in (REAL / "4_ddtree_s025.log").read_text()
    assert len(fixed) >= 5 and [r[0] for r in fixed] == sorted(r[0] for r in fixed)
    assert all(chain == 3.0 for _, chain, _ in fixed)     # SGLANG_SIMULATE_ACC_LEN=3: two drafts + bonus
    text = (REAL / "5_ddtree_s025.log").read_text()
    assert "DDTREE shadow: accounting running" in text
    assert REGISTERED % "[0, 2]" in text                  # the layers SGLang's runner resolved


def test_real_gauges_read_by_smoke() -> None:
    summary = json.loads((REAL / "5_summary.json").read_text())
    arm = summary["groups"]["serve"]["ddtree_s025"]
    shadow = parse_metrics_shadow("\n".join(arm["metrics_ddtree"]) + "\n")
    last = _reports("5_ddtree_s025.log")[-1]
    assert shadow.rounds == last[0]                       # /metrics says what the last report line said
    assert shadow.tau_chain == last[1]
    assert not shadow.silent
    # and the command an operator ran on that host said it, as a check of its own
    doc = json.loads(arm["cli_smoke"]["stdout"])
    checks = {c["name"]: c for c in doc["hosts"][0]["checks"]}
    assert checks["shadow"]["status"] == "ok" and f"{last[0]} rounds accounted" in checks["shadow"]["detail"]


# Runs 6 (tax) and 7 (truth) of issue 22/23, picked up as soon as their logs are committed here
# (docs/realsglang.md says how they are copied); until then these skip, naming what they wait for.
FULL = re.compile(r"DDTREE shadow: rounds=(\d+) sampled=(\d+) tau_chain=([\d.]+) tau_tree=([\d.]+|n/a) "
                  r"tau_tree_lower=([\d.]+) cost_ratio=([\d.]+) sibling_hits=\[[\d, ]*\] recommendation=(\S+) "
                  r"cost_from=(\S+) dropped=(\d+)")


def _log(name: str) -> str:
    path = REAL / name
    if not path.exists():
        import pytest

        pytest.skip(f"{name} is not committed yet (the next device session's run)")
    return path.read_text(errors="replace")


def test_tax_run_folds_the_topk_into_dflash_graph_and_skips_the_relay() -> None:
    from ddtree_ops.engine.sglang_relay import PATCHED

    for arm in ("6_tax_ddtree_s025.log", "6_tax_ddtree_s100.log"):
        text = _log(arm)
        assert "DFLASH draft greedy head folded into the draft cuda graph (tp=1)." in text
        assert "DDTREE shadow: top-16 taken inside the draft's CUDA graph with DFlash's head" in text
        assert "Triton top-K failed" not in text and "Triton cannot be imported" not in text
        assert PATCHED in text
        reports = FULL.findall(text)
        assert len(reports) >= 5 and reports[-1][3] != "n/a"      # greedy requests: exact figures


def _last_report(name: str) -> tuple[str, ...]:
    reports = FULL.findall(_log(name))
    assert reports, f"{name} has no full report line"
    return reports[-1]


def test_truth_run_reaches_a_verdict_that_the_results_file_records() -> None:
    """Run 7 (issue 23): the trained pair with real acceptance. The verdict's server (the engine's
    prompts for 256 tokens) accounted over 1,000 exact greedy rounds, reached a verdict with the
    engine's cost ratio, and the results file says what its last report line said."""
    doc = json.loads((Path(__file__).resolve().parents[2] / "bench" / "results" / "shadow_truth.json").read_text())
    last = _last_report("7_truth_ddtree_s100_long.log")
    rounds, sampled, tau_chain, tau_tree = int(last[0]), int(last[1]), float(last[2]), float(last[3])
    assert last[6] in ("promote-tree", "keep-chain") and rounds >= 1000 and sampled >= 1000
    assert last[7] == "DDTREE_VERIFY_COST_RATIO"
    assert float(last[5]) == round(doc["cost_ratio_given"], 2)          # the engine's ratio reached the server
    assert (doc["shadow"]["rounds"], doc["shadow"]["recommendation"], doc["shadow"]["tau_tree"],
            doc["shadow"]["tau_chain"]) == (rounds, last[6], tau_tree, tau_chain)
    # held to SGLang's own counter on the same server, and to the engine's real tree decode on the
    # server that decoded exactly the engine's prompts and tokens
    assert abs(tau_chain / doc["sglang_accept_len"] - 1) <= 0.02
    same = _last_report("7_truth_ddtree_s100.log")
    assert abs(float(same[3]) / doc["engine"]["tau_tree"] - 1) <= 0.05
    assert doc["engine"]["lossless"] is True and doc["engine"]["budget"] == 32
    assert all(c["ok"] for c in doc["checks"]) and len(doc["checks"]) == 6


def test_truth_run_under_temperature_stays_inconclusive() -> None:
    """Requests with temperature are accounted as lower bounds only (their committed tokens are
    samples): 1,250 rounds gave no verdict there, where the greedy server of the same pair did."""
    last = _last_report("7_truth_ddtree_s100_temp.log")
    assert int(last[0]) >= 1000 and int(last[1]) < 20 and last[6] == "inconclusive"
