"""Tracebacks replayed from templates, and runs of them counted in bulk (replay.py), give the report
that reading every line gives (issue 31: the worst-case journal). Each case builds a journal with a
fixed seed, reads it with replay and without, and compares everything a report holds; the cases
are the ways a run must stop or must not start."""

from __future__ import annotations

import random
import sys
from typing import Any

import pytest

from ddtree_ops.diagnose.classify import Report, Scanner, parse_catalogue
from diagnose_helpers import REPO, as_journald, corpus_logs, raw_lines, synthetic_logs

PREFIX = "Jan  1 00:00:{s:02d} ct129 sglang-ddtree[41231]: "
WORDS = ["tensor", "shape", "index", "batch", "token", "cache", "slot", "rank", "stream", "page"]


def _event(rng: random.Random, i: int, exc: str | None = None, line: int = 612) -> list[str]:
    msg = " ".join(rng.choice(WORDS) + rng.choice("abcdefghijklmnopqrstuvwxyz") * rng.randint(1, 4) for _ in range(6))
    lines = ["[2026-01-01 00:00:00] ERROR:    Exception in ASGI application",
             "Traceback (most recent call last):",
             f'  File "/opt/venv/lib/python3.11/site-packages/sglang/srt/entrypoints/http_server.py", line {line}, in generate_request',
             "    ret = await _global_state.tokenizer_manager.generate_request(obj, request).__anext__()",
             exc if exc is not None else f"KeyError: '{msg}'"]
    return [PREFIX.format(s=(i * 7) % 60) + ln for ln in lines]


def _journal(n: int, seed: int = 5, at: dict[int, list[str]] | None = None, exc: dict[int, str] | None = None,
             lineno: dict[int, int] | None = None) -> list[bytes]:
    rng = random.Random(seed)
    out: list[str] = []
    for i in range(n):
        out += (at or {}).get(i, [])
        out += _event(rng, i, (exc or {}).get(i), (lineno or {}).get(i, 612))
    return [ln.encode() for ln in out]


@pytest.fixture(params=["hyperscan", "python"], autouse=True)
def screen(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every case with each keyword screen (Hyperscan's, where installed, and the stdlib one)."""
    if request.param == "hyperscan":
        from ddtree_ops.diagnose.screen import hyperscan_available

        if not hyperscan_available():
            pytest.skip("hyperscan is not installed")
    monkeypatch.setattr(sys.modules[__name__], "KIND", request.param)
    return str(request.param)


KIND = "hyperscan"
_CATS: dict[str, Any] = {}


def _catalogue() -> Any:
    if KIND not in _CATS:
        _CATS[KIND] = parse_catalogue((REPO / "ddtree_ops" / "diagnose" / "catalogue.yaml").read_text("utf-8"),
                                      screen_kind=KIND)
    return _CATS[KIND]


def _read(lines: list[bytes], replay: bool, chunks: int = 1) -> tuple[Report, tuple[int, int]]:
    sc = Scanner(_catalogue())
    sc.replay = replay
    step = max(1, len(lines) // chunks)
    for k in range(0, len(lines), step):
        sc.feed(lines[k:k + step])
    sc.finish()
    return sc.report(), sc.replayed


def _key(r: Report) -> tuple[Any, ...]:
    rc = r.root_cause
    return (r.verdict, None if rc is None else (rc.label, rc.line, rc.rule_id, rc.text, rc.frames, rc.remedy),
            [(f.rule_id, f.line, f.severity, f.text, f.frames, f.label) for f in r.findings], r.lines,
            sorted(r.suppressed.items()), sorted(r.claimed.items()), r.launch, r.serving, r.accept, r.memory)


def _same(lines: list[bytes], chunks: int = 1) -> tuple[int, int]:
    got, how = _read(lines, True, chunks)
    want, _ = _read(lines, False)
    assert _key(got) == _key(want)
    return how


def test_a_journal_of_request_tracebacks_is_counted_in_bulk_and_reads_the_same() -> None:
    replays, bulk = _same(_journal(400))
    assert replays >= 1 and bulk > 300  # the whole point: most events never go line by line


@pytest.mark.parametrize("exc, why", [
    ("KeyError: 'Unsupported compute capability sm_120 for this kernel'", "a literal another rule needs, no keyword"),
    ("KeyError: 'CUDA out of memory. Tried to allocate 2.00 GiB'", "a keyword of the screen in the message"),
    ("ValueError: 'slot 7 gone'", "another exception class"),
    ("KeyError: 'accept len: 1.00 never moved'", "an accept-length report inside the message"),
    ("KeyError: 'accept len: 0.95 at step 7'", "an accept-length report no keyword of the screen holds"),
    ("KeyError: 'CUDA_VISIBLE_DEVICES=0,1 but rank 3'", "the visible cards inside the message"),
    ("KeyError: 'speculative draft rejected'", "a message a speculative rule's pattern reads"),
    ('KeyError: \'File "/x/y.py", line 3, in f raise ValueError(\'', "a traceback flattened into the message"),
])
def test_a_message_that_another_rule_may_claim_stops_the_run(exc: str, why: str) -> None:
    _same(_journal(200, exc={120: exc}))


def test_a_stop_in_the_middle_makes_the_rest_shutdown_as_it_does_line_by_line() -> None:
    stop = [PREFIX.format(s=1).replace("sglang-ddtree[41231]", "systemd[1]") + "Stopping sglang.service - SGLang server..."]
    quit_ = [PREFIX.format(s=2) + "Received sigquit from a child process. It usually means the child failed."]
    _same(_journal(200, at={100: stop, 199: quit_}))


@pytest.mark.parametrize("chunks", [3, 17, 101])
def test_poll_boundaries_anywhere_change_nothing(chunks: int) -> None:
    lines = _journal(150, lineno={70: 613, 71: 9999})  # and frames whose line numbers differ
    _same(lines, chunks)
    _same(lines[:-2], chunks)  # an input that ends inside a traceback


def test_a_named_cause_in_the_middle_is_still_the_root() -> None:
    oom = [PREFIX.format(s=3) + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]
    lines = _journal(300, at={250: oom})
    got, _ = _read(lines, True)
    assert got.root_cause is not None and got.root_cause.label == "cuda_oom"
    _same(lines)


def test_journald_and_json_forms_and_the_corpus_read_the_same() -> None:
    """The corpus and the fixtures (few repeats: templates learnt, rarely replayed) in raw and
    journald form; JSON journals are read line by line (no template)."""
    for path in corpus_logs() + synthetic_logs():
        lines = raw_lines(path)
        _same(lines)
        _same(as_journald(lines))


def test_the_screen_in_worker_processes_replays_the_same(tmp_path: Any) -> None:
    """classify_path hands the scanner blocks whose screen ran in forked workers: runs are found and
    counted from those hits as from its own."""
    from ddtree_ops.diagnose.classify import classify_path

    lines = _journal(300, exc={150: "KeyError: 'Unsupported compute capability sm_120'"})
    path = tmp_path / "journal.txt"
    path.write_bytes(b"\n".join(lines) + b"\n")
    want, _ = _read(lines, False)
    got = classify_path(str(path), _catalogue(), workers=2, min_bytes=0, chunk_bytes=20000)
    assert _key(got) == _key(want)
