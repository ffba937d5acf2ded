"""Preflight's draft line: the draft's config against the target's, field by field as SGLang 0.5.17
and 0.5.23 use them, and whether the host's SGLang captures the target's hidden states.

The DFlash cases use the models the real H200 runs used (`bench/realsglang/models`: tiny-qwen3,
4 layers, hidden 256, vocab 1024, and its 1-layer draft); the NEXTN cases the lab's Qwen3-8B and
its EAGLE-style draft. Issue 21's real case: a DFlash draft of hidden 512 on the 256 target passed
preflight, then died 123 s into the start at the draft's CUDA graph capture.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from ddtree_ops.draftcheck import CAPTURE_SCAN, check_compat, judge_capture
from ddtree_ops.preflight import FAIL, OK, WARN, SGLANG_CHECK, Check, Preflight, check_models, check_sglang
from ddtree_ops.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "bench" / "realsglang" / "models"
FIXTURES = ROOT / "ddtree_ops" / "lab" / "fixtures"
TARGET = json.loads((MODELS / "tiny-qwen3" / "config.json").read_text())
DRAFT = json.loads((MODELS / "tiny-qwen3-dflash" / "config.json").read_text())
Q8 = json.loads((FIXTURES / "Qwen3-8B" / "config.json").read_text())
NEXTN = json.loads((FIXTURES / "Qwen3-8B-NextN" / "config.json").read_text())


def draft_line(draft: dict[str, Any], *, mode: str = "dflash", target: dict[str, Any] = TARGET,
               block: int = 8) -> Check:
    """Preflight's model checks on the ct200 profile, the draft line only."""
    p = load_profile("ct200", overrides=[f"modes.{mode}.block_size={block}"] if mode != "nextn" else [])
    path = p.mode(mode).draft_model_path
    files = {f"{p.service.model_path}/config.json": json.dumps(target).encode(),
             f"{path}/config.json": json.dumps(draft).encode()}
    pf = Preflight()
    check_models(pf, p, mode, files)
    return next(c for c in pf.checks if c.name == "draft")


def changed(base: dict[str, Any], **fields: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(base)
    cfg.update(fields)
    return cfg


# ------------------------------------------------------------------ DFlash family


@pytest.mark.parametrize("mode", ["dflash", "ddtree-shadow"])
def test_the_matching_draft_passes(mode: str) -> None:
    check = draft_line(DRAFT, mode=mode)
    assert check.status == OK, check.detail
    assert "2 captured target layers [0, 2], block 8" in check.detail and "hidden 256, vocab 1024" in check.detail


def test_issue_21_hidden_512_on_a_256_target_is_refused_naming_both_values() -> None:
    check = draft_line(changed(DRAFT, hidden_size=512))
    assert check.status == FAIL
    assert "draft hidden_size 512 differs from the target's 256" in check.detail
    assert "modes.dflash.draft_model_path" in check.detail and "service.model_path" in check.detail
    assert "CUDA graph capture" in check.detail  # where SGLang would die


def test_a_vocab_mismatch_is_refused_naming_both_values() -> None:
    check = draft_line(changed(DRAFT, vocab_size=151936))
    assert check.status == FAIL
    assert "draft vocab_size 151936 differs from the target's 1024" in check.detail
    assert "modes.dflash.draft_model_path" in check.detail


def test_a_num_target_layers_mismatch_is_refused_naming_both_values() -> None:
    check = draft_line(changed(DRAFT, num_target_layers=36), mode="ddtree-shadow")
    assert check.status == FAIL
    assert "trained for a 36-layer target (num_target_layers 36), the target has 4 layers" in check.detail
    assert "modes.ddtree-shadow.draft_model_path" in check.detail
    assert "SGLang only warns" in check.detail


def test_num_target_layers_below_its_own_ids_says_the_draft_dies_at_load() -> None:
    draft = changed(DRAFT, num_target_layers=2)  # ids [0, 2]: 2 is past a 2-layer count
    (m,) = [m for m in check_compat(draft, TARGET, algorithm="DFLASH") if m.field == "num_target_layers"]
    assert m.status == "fail" and "dies at load" in m.detail and "[2]" in m.detail


def test_a_mask_token_outside_the_target_vocab_is_refused() -> None:
    draft = copy.deepcopy(DRAFT)
    draft["dflash_config"]["mask_token_id"] = 1024
    check = draft_line(draft)
    assert check.status == FAIL and "mask_token_id 1024 is outside the target's vocab_size 1024" in check.detail


def test_a_block_size_mismatch_only_warns_as_sglang_does() -> None:
    """0.5.17 and 0.5.23 warn 'DFLASH block size mismatch' and use --speculative-num-draft-tokens."""
    check = draft_line(DRAFT, block=16)
    assert check.status == WARN
    assert "block_size 8, modes.dflash.block_size is 16" in check.detail


def test_several_mismatches_are_all_named_failures_first() -> None:
    check = draft_line(changed(DRAFT, hidden_size=512, vocab_size=2048), block=16)
    assert check.status == FAIL
    assert check.detail.index("hidden_size 512") < check.detail.index("vocab_size 2048") < check.detail.index("block_size 8")
    assert check.data["mismatches"] == ["hidden_size", "vocab_size", "block_size"]


# ------------------------------------------------------------------ EAGLE / NEXTN drafts


def test_the_lab_nextn_draft_passes() -> None:
    check = draft_line(NEXTN, mode="nextn", target=Q8)
    assert check.status == OK and "hidden 4096, vocab 151936 as the target's" in check.detail


def test_a_nextn_draft_of_another_hidden_size_is_refused() -> None:
    check = draft_line(changed(NEXTN, hidden_size=2048), mode="nextn", target=Q8)
    assert check.status == FAIL
    assert "draft hidden_size 2048 differs from the target's 4096" in check.detail
    assert "modes.nextn.draft_model_path" in check.detail
    assert "concatenates the target's hidden state" in check.detail


def test_a_multimodal_targets_text_config_is_what_is_compared() -> None:
    vl = {"architectures": ["Qwen3VLForConditionalGeneration"], "text_config": dict(TARGET)}
    assert check_compat(DRAFT, vl, algorithm="DFLASH", num_draft_tokens=8) == []
    assert [m.field for m in check_compat(changed(DRAFT, hidden_size=512), vl, algorithm="DFLASH")] == ["hidden_size"]


# ------------------------------------------------------------------ hidden-state capture of the host's SGLang


def _scan(models_dir: Path, archs: list[str]) -> dict[str, Any]:
    ns: dict[str, Any] = {}
    exec(CAPTURE_SCAN, ns)  # the very text that runs on the host
    return ns["capture_scan"](str(models_dir), archs)


def _sglang_models() -> Path:
    sglang = pytest.importorskip("sglang")
    return Path(sglang.__file__).parent / "srt" / "models"


def _models_0517(tmp_path: Path) -> Path:
    wheels = sorted((Path(sys.prefix) / "share" / "ddtree-ops" / "reference").glob("sglang-0.5.17-*.whl"))
    if not wheels:
        pytest.skip("the sglang 0.5.17 reference wheel is not in this venv")
    with zipfile.ZipFile(wheels[0]) as whl:
        for name in whl.namelist():
            if name.startswith("sglang/srt/models/") and name.endswith(".py") and name.count("/") == 3:
                whl.extract(name, tmp_path)
    return tmp_path / "sglang" / "srt" / "models"


@pytest.mark.parametrize("arch, in_0517, in_0523", [
    ("Qwen3ForCausalLM", True, True),       # what the H200 runs served
    ("Qwen3VLForConditionalGeneration", True, True),
    ("Qwen2ForCausalLM", False, False),     # no DFlash capture in either release
    ("Glm4MoeForCausalLM", False, False),
    ("MiMoV2FlashForCausalLM", False, True),  # inherited from MiMoV2ForCausalLM, added after 0.5.17
    ("Lfm2ForCausalLM", False, True),
])
def test_capture_per_release_from_sglangs_own_model_files(tmp_path: Path, arch: str, in_0517: bool,
                                                          in_0523: bool) -> None:
    for models, expected in ((_models_0517(tmp_path), in_0517), (_sglang_models(), in_0523)):
        found = _scan(models, ["NotAModel", arch])
        assert found["arch"] == arch
        assert bool(found["methods"]["set_dflash_layers_to_capture"]) is expected, (models, arch)


def test_a_release_without_capture_for_the_target_is_refused_naming_the_class() -> None:
    found = {"arch": "Qwen2ForCausalLM", "file": "qwen2.py", "methods": {"set_dflash_layers_to_capture": None},
             "architectures": ["Qwen2ForCausalLM"]}
    pf = Preflight()
    doc = {"sglang": "0.5.17", "ddtree-ops": "0.1.0", "parse": "ok", "capture": found}
    check_sglang(pf, load_profile("ct200"), "dflash", (doc, ""), "0.1.0")
    (check,) = [c for c in pf.checks if c.name == "capture"]
    assert check.status == FAIL and not pf.ok
    assert "sglang 0.5.17 on the host has no hidden-state capture for Qwen2ForCausalLM" in check.detail
    assert "implements neither set_dspark_layers_to_capture nor set_dflash_layers_to_capture" in check.detail
    # a mode that needs no capture is not judged on it
    pf = Preflight()
    check_sglang(pf, load_profile("ct200"), "nextn", (doc, ""), "0.1.0")
    assert not [c for c in pf.checks if c.name == "capture"]


def test_judge_capture_unknown_architecture_and_no_report() -> None:
    assert judge_capture({"arch": None, "file": None, "methods": {}}, "0.5.23", ["Foo"]).status == "warn"
    assert judge_capture(None, "0.5.23", []).status == "skip"
    assert judge_capture({"error": "OSError: x"}, "0.5.23", []).status == "warn"


def test_the_host_script_reports_capture_with_the_real_installed_sglang(tmp_path: Path) -> None:
    """SGLANG_CHECK as preflight runs it on a host, here against this venv's SGLang (0.5.23)."""
    _sglang_models()
    for name in ("tiny-qwen3", "tiny-qwen3-dflash"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text((MODELS / name / "config.json").read_text())
    argv = ["--model-path", str(tmp_path / "tiny-qwen3"), "--speculative-algorithm", "DFLASH",
            "--speculative-draft-model-path", str(tmp_path / "tiny-qwen3-dflash"), "--speculative-num-draft-tokens", "8"]
    res = subprocess.run([sys.executable, "-c", SGLANG_CHECK, json.dumps(argv), ""], capture_output=True, text=True,
                         timeout=240)
    doc = json.loads(res.stdout.rpartition("\x1d")[2])
    assert doc["capture"]["arch"] == "Qwen3ForCausalLM"
    assert doc["capture"]["methods"]["set_dflash_layers_to_capture"] == "qwen3.py:Qwen3ForCausalLM"
