"""What real SGLang 0.5.17 printed on an H200, named by `diagnose --log` in every form.

The expected labels come from tests/data/real-sglang/*/INDEX.md (`| file | label | scenario |`),
so a log added there with its label is tested without touching this file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_ops.diagnose.classify import classify
from diagnose_helpers import REPO, as_journal_json, as_journald, raw_lines

REAL = REPO / "tests" / "data" / "real-sglang"
FORMS = ("raw", "journald", "json")


def _index() -> list[tuple[Path, str, str]]:
    rows = []
    for index in sorted(REAL.glob("*/INDEX.md")):
        for line in index.read_text("utf-8").splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 3 and cells[0].endswith(".log"):
                rows.append((index.parent / cells[0], cells[1], cells[2]))
    return rows


ROWS = _index()


def _form(lines: list[bytes], form: str) -> list[bytes]:
    return as_journald(lines) if form == "journald" else as_journal_json(lines) if form == "json" else lines


def test_every_real_log_is_in_the_index() -> None:
    listed = {p for p, _, _ in ROWS}
    logs = set(REAL.glob("*/*.log"))
    assert logs and logs == listed, sorted(str(p.name) for p in logs ^ listed)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("path, label, scenario", ROWS, ids=[p.name for p, _, _ in ROWS])
def test_real_log_is_named(path: Path, label: str, scenario: str, form: str) -> None:
    rep = classify(_form(raw_lines(path), form))
    if label == "healthy":
        assert rep.verdict == "healthy" and rep.root_cause is None, (rep.root_cause, scenario)
    else:
        assert rep.root_cause is not None and rep.root_cause.label == label, (rep.root_cause, scenario)
        assert rep.verdict == "failed"


def test_layer_ids_and_missing_capture_print_the_same_message_and_are_told_apart() -> None:
    """`DFLASH target_hidden feature dim mismatch` with the same shapes in three real logs:
    1_dflash_layers13 (built-in DFLASH: capture configured) and 1_ddtree_layers13 (the ddtree
    plugin's worker ran) are the draft's target_layer_ids; 2_neg_nonfamily_nograph (a line says
    DDTREE was registered as not DFlash-family) is the capture never configured."""
    base = REAL / "0.5.17"
    named = {}
    for name in ("1_dflash_layers13.log", "1_ddtree_layers13.log", "2_neg_nonfamily_nograph.log"):
        rc = classify(raw_lines(base / name)).root_cause
        assert rc is not None and "feature dim mismatch" in rc.evidence
        named[name] = rc
    assert named["1_dflash_layers13.log"].label == "spec_decode_misconfig"
    assert named["1_ddtree_layers13.log"].label == "spec_decode_misconfig"
    assert named["2_neg_nonfamily_nograph.log"].label == "hidden_capture_missing"
    assert "target_layer_ids" in named["1_ddtree_layers13.log"].remedy
    assert "num_hidden_layers - 1" in named["1_ddtree_layers13.log"].remedy
    for rc in (named["2_neg_nonfamily_nograph.log"],):
        assert "SGLANG_PLUGINS" in rc.remedy and "plugin-check" in rc.remedy


@pytest.mark.parametrize("name, evidence", [
    ("1_neg_nonfamily_graph_layers13.log", "RuntimeError: This should not happen"),
    ("2_neg_plain_graph.log", "TypeError: unsupported operand type(s) for *: 'int' and 'NoneType'"),
])
def test_the_other_two_forms_of_missing_capture(name: str, evidence: str) -> None:
    rc = classify(raw_lines(REAL / "0.5.17" / name)).root_cause
    assert rc is not None and rc.label == "hidden_capture_missing" and rc.text == evidence
    assert "SGLANG_PLUGINS" in rc.remedy and "ddtree" in rc.remedy and "plugin-check" in rc.remedy


def _systemd_stopped(lines: list[bytes]) -> list[bytes]:
    """The real log under journald, with systemd's own stop lines where systemd prints them."""
    at = next(i for i, ln in enumerate(lines) if b"SIGTERM received" in ln)
    out = as_journald(lines)
    stop = b"Jan 10 09:59:00 ct129 systemd[1]: Stopping sglang.service - SGLang server..."
    done = [b"Jan 10 09:59:59 ct129 systemd[1]: sglang.service: Deactivated successfully.",
            b"Jan 10 09:59:59 ct129 systemd[1]: Stopped sglang.service - SGLang server."]
    return [*out[:at], stop, *out[at:], *done]


@pytest.mark.parametrize("name", ["1_base_graph.log", "1_base_nograph.log", "2_dflash.log", "2_ddtree.log"])
def test_a_normal_stop_is_not_a_crash(name: str) -> None:
    lines = raw_lines(REAL / "0.5.17" / name)
    for form in (lines, _systemd_stopped(lines)):
        rep = classify(form)
        assert rep.verdict == "healthy" and rep.root_cause is None, rep.root_cause
        # where SGLang logged its children as crashed, they are reported as harmless shutdown
        shutdown = [f for f in rep.findings if f.rule_id == "child_failed"]
        assert all(f.severity == "benign" and f.line > rep.launch["stop_requested_line"] for f in shutdown)
        assert shutdown or name.startswith("2_")


def test_a_crash_after_ready_without_a_stop_is_still_a_failure() -> None:
    lines = [ln for ln in raw_lines(REAL / "0.5.17" / "1_base_graph.log") if b"SIGTERM received" not in ln]
    rep = classify(lines)
    assert rep.ready_line is not None and rep.verdict == "failed"
    assert rep.root_cause is not None and "exit code -15" in rep.root_cause.text + " ".join(f.text for f in rep.findings)


def test_a_restart_after_a_stop_brings_crashes_back() -> None:
    """A stop only covers its own shutdown: after systemd starts the unit again, a crash counts."""
    good = _systemd_stopped(raw_lines(REAL / "0.5.17" / "1_base_graph.log"))
    bad = as_journald(raw_lines(REAL / "0.5.17" / "2_neg_plain_graph.log"))
    again = [b"Jan 10 10:00:00 ct129 systemd[1]: Started sglang.service - SGLang server.", *bad]
    rc = classify([*good, *again]).root_cause
    assert rc is not None and rc.label == "hidden_capture_missing"


def test_cli_names_the_real_logs(tmp_path: Path) -> None:
    for path, label, _ in ROWS:
        res = subprocess.run([sys.executable, "-m", "ddtree_ops", "diagnose", "--log", str(path), "--json"],
                             capture_output=True, text=True, timeout=120)
        doc = json.loads(res.stdout)
        assert res.returncode == (0 if label == "healthy" else 2), (path.name, res.stderr[-500:])
        assert (doc["root_cause"] or {}).get("label", "healthy") == label


@pytest.mark.parametrize("cuts", [[1], [54, 55], [10, 20, 30, 40, 50, 56, 57], list(range(0, 70, 3))])
def test_a_stop_split_across_polls_is_still_a_stop(cuts: list[int]) -> None:
    """The gate and `diagnose HOST` feed lines in batches; where a batch ends must not matter."""
    from ddtree_ops.diagnose.classify import Scanner

    lines = _systemd_stopped(raw_lines(REAL / "0.5.17" / "1_base_graph.log"))
    sc = Scanner()
    start = 0
    for c in [*cuts, len(lines)]:
        sc.feed(lines[start:c])
        start = c
    sc.finish()
    rep, whole = sc.report(), classify(lines)
    assert rep.verdict == whole.verdict == "healthy"
    assert [(f.rule_id, f.line, f.severity) for f in rep.findings] == [(f.rule_id, f.line, f.severity) for f in whole.findings]


def test_weights_past_the_budget_remedy_names_sglangs_minimum() -> None:
    """0.5.17 prints the fraction it needed; the remedy says it, and which way to move."""
    from ddtree_ops.diagnose.classify import classify

    for log, have, need in (("4_kv_too_small.log", "0.08", "0.131"), ("3_ddtree_s025_shared_gpu.log", "0.15", "0.176")):
        rc = classify((REAL / "0.5.17" / log).read_text(errors="replace").splitlines()).root_cause
        assert rc is not None and rc.label == "kv_pool_too_small"
        assert f"from {have} to above {need}" in rc.remedy and rc.remedy.startswith("RAISE")
