"""Engine test fixtures: a tiny random Llama (milliseconds). SmolLM2-135M (the real model) is
loaded by the code under test itself (`run_verify`, `engine verify`), once per use.

Tests that need torch carry `@pytest.mark.engine`; without torch the whole directory is skipped
at collection rather than failing on import.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def tiny() -> Any:
    from ddtree_ops.engine.models import tiny_llama

    torch.set_num_threads(max(1, torch.get_num_threads()))
    return tiny_llama(vocab_size=96, hidden=64, layers=2, seed=3)
