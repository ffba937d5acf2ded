"""Hostile input: megabyte lines, binary junk, regex bait. The classifier must answer, and fast.

The time budgets are generous upper bounds that only catastrophic (super-linear) backtracking
would break; they are not benchmarks.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddtree_ops.diagnose.classify import (CatalogueError, Scanner, classify, classify_bytes, screen_for,
                                          load_catalogue, parse_catalogue)

BUDGET_S = 10.0


def _timed(data: bytes) -> float:
    """CPU-s of this process: a super-linear scan shows there, while wall time also counts the waits
    for a CPU on a loaded machine."""
    t = time.process_time()
    classify_bytes(data)
    return time.process_time() - t


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(min_size=0, max_size=200_000))
def test_binary_junk_never_raises(data: bytes) -> None:
    rep = classify_bytes(data)
    assert rep.verdict in ("healthy", "degraded", "failed", "inconclusive")


BAIT = [
    "ValueError: ", "Error", "lib", "libcuda", "tcp://", "'tcp://", "Traceback (most recent call last):",
    "Failed with result '", "watchdog timeout (", "undefined symbol: ", "NVRM: Xid (", "accept len: 1.00, ",
    "KV Cache is allocated. #tokens: ", "Load weight end.", "  File \"x\", line 1, in f", "(pid=1) ", "[rank0]: ",
    "Nov 29 07:29:01 h u[1]: ", "\x00", "\xff", "é", " ", "\t", "mem usage=", "Capture cuda graph end.",
]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(st.sampled_from(BAIT), min_size=1, max_size=6), repeat=st.integers(1000, 60_000))
def test_megabyte_lines_of_regex_bait_stay_linear(parts: list[str], repeat: int) -> None:
    line = ("".join(parts) * repeat)[:2_000_000]
    assert _timed(line.encode("utf-8", "surrogateescape") + b"\n") < BUDGET_S


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(st.sampled_from(BAIT), min_size=1, max_size=4), lines=st.integers(1000, 20_000))
def test_many_lines_of_bait_stay_bounded(parts: list[str], lines: int) -> None:
    text = ("".join(parts) + "\n") * lines
    assert _timed(text.encode("utf-8", "surrogateescape")) < BUDGET_S


def test_endless_traceback_does_not_hold_findings_forever() -> None:
    lines = ["Traceback (most recent call last):"] + ['  File "x.py", line 1, in f'] * 20_000 + ["RuntimeError: CUDA out of memory"]
    sc = Scanner()
    sc.feed(lines)
    sc.finish()
    rep = sc.report()
    assert rep.verdict == "failed"


@pytest.mark.parametrize("rule_index", range(len(load_catalogue().rules)))
def test_every_pattern_is_found_by_the_keyword_screen(rule_index: int) -> None:
    """Strings generated from each pattern, in a journald line, are hit by the screen and classified."""
    cat = load_catalogue()
    rule = cat.rules[rule_index]
    screen = screen_for(cat)
    if rule.frames or rule.raised_in:
        pytest.skip("matches only inside a traceback from given files (tested with fixtures)")

    checked: list[str] = []

    # derandomized: the same examples on every run and machine (a failure here is reproducible)
    @settings(max_examples=25, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(st.sampled_from(rule.patterns).flatmap(lambda p: st.from_regex(p, fullmatch=True)))
    def check(text: str) -> None:
        text = text.rstrip()  # log lines are matched without trailing whitespace
        if "\n" in text or "\r" in text or not text.strip() or rule.search(text) is None:
            return  # not a line this rule claims (a generated string can end in a space or a newline)
        checked.append(text)
        if rule.context in ("start", "stop"):
            # looked back for when shutdown noise follows, not screened: a stop makes it benign
            line = ("Jan 10 09:00:00 ct129 systemd[1]: " + text).encode("utf-8", "surrogateescape")
            quit_ = b"Jan 10 09:00:01 ct129 sglang[1]: Received sigquit from a child process. It usually means the child failed."
            rep = classify([b"Jan 10 09:00:00 ct129 sglang[1]: SIGTERM received. Draining requests"] * (rule.context == "start")
                           + [line, quit_])
            assert [f.severity for f in rep.findings if f.rule_id == "child_failed"] == [
                "benign" if rule.context == "stop" else "fatal"], (rule.id, text, rep.findings)
            return
        line = ("Jan 10 09:00:00 ct129 sglang[1]: " + text).encode("utf-8", "surrogateescape")
        assert screen.hits(line), (rule.id, text)
        rep = classify([line])
        got = [f.rule_id for f in rep.findings]
        # the line is claimed by this rule or by one listed before it (order is priority); a rule
        # whose resolver declines without the context it needs leaves the line to a later one
        orders = {r.id: r.order for r in cat.rules}
        if rule.severity == "info" or (rule.resolve is not None and got and rule.id not in got):
            return
        assert got and min(orders.get(g, 10**6) for g in got) <= rule.order or "accept_len" in "".join(got), (rule.id, text, got)

    check()
    # every example may be one the rule does not claim: then nothing was asserted about this rule
    assert checked, f"{rule.id}: no generated line was a line this rule claims"


def test_patterns_are_valid_posix_ere() -> None:
    """The benchmark hands the same patterns to grep -E: grep must accept every one."""
    grep = shutil.which("grep")
    if grep is None:
        pytest.skip("no grep")
    for p in load_catalogue().patterns():
        res = subprocess.run([grep, "-E", "-c", "-e", p], input=b"x\n", capture_output=True)
        assert res.returncode in (0, 1), (p, res.stderr)


def test_bad_catalogue_is_refused_with_a_clear_message() -> None:
    with pytest.raises(CatalogueError, match="label"):
        parse_catalogue("rules:\n- {id: a, label: nope, severity: fatal, role: cause, patterns: ['abcdef']}\n")
    with pytest.raises(CatalogueError, match="literal"):
        parse_catalogue("rules:\n- {id: a, label: cuda_oom, severity: fatal, role: cause, patterns: ['[a-z]+']}\n")
    with pytest.raises(CatalogueError, match="subset"):
        parse_catalogue("rules:\n- {id: a, label: cuda_oom, severity: fatal, role: cause, patterns: ['abcd\\\\d+']}\n")


def test_catalogue_labels_and_remedies() -> None:
    from ddtree_ops.diagnose.classify import LABELS

    cat = load_catalogue()
    seen = {r.label for r in cat.rules}
    # every failure class has at least one rule (healthy is the absence of findings)
    assert seen >= set(LABELS) - {"healthy"}
    key = re.compile(r"^((memory|service|modes|parallel|multinode)\.[a-z_<>.-]+|gpus)$")
    for r in cat.rules:
        if r.severity == "fatal":
            # a resolver always picks a variant: then each variant is what an operator reads
            assert r.remedy or (r.variants and all(v.remedy for v in r.variants)), r.id
        for k in [r.profile_key, *(v.profile_key for v in r.variants)]:
            assert k is None or key.match(k), (r.id, k)
