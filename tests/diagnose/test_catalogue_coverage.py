"""Every catalogue rule earns its place against the logs in tests/ (issue 20).

- A rule that claims no line of any log in tests/ (a real log, or a fixture labelled as made up)
  has nothing showing that a server prints its text: the coverage test fails.
- A rule that can be taken out without any expected answer changing (verdict, root-cause label
  and evidence, the warnings and harmless lines a made-up fixture names) has no test that fails
  without it: the mutation test fails. Rules whose effect is context or a secondary finding
  (not a label) are held by the named tests in HELD_BY instead (each seen failing without its
  rule when it was written).

Held-out logs are never read here: they are scored, not tuned on.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from ddtree_ops.diagnose.catalogue import Catalogue, load_catalogue, screen_for
from ddtree_ops.diagnose.classify import classify
from diagnose_helpers import REPO, SERVING_NOT_READ, Expect, corpus_logs, expected, misses, raw_lines, synthetic_logs

REAL = REPO / "tests" / "data" / "real-sglang"

# Rules whose effect is the context or a secondary finding, and the test that fails without each.
HELD_BY = {
    "launch_settings": "test_real_sglang.py::test_layer_ids_and_missing_capture_print_the_same_message_and_are_told_apart",
    "unit_starting": "test_catalogue_coverage.py::test_the_expected_answers_hold_with_the_whole_catalogue",
    "stop_requested": "test_real_sglang.py::test_a_normal_stop_is_not_a_crash",
    "ddtree_registered": "test_verdicts.py::test_a_registered_ddtree_is_not_missing_its_capture",
    "ddtree_plugin_worker": "test_real_sglang.py::test_layer_ids_and_missing_capture_print_the_same_message_and_are_told_apart",
    "server_ready": "test_corpus.py::test_memory_lines_are_parsed_into_numbers",
    "memory_facts": "test_corpus.py::test_memory_lines_are_parsed_into_numbers",
    "pyspy_missing": "test_verdicts.py::test_secondary_symptoms_say_what_they_add",
    "common_ops_banner": "test_verdicts.py::test_secondary_symptoms_say_what_they_add",
    # the Xid's class (hardware: do not roll back) is what it adds over gpu_unresponsive's label
    "nvidia_xid": "test_corpus.py::test_hardware_xid_says_do_not_roll_back",
    "child_failed": "test_real_sglang.py::test_a_crash_after_ready_without_a_stop_is_still_a_failure",
}


def _real_rows() -> list[tuple[Path, Expect]]:
    rows = []
    for index in sorted(REAL.glob("*/INDEX.md")):
        for line in index.read_text("utf-8").splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 3 and cells[0].endswith(".log"):
                label = cells[1]
                exp = Expect(label, None) if label in ("healthy", "inconclusive") else Expect("failed", label)
                rows.append((index.parent / cells[0], exp))
    return rows


@cache
def _cases() -> tuple[tuple[str, tuple[bytes, ...], Expect], ...]:
    out = [(p.name, tuple(raw_lines(p)), expected(p)) for p in corpus_logs() + synthetic_logs()]
    out += [(p.name, tuple(raw_lines(p)), exp) for p, exp in _real_rows()]
    return tuple(out)


def _failures(cat: Catalogue) -> dict[str, list[str]]:
    out = {}
    for name, lines, exp in _cases():
        got = misses(classify(list(lines), cat), exp, list(lines))
        if got:
            out[name] = got
    return out


def test_every_rule_claims_a_line_of_a_log_in_tests() -> None:
    claimed: set[str] = set()
    for _, lines, _ in _cases():
        claimed |= set(classify(list(lines)).claimed)
    idle = [r.id for r in load_catalogue().rules if r.id not in claimed]
    assert not idle, f"rules that match no log in tests/ (add a real log, or a fixture labelled as made up): {idle}"


@cache
def _base() -> dict[str, list[str]]:
    """The whole catalogue's misses, computed once for every test that compares with it."""
    return _failures(load_catalogue())


def test_the_expected_answers_hold_with_the_whole_catalogue() -> None:
    # the only miss: a healthy log whose serving lines come from an engine diagnose does not read
    # (inconclusive, the safe side; test_corpus.py holds it to exactly that)
    known = {name: [f"verdict inconclusive != {exp.verdict}"] for name, _, exp in _cases() if name in SERVING_NOT_READ}
    assert _base() == known


def _without(cat: Catalogue, rule_id: str) -> Catalogue:
    """The catalogue with one rule taken out (the screen is rebuilt, so nothing else changes)."""
    from dataclasses import replace

    kept = tuple(replace(r, order=i) for i, r in enumerate(r for r in cat.rules if r.id != rule_id))
    out = replace(cat, rules=kept)
    screen_for(out)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("rule_id", [r.id for r in load_catalogue().rules if r.id not in HELD_BY])
def test_taking_the_rule_out_changes_an_expected_answer(rule_id: str) -> None:
    base = _base()
    without = _failures(_without(load_catalogue(), rule_id))
    changed = sorted(k for k in set(base) | set(without) if base.get(k) != without.get(k))
    assert changed, f"{rule_id}: no expected answer in tests/ depends on this rule"


def test_rules_held_by_named_tests_exist_and_so_do_their_tests() -> None:
    ids = {r.id for r in load_catalogue().rules}
    assert set(HELD_BY) <= ids, set(HELD_BY) - ids
    assert {r.id for r in load_catalogue().rules if r.severity == "info"} <= set(HELD_BY)
    here = Path(__file__).resolve().parent
    for where in HELD_BY.values():
        module, _, func = where.partition("::")
        assert f"def {func}(" in (here / module).read_text("utf-8"), where
