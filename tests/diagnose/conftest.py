"""Fixtures for the diagnose tests (helpers live in diagnose_helpers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def own_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The disk cache (diagnose.cache) of this session, not the machine's: nothing a test reads
    comes from an earlier run or another checkout."""
    from ddtree_ops.diagnose.cache import CACHE_ENV

    mp = pytest.MonkeyPatch()
    mp.setenv(CACHE_ENV, str(tmp_path_factory.mktemp("diagnose-cache")))
    yield
    mp.undo()


@pytest.fixture(scope="session")
def catalogue():
    from ddtree_ops.diagnose.classify import load_catalogue

    return load_catalogue()
