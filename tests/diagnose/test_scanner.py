"""The deploy gate feeds the Scanner a poll's worth of lines at a time: chunking must not matter."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddtree_ops.diagnose.classify import Report, Scanner, classify, classify_bytes
from diagnose_helpers import FIXTURES, as_journal_json, as_journald, corpus_logs, raw_lines, synthetic_logs

LOGS = corpus_logs() + synthetic_logs()
ALL_LINES = [(p.name, raw_lines(p)) for p in LOGS]


def _key(r: Report) -> tuple:
    rc = r.root_cause
    return (r.verdict, None if rc is None else (rc.label, rc.line, rc.rule_id),
            [(f.rule_id, f.line, f.severity) for f in r.findings], r.lines, r.accept.recent, r.memory)


def _chunked(lines: list[bytes], cuts: list[int]) -> Report:
    sc = Scanner()
    start = 0
    for c in sorted(set(cuts)) + [len(lines)]:
        if c > start:
            sc.feed(lines[start:c])
            start = c
    sc.finish()
    return sc.report()


@settings(max_examples=60, deadline=None)
@given(which=st.integers(0, len(ALL_LINES) - 1), cuts=st.lists(st.integers(0, 60), max_size=12),
       journald=st.booleans())
def test_chunks_give_the_same_report(which: int, cuts: list[int], journald: bool) -> None:
    _, lines = ALL_LINES[which]
    if journald:
        lines = as_journald(lines)
    assert _key(_chunked(lines, cuts)) == _key(classify(lines))


def test_traceback_split_line_by_line_keeps_its_cause() -> None:
    """A poll boundary after 'Traceback' must not turn the header into an unexplained crash."""
    lines = raw_lines(FIXTURES / "synthetic-hidden_capture_missing-prefill-none.log")
    sc = Scanner()
    seen = []
    for i, ln in enumerate(lines):
        seen += sc.feed([ln])
        if i < 8:  # before the exception line arrives, nothing fatal is claimed
            assert sc.first_fatal is None or sc.first_fatal.label != "unclassified_crash" or i >= 8
    sc.finish()
    rep = sc.report()
    assert rep.root_cause is not None and rep.root_cause.label == "hidden_capture_missing"
    assert sc.first_fatal is not None
    assert {f.rule_id for f in seen} >= {"dflash_hidden_capture_missing"}


def test_feed_returns_only_new_findings() -> None:
    lines = raw_lines(FIXTURES / "synthetic-host_oom-systemd.log")
    sc = Scanner()
    first = sc.feed(lines[:2])
    second = sc.feed(lines[2:])
    assert [f.line for f in first] == [2]
    assert sorted(f.line for f in second) == [3, 4]
    assert sc.first_fatal is not None and sc.first_fatal.line == 2


@settings(max_examples=40, deadline=None)
@given(which=st.integers(0, len(ALL_LINES) - 1), sizes=st.lists(st.integers(1, 700), min_size=1, max_size=30))
def test_byte_blocks_split_anywhere(which: int, sizes: list[int]) -> None:
    """Reading a file in blocks that cut lines (and UTF-8 characters) in half changes nothing."""
    name, lines = ALL_LINES[which]
    data = b"\n".join(lines) + b"\n"
    sc = Scanner()
    pos = 0
    i = 0
    while pos < len(data):
        n = sizes[i % len(sizes)]
        sc.feed_bytes(data[pos:pos + n])
        pos += n
        i += 1
    sc.finish()
    assert _key(sc.report()) == _key(classify_bytes(data)), name


def test_json_journal_in_blocks() -> None:
    lines = as_journal_json(raw_lines(FIXTURES / "synthetic-cuda_oom-nested-in-capture.log"), byte_arrays=True)
    data = b"\n".join(lines) + b"\n"
    sc = Scanner()
    for i in range(0, len(data), 333):
        sc.feed_bytes(data[i:i + 333])
    sc.finish()
    rc = sc.report().root_cause
    assert rc is not None and rc.label == "cuda_oom" and rc.line == 5


def test_gate_style_messages_without_prefixes() -> None:
    """The gate passes journal MESSAGE strings (already unwrapped), one poll at a time."""
    lines = [ln.decode() for ln in raw_lines(Path(FIXTURES / "synthetic-kv_pool_too_small-weights-leave-no-memory.log"))]
    sc = Scanner()
    for chunk in (lines[:1], lines[1:3], lines[3:]):
        sc.feed(chunk)
    rc = sc.report().root_cause
    assert rc is not None and rc.label == "kv_pool_too_small" and rc.direction == "raise"


def test_the_screen_in_worker_processes_gives_the_same_report(tmp_path: Path) -> None:
    """classify_path (what `diagnose --log FILE` runs) screens slices of the file in forked workers;
    its report is the one a single sequential read gives, line numbers included."""
    from ddtree_ops.diagnose.classify import classify_path

    lines: list[bytes] = []
    for _, raw in ALL_LINES:
        lines += as_journald(raw)
    data = b"\n".join(lines * 3) + b"\n"
    path = tmp_path / "journal.txt"
    path.write_bytes(data)
    single = classify_bytes(data)
    parallel = classify_path(str(path), workers=2, min_bytes=0, chunk_bytes=3000)  # slices cut tracebacks
    assert _key(parallel) == _key(single) and single.lines == len(lines) * 3


SCREENS = ("python", "hyperscan")


def _catalogue_with(screen: str, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN202 - a Catalogue
    """A catalogue whose keyword screen is the stdlib one or Hyperscan."""
    from ddtree_ops.diagnose import screen as S
    from ddtree_ops.diagnose.catalogue import parse_catalogue, screen_for

    if screen == "hyperscan" and not S.hyperscan_available():
        pytest.skip("hyperscan is not installed here")
    cat = parse_catalogue((Path(S.__file__).parent / "catalogue.yaml").read_text("utf-8"), screen_kind=screen)
    assert type(screen_for(cat)).__name__ == ("HyperscanScreen" if screen == "hyperscan" else "Screen")
    return cat


@pytest.mark.parametrize("screen", SCREENS)
def test_both_screens_give_the_same_report(screen: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The screen only decides which lines Python reads: Hyperscan (where installed) and the stdlib
    screen must give the report the scanner gives when it reads every line."""
    cat = _catalogue_with(screen, monkeypatch)
    for name, raw in ALL_LINES:
        data = b"\n".join(as_journald(raw)) + b"\n"
        reports = []
        for every_line in (False, True):
            sc = Scanner(cat)
            if every_line:
                sc.screen = _EveryLine()  # type: ignore[assignment]
            sc.feed_bytes(data)
            sc.finish()
            reports.append(_key(sc.report()))
        assert reports[0] == reports[1], name


class _EveryLine:
    """No screening at all: every line is read in Python (the reference a screen must equal)."""

    def hits(self, buf: bytes, start: int = 0, end: int | None = None) -> list[int]:
        end = len(buf) if end is None else end
        out, pos = [], start
        while pos < end:
            out.append(pos)
            nl = buf.find(b"\n", pos, end)
            pos = end if nl < 0 else nl + 1
        return out


@pytest.mark.parametrize("screen", SCREENS)
def test_a_screen_finds_a_keyword_cut_by_block_edges(screen: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cat = _catalogue_with(screen, monkeypatch)
    line = b"Jan 10 09:00:00 ct129 sglang[1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    data = b"Jan 10 09:00:00 ct129 sglang[1]: healthy line\n" * 3000 + line
    for size in (7, 4096, 65536):
        sc = Scanner(cat)
        for i in range(0, len(data), size):
            sc.feed_bytes(data[i:i + size])
        sc.finish()
        rc = sc.report().root_cause
        assert rc is not None and rc.label == "cuda_oom" and rc.line == 3001, size


@pytest.mark.parametrize("screen", SCREENS)
def test_threads_share_a_catalogue_and_its_screen(screen: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fleet and service gates classify several hosts' journals at once, in threads, with one
    catalogue: each scan must get the report it gets alone (Hyperscan scans without the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    cat = _catalogue_with(screen, monkeypatch)
    datas = [b"\n".join(as_journald(raw)) * 20 + b"\n" for _, raw in ALL_LINES[:16]]

    def one(data: bytes) -> tuple:
        sc = Scanner(cat)
        for i in range(0, len(data), 1 << 16):
            sc.feed_bytes(data[i:i + (1 << 16)])
        sc.finish()
        return _key(sc.report())

    alone = [one(d) for d in datas]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(one, datas * 3))
    assert together == alone * 3


def test_no_rule_keyword_is_in_a_healthy_serving_line() -> None:
    """A keyword that a healthy decode/prefill/access line holds sends every such line, ten a
    second on a busy server, through Python's rules: a journal then reads at a fiftieth of grep's
    speed ('ode', from killed_by_signal's '[Rr]eturn ?[Cc]ode', did so). A pattern's keyword is
    taken from its other literals (here 'eturn')."""
    from ddtree_ops.diagnose.catalogue import load_catalogue
    from ddtree_ops.diagnose.screen import HEALTHY_SAMPLE

    assert [(r.id, lit) for r in load_catalogue().rules for lit in r.literals if lit in HEALTHY_SAMPLE] == []


@pytest.mark.parametrize("size", [37, 245, 4096])
def test_the_error_line_over_a_build_tools_exit_is_found_across_blocks(size: int) -> None:
    """The compiler's own line is looked for above the build tool's, in this block and the previous
    blocks' tail: a file read in blocks cites the same line (a block boundary once made it the
    build tool's line, from a block that starts mid-file)."""
    lines = raw_lines(FIXTURES / "synthetic-flashinfer_jit_error-nvcc-error-over-ninja.log")
    data = b"\n".join(lines) + b"\n"
    sc = Scanner()
    for pos in range(0, len(data), size):
        sc.feed_bytes(data[pos:pos + size])
    sc.finish()
    rc = sc.report().root_cause
    assert rc is not None and rc.line == 8 and 'identifier "__hmax2" is undefined' in rc.text
