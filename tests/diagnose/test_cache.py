"""The disk cache of the parsed catalogue and of the compiled Hyperscan databases (diagnose.cache):
it speeds `diagnose` up and never changes or breaks an answer. Every test points DDTREE_OPS_CACHE at
its own directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ddtree_ops.diagnose import cache
from ddtree_ops.diagnose.catalogue import cached_catalogue, parse_catalogue
from ddtree_ops.diagnose.classify import classify
from diagnose_helpers import CORPUS, REPO, raw_lines

TEXT = (REPO / "ddtree_ops" / "diagnose" / "catalogue.yaml").read_text("utf-8")
LOG = raw_lines(CORPUS / "043-kv_pool_too_small.log")


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv(cache.CACHE_ENV, str(d))
    return d


def _entries(d: Path, prefix: str) -> list[Path]:
    return sorted(d.glob(f"{prefix}-*")) if d.is_dir() else []


def test_the_first_load_stores_the_parsed_catalogue_and_the_next_reads_it(cache_dir: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    first = cached_catalogue(TEXT)
    [entry] = _entries(cache_dir, "catalogue")
    assert oct(entry.stat().st_mode & 0o777) == "0o600" and oct(cache_dir.stat().st_mode & 0o777) == "0o700"
    import ddtree_ops.diagnose.catalogue as catalogue_mod

    def no_parse(*a: object, **k: object) -> None:
        raise AssertionError("parsed although the cache holds it")

    monkeypatch.setattr(catalogue_mod, "parse_catalogue", no_parse)
    second = cached_catalogue(TEXT)
    assert second == first  # every rule, variant, component and keyword, field by field
    assert classify(LOG, second).to_json() == classify(LOG, first).to_json()


def test_another_catalogue_text_is_another_entry(cache_dir: Path) -> None:
    cached_catalogue(TEXT)
    changed = TEXT.replace("Not enough memory\\. Please try to increase --mem-fraction-static",
                           "Not enough memory\\. Please try to raise --mem-fraction-static", 1)
    assert changed != TEXT
    cat = cached_catalogue(changed)
    assert len(_entries(cache_dir, "catalogue")) == 2
    assert classify(LOG, cat).root_cause.label != "kv_pool_too_small"  # the stale entry was not used


@pytest.mark.parametrize("damage", ["truncated", "garbage", "altered", "not json", "wrong shape"])
def test_a_damaged_entry_is_ignored_and_rewritten(cache_dir: Path, damage: str) -> None:
    want = parse_catalogue(TEXT)
    cached_catalogue(TEXT)
    [entry] = _entries(cache_dir, "catalogue")
    data = entry.read_bytes()
    head, _, payload = data.partition(b"\n")[2].partition(b"\n")
    bad = {"truncated": data[: len(data) // 2],
           "garbage": os.urandom(300),
           "altered": data.replace(b'"kv_pool_too_small"', b'"cuda_oom"', 1),
           "not json": cache.MAGIC + __import__("hashlib").sha256(b"{nope").hexdigest().encode() + b"\n{nope",
           "wrong shape": cache.MAGIC + __import__("hashlib").sha256(b'{"__t": "Rule"}').hexdigest().encode()
           + b'\n{"__t": "Rule"}'}[damage]
    entry.write_bytes(bad)
    got = cached_catalogue(TEXT)
    assert got == want
    assert entry.read_bytes() == data  # rewritten whole


def test_a_cache_that_cannot_be_written_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(cache.CACHE_ENV, str(blocker / "cache"))  # mkdir fails: ENOTDIR, as for a read-only one
    assert cached_catalogue(TEXT) == parse_catalogue(TEXT)
    assert cache.write("x", b"payload") is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # no temporary file left behind


def test_an_entry_that_is_not_ours_is_not_read(cache_dir: Path) -> None:
    cache.write("entry", b"payload")
    assert cache.read("entry") == b"payload"
    target = cache_dir / "elsewhere"
    target.write_bytes((cache_dir / "entry").read_bytes())
    (cache_dir / "entry").unlink()
    (cache_dir / "entry").symlink_to(target)
    assert cache.read("entry") is None  # a symlink (someone else's file) is not a cache entry


def test_where_the_cache_lives(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(cache.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "ddtree-ops"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "ddtree-ops"
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "explicit"))
    assert cache.cache_dir() == tmp_path / "explicit"


def test_the_compiled_hyperscan_databases_come_back_from_the_cache(cache_dir: Path) -> None:
    pytest.importorskip("hyperscan")
    from ddtree_ops.diagnose.screen import HyperscanKeywordIndex, HyperscanScreen

    screen = HyperscanScreen(("Traceback", "CUDA out of memory"), ("accept len: 1.0",))
    index = HyperscanKeywordIndex([("CUDA out of memory",), ("Traceback",)])
    assert len(_entries(cache_dir, "literals")) == 2
    for entry in _entries(cache_dir, "literals"):
        entry.write_bytes(entry.read_bytes()[:-7])  # damaged: compiled again, the same answers
    line = b"x CUDA out of memory; Traceback"
    assert HyperscanScreen(("Traceback", "CUDA out of memory"), ("accept len: 1.0",)).hits(line) == screen.hits(line)
    again = HyperscanKeywordIndex([("CUDA out of memory",), ("Traceback",)])
    assert again.candidates(line.decode()) == index.candidates(line.decode()) == (0, 1)
    assert json.dumps(sorted(p.name for p in cache_dir.iterdir()))  # and nothing else was left there
