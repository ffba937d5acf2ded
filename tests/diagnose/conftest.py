"""Fixtures for the diagnose tests (helpers live in diagnose_helpers.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def catalogue():
    from ddtree_ops.diagnose.classify import load_catalogue

    return load_catalogue()
