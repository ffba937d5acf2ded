"""Skip marks for what a test needs installed, decided without importing it.

At collection every xdist worker imports every test module, so a module-level
`pytest.importorskip("sglang")` made each of the four workers import SGLang (and torch through it),
~2 CPU-s apiece, whether or not it would run those tests. The tests that need SGLang run it in
subprocesses; the worker only needs to know that it is there."""

from __future__ import annotations

import importlib.util

import pytest


def installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


SGLANG = pytest.mark.skipif(not installed("sglang"), reason="sglang 0.5.23 (installed --no-deps) is needed")
