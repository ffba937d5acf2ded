"""The one rule preflight and `diagnose HOST` share: which target layers a DFlash draft may ask for."""

from __future__ import annotations

import pytest

from ddtree_ops.draftcheck import check_target_layer_ids, highest_capturable_layer

QWEN3_4 = {"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 4}


def _draft(ids: object) -> dict[str, object]:
    return {"architectures": ["DFlashDraftModel"], "dflash_config": {"target_layer_ids": ids}}


@pytest.mark.parametrize("ids, status, bad", [
    ([0, 2], "ok", ()),  # what worked on the H200
    ([1, 3], "fail", (3,)),  # what died at the first prefill: 3 is the last layer
    ([0, 4], "fail", (4,)),  # beyond the target (SGLang's own check catches only this one)
    ([-1, 1], "fail", (-1,)),
])
def test_qwen3_captures_before_the_next_layer(ids: list[int], status: str, bad: tuple[int, ...]) -> None:
    res = check_target_layer_ids(_draft(ids), QWEN3_4)
    assert (res.status, res.bad, res.highest_capturable) == (status, bad, 2)
    if 3 in bad:
        assert "last layer" in res.detail and "never captured" in res.detail


def test_malformed_and_missing_ids() -> None:
    assert check_target_layer_ids(_draft("0,2"), QWEN3_4).status == "fail"
    assert check_target_layer_ids(_draft([True, 2]), QWEN3_4).status == "fail"
    assert check_target_layer_ids({"dflash_config": {}}, QWEN3_4).status == "warn"
    assert check_target_layer_ids(None, QWEN3_4).status == "skip"
    assert check_target_layer_ids(_draft([0]), {"architectures": ["X"]}).status == "skip"


def test_multimodal_text_config_and_trained_layer_count() -> None:
    vl = {"architectures": ["Qwen3VLForConditionalGeneration"], "text_config": {"num_hidden_layers": 36}}
    assert highest_capturable_layer(vl) == 34
    res = check_target_layer_ids({"dflash_config": {"target_layer_ids": [1, 9, 17, 25, 33], "num_target_layers": 28}}, vl)
    assert res.status == "warn" and "28-layer" in res.detail


def test_an_architecture_that_captures_at_the_id_may_use_its_last_layer() -> None:
    assert check_target_layer_ids(_draft([0, 3]), {"architectures": ["BeamForCausalLM"], "num_hidden_layers": 4}).status == "ok"
