"""Which target layers a DFlash draft may ask for: one pure rule for preflight and `diagnose HOST`.

SGLang's models capture a DFlash/EAGLE-3 hidden state *before* layer `id + 1` (the completed
output of layer `id`): `set_dflash_layers_to_capture` stores `[id + 1 for id in layer_ids]` in
Qwen3, Llama, DeepSeek, GLM, GPT-OSS and most other families. Layer `num_hidden_layers - 1` has
no layer after it, so it is never captured, and a draft that asks for it dies at the first
request with `DFLASH target_hidden feature dim mismatch` (real SGLang 0.5.17 on an H200,
tests/data/real-sglang/0.5.17/1_*_layers13.log). SGLang itself only checks `id < num_layers`.

No I/O: both callers read the two config.json files their own way and pass the dicts in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Families whose SGLang model class captures at the layer id itself, not before id + 1 (so the
# last layer can be captured). Everything else gets the stricter rule.
CAPTURE_AT_ID = ("BeamForCausalLM", "InklingForCausalLM")


@dataclass(frozen=True)
class LayerIdCheck:
    status: str  # ok | warn | fail | skip
    detail: str
    layer_ids: tuple[int, ...] | None = None
    num_hidden_layers: int | None = None
    highest_capturable: int | None = None  # the largest id the target captures
    bad: tuple[int, ...] = ()  # ids the target never captures

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "skip")


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    inner = cfg.get("text_config")
    return inner if isinstance(inner, dict) else cfg


def highest_capturable_layer(target_cfg: dict[str, Any]) -> int | None:
    """The largest `target_layer_ids` entry this target architecture can capture."""
    n = _text_config(target_cfg).get("num_hidden_layers")
    if not isinstance(n, int) or n <= 0:
        return None
    archs = target_cfg.get("architectures") or _text_config(target_cfg).get("architectures") or []
    at_id = any(a in CAPTURE_AT_ID for a in archs if isinstance(a, str))
    return n - 1 if at_id else n - 2


def check_target_layer_ids(draft_cfg: dict[str, Any] | None, target_cfg: dict[str, Any] | None) -> LayerIdCheck:
    """The draft's `dflash_config.target_layer_ids` against what the target captures.

    fail: not a list of ints, or an id the target never captures (negative, >= num_hidden_layers,
    or the last layer on a capture-before-next-layer architecture); warn: no ids at all (SGLang
    picks its default layers) or a draft trained for another layer count; skip: a config missing.
    """
    if draft_cfg is None or target_cfg is None:
        which = "draft" if draft_cfg is None else "target"
        return LayerIdCheck("skip", f"could not read the {which} config.json")
    n = _text_config(target_cfg).get("num_hidden_layers")
    if not isinstance(n, int) or n <= 0:
        return LayerIdCheck("skip", "target config.json has no num_hidden_layers")
    top = highest_capturable_layer(target_cfg)
    dfl = draft_cfg.get("dflash_config") if isinstance(draft_cfg.get("dflash_config"), dict) else {}
    ids = dfl.get("target_layer_ids", draft_cfg.get("target_layer_ids"))
    trained = dfl.get("num_target_layers", draft_cfg.get("num_target_layers"))
    if ids is None:
        return LayerIdCheck("warn", f"the draft config has no dflash_config.target_layer_ids: SGLang picks layers by its "
                                    f"default formula for {n} target layers and acceptance collapses if the draft was "
                                    "trained on others", num_hidden_layers=n, highest_capturable=top)
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return LayerIdCheck("fail", f"dflash_config.target_layer_ids must be a non-empty list of ints, got {ids!r}",
                            num_hidden_layers=n, highest_capturable=top)
    assert top is not None
    bad = tuple(i for i in ids if i < 0 or i > top)
    if bad:
        if any(i == n - 1 for i in bad) and top == n - 2:
            why = (f"layer {n - 1} is the target's last layer, which is never captured: SGLang captures the hidden "
                   f"state before layer id+1, so ids must be 0..{top}")
        else:
            why = f"the target's {n} layers can be captured as ids 0..{top}"
        return LayerIdCheck("fail", f"target_layer_ids {list(bad)} are outside what the target captures: {why}",
                            tuple(ids), n, top, bad)
    if isinstance(trained, int) and trained != n:
        return LayerIdCheck("warn", f"the draft was trained for a {trained}-layer target, this target has {n}",
                            tuple(ids), n, top)
    return LayerIdCheck("ok", f"{ids} inside the layers the target captures (0..{top} of {n})", tuple(ids), n, top)
