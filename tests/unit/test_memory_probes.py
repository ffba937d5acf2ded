"""Preflight's KV-pool formula held to real SGLang: every committed memory probe.

Each file in bench/results/memory_probes/ is one start of real SGLang on the H200 (the `memory`
group of bench/realsglang/run.py): the settings, the free memory preflight read just before the
start, and SGLang's own lines. The prediction is made again here from those settings with
`ddtree_ops.memory` (bench/memory_table.py's code, the table in BENCHMARKS.md), never read from
the file, so a change to the formula or its constants that breaks the match fails here. New probe
files are picked up as they are committed.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ddtree_ops import memory

ROOT = Path(__file__).resolve().parents[2]
PROBES = sorted((ROOT / "bench" / "results" / "memory_probes").glob("*.json"))
TOLERANCE = 0.02  # issue 21: the prediction within 2% of SGLang's pool
# SGLang's own `pre` (free memory it measures before loading weights) against preflight's
# (nvidia-smi/NVML free - CUDA_CONTEXT_MIB). On the H200 the two differ by the CUDA context and
# torch.distributed's first allocations (686 MiB measured, 512 assumed). 256 MiB of `pre` is at
# most 0.2% of an H200's and moves a pool at mfs 0.8 by ~200 MiB: within the tolerance above
# everywhere but near the point where weights fill the static budget.
PRE_TOLERANCE_MIB = 256


def _table() -> ModuleType:
    spec = importlib.util.spec_from_file_location("memory_table", ROOT / "bench" / "memory_table.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TABLE = _table()


def _probe(path: Path) -> dict[str, Any]:
    probe = json.loads(path.read_text())
    probe["_path"] = path.name
    return probe


def test_probes_with_sglangs_own_output_are_committed() -> None:
    assert PROBES, "bench/results/memory_probes/ holds no probe"
    for path in PROBES:
        probe = _probe(path)
        assert probe["server"].startswith("sglang "), f"{path.name}: not real SGLang ({probe['server']})"
        assert TABLE.real_tokens(probe["sglang_lines"]), f"{path.name}: no 'KV Cache is allocated' line"
        log = path.with_name(probe["log"])
        assert log.exists(), f"{path.name}: its log {log.name} is not committed beside it"
        # the lines in the file are SGLang's, verbatim from the log
        text = log.read_text(errors="replace")
        assert all(line in text for line in probe["sglang_lines"]), path.name


@pytest.mark.parametrize("path", PROBES, ids=[p.stem for p in PROBES])
def test_prediction_within_2_percent_of_sglangs_pool(path: Path) -> None:
    probe = _probe(path)
    plan = TABLE.predict(probe)
    real = TABLE.real_tokens(probe["sglang_lines"])
    error = (plan.tokens - real) / real
    assert abs(error) <= TOLERANCE, (
        f"{path.name}: preflight predicts {plan.tokens:,} tokens, SGLang allocated {real:,} ({100 * error:+.2f}%): "
        f"{plan.summary()}")


@pytest.mark.parametrize("path", PROBES, ids=[p.stem for p in PROBES])
def test_free_memory_before_weights_matches_sglangs_own(path: Path) -> None:
    probe = _probe(path)
    plan = TABLE.predict(probe)
    sglang = TABLE.sglang_free_before_load_mib(probe["sglang_lines"])
    ours = plan.free_before_load_gib * 1024
    assert abs(ours - sglang) <= PRE_TOLERANCE_MIB, (
        f"{path.name}: preflight expects {ours:,.0f} MiB free when SGLang loads the weights "
        f"({probe['preflight']['free_mib']:,} read - CUDA_CONTEXT_MIB {memory.CUDA_CONTEXT_MIB}), "
        f"SGLang measured {sglang:,.0f} MiB")


def test_the_table_script_prints_every_probe(capsys: pytest.CaptureFixture[str]) -> None:
    assert TABLE.main([]) == 0
    out = capsys.readouterr().out
    for path in PROBES:
        assert f"`{path.name}`" in out
    assert f"{len(PROBES)} probe" in out


def test_the_table_refuses_a_stand_in_probe(tmp_path: Path) -> None:
    probe = _probe(PROBES[0])
    probe["server"] = "lab stand-in (not SGLang)"
    (tmp_path / "x.json").write_text(json.dumps(probe))
    with pytest.raises(ValueError, match="stand-in probes are not data"):
        TABLE.load(tmp_path)
