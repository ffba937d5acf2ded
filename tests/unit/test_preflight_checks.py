"""Preflight's judgements of what it read on the host: SGLang and the plugin (the release table),
and the draft's captured layers against the target."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ddtree_ops.preflight import FAIL, OK, Preflight, check_models, check_sglang
from ddtree_ops.profile import load_profile

PLUGIN = "0.1.0"


def report(sglang: str, *, installed: str | None = PLUGIN, family: bool = True) -> dict[str, Any]:
    return {"sglang": sglang, "ddtree-ops": installed, "parse": "ok",
            "algorithm": {"resolved": "DDTREE", "dflash": family, "dflash_family": family}}


def run(doc: dict[str, Any], mode: str = "ddtree-shadow") -> Preflight:
    pf = Preflight()
    check_sglang(pf, load_profile("ct200"), mode, (doc, ""), PLUGIN)
    return pf


def by_name(pf: Preflight, name: str) -> Any:
    return next(c for c in pf.checks if c.name == name)


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_supported_release_with_the_plugin_passes(version: str) -> None:
    pf = run(report(version))
    assert pf.ok and by_name(pf, "plugin").status == OK


def test_unsupported_release_is_refused_naming_the_releases_that_work() -> None:
    pf = run(report("0.5.24"))
    check = by_name(pf, "plugin")
    assert check.status == FAIL and not pf.ok
    assert "sglang 0.5.24 is not supported (supported: 0.5.17, 0.5.23)" in check.detail


def test_unsupported_release_does_not_matter_without_ddtree() -> None:
    pf = run(report("0.5.24"), mode="dflash")
    assert pf.ok and not [c for c in pf.checks if c.name == "plugin"]


def test_plugin_that_is_not_dflash_family_is_refused() -> None:
    check = by_name(run(report("0.5.17", family=False)), "plugin")
    assert check.status == FAIL and "not DFlash-family" in check.detail


# ------------------------------------------------------------------ the draft's captured layers

MODELS = Path(__file__).resolve().parents[2] / "bench" / "realsglang" / "models"


def draft_check(ids: Any, *, block: int = 16) -> Any:
    """Preflight's model checks on the ct200 profile with the real run's tiny target (4 layers)."""
    p = load_profile("ct200")
    target = json.loads((MODELS / "tiny-qwen3" / "config.json").read_text())
    draft = json.loads((MODELS / "tiny-qwen3-dflash" / "config.json").read_text())
    draft["block_size"] = block
    if ids is None:
        draft["dflash_config"].pop("target_layer_ids")
    else:
        draft["dflash_config"]["target_layer_ids"] = ids
    path = p.modes.dflash.draft_model_path
    files = {f"{p.service.model_path}/config.json": json.dumps(target).encode(),
             f"{path}/config.json": json.dumps(draft).encode()}
    pf = Preflight()
    check_models(pf, p, "dflash", files)
    return by_name(pf, "draft")


def test_draft_layers_the_target_captures_pass() -> None:
    check = draft_check([0, 2])
    assert check.status == OK and "[0, 2]" in check.detail


def test_draft_asking_for_the_last_layer_is_refused_before_anything_changes() -> None:
    """What real SGLang 0.5.17 did with [1, 3] on a 4-layer Qwen3: passed its own check, then died
    at the first request (tests/data/real-sglang/0.5.17/1_dflash_layers13.log)."""
    check = draft_check([1, 3])
    assert check.status == FAIL
    assert "layer 3 is the target's last layer" in check.detail and "ids must be 0..2" in check.detail


def test_draft_layer_out_of_range_and_missing_ids() -> None:
    assert draft_check([0, 7]).status == FAIL
    assert draft_check(None).status == "warn"


def test_draft_block_size_other_than_the_profiles_warns() -> None:
    """SGLang 0.5.17 and 0.5.23 only warn ('DFLASH block size mismatch') and draft the profile's
    count, so preflight warns too (issue 21: FAIL only where SGLang would die)."""
    check = draft_check([0, 2], block=8)
    assert check.status == "warn" and "block_size 8" in check.detail


# ------------------------------------------------------------------ context length against the model's


def context_check(ctx: int, *, allow: bool, rope: dict[str, Any] | None = None) -> Any:
    fix = Path(__file__).resolve().parents[2] / "ddtree_ops" / "lab" / "fixtures"
    target = json.loads((fix / "Qwen3-8B" / "config.json").read_text())  # max_position_embeddings 40960
    if rope is not None:
        target["rope_scaling"] = rope
    sets = [f"memory.context_length={ctx}", "memory.max_running_requests=1"]
    if not allow:
        sets.append("service.env={}")
    p = load_profile("ct200", overrides=sets)
    pf = Preflight()
    check_models(pf, p, "nextn", {f"{p.service.model_path}/config.json": json.dumps(target).encode(),
                                  f"{p.modes.nextn.draft_model_path}/config.json":
                                      (fix / "Qwen3-8B-NextN" / "config.json").read_bytes()})
    return next((c for c in pf.checks if c.name == "context"), None)


def test_context_past_the_model_is_refused_naming_the_key_and_both_values() -> None:
    """What 0.5.17 raises in ModelConfig at start (0.5.23's parser lets it through on a CPU box)."""
    check = context_check(50000, allow=False)
    assert check is not None and check.status == FAIL
    assert "memory.context_length 50,000 is past the model's 40,960" in check.detail
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 in service.env" in check.detail


def test_context_past_the_model_with_sglangs_override_only_warns() -> None:
    check = context_check(65536, allow=True)  # ct200 as shipped
    assert check is not None and check.status == "warn"


def test_context_within_the_model_and_rope_scaling_as_sglang_reads_it() -> None:
    assert context_check(40960, allow=False) is None
    assert context_check(131072, allow=False, rope={"rope_type": "yarn", "factor": 4.0}) is None  # 163,840
    kept = context_check(131072, allow=False, rope={"rope_type": "yarn", "factor": 4.0,
                                                    "original_max_position_embeddings": 32768})
    assert kept is not None and kept.status == FAIL  # SGLang then keeps max_position_embeddings
