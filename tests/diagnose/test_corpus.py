"""Every real log in tests/data/logcorpus and every synthetic fixture, in three forms each.

The label, the line and the evidence are what an operator reads first; each is asserted against
INDEX.md (real logs) or the fixture's name (synthetic ones).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest

from ddtree_ops.diagnose.classify import Report, classify
from diagnose_helpers import (QUIET, SERVING_NOT_READ, WARNING_ONLY, as_journal_json, as_journald, cites_evidence_line,
                              corpus_logs, expected, index_evidence, label_of, misses, raw_lines, synthetic_logs,
                              verdict_for)

FORMS = ("raw", "journald", "json", "json-bytes")
LOGS = corpus_logs() + synthetic_logs()


def _wrapped(path: Path, form: str) -> list[bytes]:
    lines = raw_lines(path)
    if form == "journald":
        return as_journald(lines)
    if form == "json":
        return as_journal_json(lines)
    if form == "json-bytes":
        return as_journal_json(lines, byte_arrays=True)
    return lines


@lru_cache(maxsize=None)
def _report(path: Path, form: str) -> Report:
    """Each input classified once, whichever tests read its report."""
    return classify(_wrapped(path, form))


def test_corpus_is_present() -> None:
    # the corpus ships in the repository; an empty corpus would pass vacuously
    assert len(corpus_logs()) >= 18 + 38


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("path", LOGS, ids=[p.name for p in LOGS])
def test_root_cause_label(path: Path, form: str) -> None:
    """What an operator reads first, in every form the log can come in: the verdict, the root
    cause's label and the line that shows it (INDEX.md's evidence), and for made-up fixtures the
    warnings and harmless lines their header names."""
    report = _report(path, form)
    exp = expected(path)
    got = misses(report, exp, raw_lines(path))
    if path.name in SERVING_NOT_READ:
        # another engine's serving lines, which diagnose does not read: the safe miss, never a verdict
        # of healthy (or failed) from lines it does not know
        assert got == [f"verdict inconclusive != {exp.verdict}"] and report.root_cause is None, got
        return
    assert not got, (got, [(f.rule_id, f.line, f.severity) for f in report.findings])
    if exp.verdict == "healthy":
        assert not report.fatal


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("path", LOGS, ids=[p.name for p in LOGS])
def test_every_finding_cites_the_input_line_that_holds_its_evidence(path: Path, form: str) -> None:
    """`line` is 1-based in the input as given, whatever wrapping it came in, and the evidence a
    finding quotes is on that line (a traceback whose header was cut is cited at its first frame,
    quoting that frame)."""
    report = _report(path, form)
    lines = raw_lines(path)
    for f in report.findings:
        if f.line == 0:
            continue
        original = lines[f.line - 1].decode("utf-8", "replace")
        assert f.evidence.strip()[:60] in original, (f.rule_id, f.line, f.evidence[:80], original[:120])


def test_remedy_direction_for_memory() -> None:
    """The trap the tool exists for: startup 'Not enough memory' RAISES mem_fraction_static, CUDA OOM LOWERS it."""
    from diagnose_helpers import CORPUS

    kv = classify(raw_lines(CORPUS / "043-kv_pool_too_small.log")).root_cause
    oom = classify(raw_lines(CORPUS / "016-cuda_oom.log")).root_cause
    assert kv is not None and kv.profile_key == "memory.mem_fraction_static" and kv.direction == "raise"
    assert oom is not None and oom.profile_key == "memory.mem_fraction_static" and oom.direction == "lower"


def test_possible_solutions_hint_does_not_make_a_capture_failure_a_memory_problem() -> None:
    from diagnose_helpers import FIXTURES

    rc = classify(raw_lines(FIXTURES / "synthetic-cuda_graph_capture-wrapper-only.log")).root_cause
    assert rc is not None and rc.label == "cuda_graph_capture" and rc.profile_key == "memory.cuda_graph"


def test_hardware_xid_says_do_not_roll_back() -> None:
    from diagnose_helpers import FIXTURES

    rc = classify(raw_lines(FIXTURES / "synthetic-unclassified_crash-xid-hardware.log")).root_cause
    assert rc is not None and rc.hardware and "do not roll back" in rc.remedy


def test_memory_lines_are_parsed_into_numbers() -> None:
    from diagnose_helpers import FIXTURES

    rep = classify(raw_lines(FIXTURES / "synthetic-healthy-full-startup.log"))
    m = rep.memory
    assert (m.kv_tokens, m.k_size_gb, m.v_size_gb) == (141312, 9.70, 9.70)
    assert m.max_total_num_tokens == 141312 and m.available_gpu_mem_gb == 9.45
    assert m.weights_gb == 15.36 and m.context_len == 32768
    assert rep.ready_line == 20
    assert rep.accept.recent == (3.41,)


def test_accept_len_streak_broken_by_a_good_report_is_not_a_failure() -> None:
    line = ("[2026-01-10 09:00:20 TP0] Decode batch, #running-req: 1, #token: 310, token usage: 0.00, "
            "accept len: {}, accept rate: 0.00, cuda graph: True, gen throughput (token/s): 31.02, #queue-req: 0, ")
    values = ["1.00", "1.00", "2.40", "1.00", "1.00", "3.10"]
    rep = classify([line.format(v) for v in values])
    assert rep.root_cause is None
    stuck = classify([line.format(v) for v in ["2.10", "1.00", "1.00", "1.00"]])
    assert stuck.root_cause is not None and stuck.root_cause.label == "hidden_capture_missing"
    assert stuck.root_cause.line == 4


# Each collection's held-out part, as first scored (once, after its rules were final): it may not
# drop. Issue 12's (200-221): 21 of 22 in every form (205 missed). Issue 20's (400-448): 43 of 49 in
# every form (404, 411, 422, 424, 428, 435 missed; bench/results/diagnose.md).
HELD_OUT = {(200, 221): (22, 21), (400, 448): (49, 43), (600, 642): (42, 33), (800, 839): (40, 32),
            (950, 980): (31, 24)}   # numbers -> (logs, at least named)


@pytest.mark.parametrize("span", sorted(HELD_OUT), ids=lambda s: f"{s[0]}-{s[1]}")
@pytest.mark.parametrize("form", ("raw", "journald", "json"))
def test_held_out_part_keeps_its_score(form: str, span: tuple[int, int]) -> None:
    """The held-out logs were never tuned on; their score is reported, and must not drop."""
    from diagnose_helpers import heldout_logs

    logs = heldout_logs(*span)
    count, floor = HELD_OUT[span]
    assert len(logs) == count
    named = []
    for path in logs:
        label = label_of(path)
        rep = classify(_wrapped(path, form))
        if label in QUIET:
            named.append(rep.verdict == verdict_for(label, path.name) and rep.root_cause is None)
        else:
            named.append(rep.root_cause is not None and rep.root_cause.label == label)
    assert sum(named) >= floor, [p.name for p, ok in zip(logs, named, strict=True) if not ok]


# The gate's coarser judgment on the same held-out parts: the verdict alone (a failure called
# failed, a healthy log not called failed), whatever root cause was named. 950-980 as first
# scored; the earlier parts as they stand under the catalogue that scored 950-980
# (bench/diagnose_corpus.py's last column). 800-839 went from 38 to 37 with issue 31's verdict:
# 830 is a healthy xinfer server whose serving lines diagnose does not read, now inconclusive (the
# safe side) where it was healthy.
HELD_OUT_VERDICT = {(200, 221): 22, (400, 448): 48, (600, 642): 38, (800, 839): 37, (950, 980): 29}


@pytest.mark.parametrize("span", sorted(HELD_OUT_VERDICT), ids=lambda s: f"{s[0]}-{s[1]}")
@pytest.mark.parametrize("form", ("raw", "journald", "json"))
def test_held_out_part_keeps_telling_failures_from_health(form: str, span: tuple[int, int]) -> None:
    from diagnose_helpers import heldout_logs

    told = [classify(_wrapped(path, form)).verdict == verdict_for(label_of(path), path.name)
            for path in heldout_logs(*span)]
    assert sum(told) >= HELD_OUT_VERDICT[span], sum(told)


# The evidence-line figure (issue 31): how often the line cited as the cause is the line INDEX.md
# names (or a line of the same multi-line message), per collection. Each part's floor is the figure
# as first measured (raw, journald and json alike; bench/diagnose_corpus.py prints it): the tuning
# parts all of their logs; the held-out parts, scored for this figure once, when it was added (at
# d49aa92's catalogue plus the ending fix), before the rule that a compiler's or shell's own error
# line outranks the build tool's exit line over it.
EVIDENCE_LINE = {(100, 137): (35, 35), (200, 221): (19, 19), (300, 333): (29, 29), (400, 448): (43, 36),
                 (500, 532): (27, 27), (600, 642): (35, 27), (700, 721): (15, 15), (800, 839): (33, 28),
                 (900, 917): (16, 16), (950, 980): (28, 23)}   # numbers -> (failure logs with evidence, floor)


def _numbered(first: int, last: int) -> list[Path]:
    from diagnose_helpers import CORPUS

    return sorted(p for p in CORPUS.glob("*.log") if p.name[:3].isdigit() and first <= int(p.name[:3]) <= last)


@pytest.mark.parametrize("span", sorted(EVIDENCE_LINE), ids=lambda s: f"{s[0]}-{s[1]}")
@pytest.mark.parametrize("form", ("raw", "journald", "json"))
def test_the_cited_line_is_the_line_a_person_points_at(form: str, span: tuple[int, int]) -> None:
    evidence = index_evidence()
    logs = [p for p in _numbered(*span)
            if label_of(p) not in QUIET + WARNING_ONLY and evidence.get(p.name)]
    count, floor = EVIDENCE_LINE[span]
    assert len(logs) == count
    right = [cites_evidence_line(_report(p, form), evidence[p.name], raw_lines(p))
             for p in logs]
    assert sum(right) >= floor, [p.name for p, ok in zip(logs, right, strict=True) if not ok]


def test_no_failure_log_under_tests_is_called_healthy() -> None:
    """Issue 31's verdict: healthy needs evidence of serving and nothing fatal. Across every log
    under tests/ whose reading is a failure (the corpus with its held-out parts, the made-up
    fixtures, the real SGLang logs), in every form, none is called healthy."""
    from diagnose_helpers import CORPUS, REPO

    paths = [p for p in sorted(CORPUS.glob("*.log")) + synthetic_logs() if label_of(p) not in QUIET]
    for index in sorted((REPO / "tests" / "data" / "real-sglang").glob("*/INDEX.md")):
        for line in index.read_text("utf-8").splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 3 and cells[0].endswith(".log") and cells[1] not in ("healthy", "inconclusive"):
                paths.append(index.parent / cells[0])
    assert len(paths) > 300
    called = [(p.name, form) for p in paths for form in ("raw", "journald", "json")
              if _report(p, form).verdict == "healthy"]
    assert not called, called
