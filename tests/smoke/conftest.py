"""Fixtures for the smoke checks' tests."""

from __future__ import annotations

from typing import Any

import pytest

from ddtree_ops.profile import load_profile


@pytest.fixture(scope="session")
def profiles() -> dict[str, Any]:
    return {name: load_profile(name) for name in ("ct129", "ct200")}
