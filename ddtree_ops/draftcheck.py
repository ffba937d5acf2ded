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


# ------------------------------------------------------------------ draft against target, field by field
#
# What SGLang 0.5.17 and 0.5.23 do with each field (read in both releases' sources):
# - hidden_size: neither release compares them for DFLASH or EAGLE/NEXTN. A DFlash draft runs its
#   layers on the target's embeddings and sends its output through the target's LM head
#   (`dflash_worker_v2.py`); an EAGLE draft concatenates the target's hidden state with the
#   target's embedding (`llama_eagle.py`: `fc = Linear(2 x hidden, hidden)`). A mismatch dies in a
#   matmul once the draft first runs: at its CUDA graph capture, or at the first request without
#   graphs. Real 0.5.17 on the H200, draft hidden 512 on a 256 target: 123 s into the start,
#   `mat1 and mat2 shapes cannot be multiplied (56x512 and 256x1024)` (issue 21).
# - vocab_size: never compared either; both families borrow the target's embedding and LM head
#   (`set_embed_and_head`, the DFlash worker's `lm_head`), so the server starts and drafts tokens
#   of another vocabulary: acceptance near 1.0, which the deploy gate's smoke check fails after a
#   full start. `dflash_config.mask_token_id` past the target's vocab is SGLang's own error at the
#   draft worker's start ("DFLASH mask_token_id is outside the target vocab size").
# - num_target_layers: the target runner only warns ("Draft config num_target_layers=%s differs
#   from runtime target num_hidden_layers=%s; selecting capture layers based on the runtime target
#   model", spec_aux_hidden_state.py) and the draft model resolves its own ids against its own
#   count (models/dflash.py), so a draft trained on another model serves with features it never
#   saw (or dies at load when one of its ids is past its own count).
# - block_size: both releases warn and use --speculative-num-draft-tokens ("DFLASH block size
#   mismatch: using speculative_num_draft_tokens=%s but draft config block_size=%s",
#   dflash_worker_v2.py).

DFLASH_FAMILY = ("DFLASH", "DDTREE")
EAGLE_FAMILY = ("NEXTN", "EAGLE")


@dataclass(frozen=True)
class Mismatch:
    status: str  # fail | warn
    field: str  # the config field compared
    detail: str  # both values, the profile keys, what SGLang does with it


def _int_field(cfg: dict[str, Any], name: str) -> int | None:
    value = _text_config(cfg).get(name, cfg.get(name))
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_compat(draft_cfg: dict[str, Any], target_cfg: dict[str, Any], *, algorithm: str,
                 num_draft_tokens: int | None = None, draft_key: str = "the draft",
                 target_key: str = "service.model_path", block_key: str = "the block size") -> list[Mismatch]:
    """The draft's config against the target's, the way SGLang uses each field (the notes above).
    `algorithm` picks the family (DFLASH/DDTREE, or NEXTN/EAGLE); the keys name the profile
    settings to change in each message. Pure: both config.json dicts are passed in."""
    out: list[Mismatch] = []
    dflash = algorithm in DFLASH_FAMILY
    where = f"({draft_key}; target {target_key})"
    d_hidden, t_hidden = _int_field(draft_cfg, "hidden_size"), _int_field(target_cfg, "hidden_size")
    if d_hidden is not None and t_hidden is not None and d_hidden != t_hidden:
        what = ("runs its layers on the target's embeddings and sends its output through the target's LM head"
                if dflash else "concatenates the target's hidden state with the target's embedding")
        out.append(Mismatch("fail", "hidden_size", (
            f"draft hidden_size {d_hidden} differs from the target's {t_hidden} {where}: SGLang 0.5.17 and 0.5.23 "
            f"do not compare them; the draft {what}, so the start dies once the draft first runs, at its CUDA "
            "graph capture or the first request (real 0.5.17, 512 vs 256: 123 s into the start, "
            "'mat1 and mat2 shapes cannot be multiplied (56x512 and 256x1024)')")))
    d_vocab, t_vocab = _int_field(draft_cfg, "vocab_size"), _int_field(target_cfg, "vocab_size")
    if d_vocab is not None and t_vocab is not None and d_vocab != t_vocab:
        out.append(Mismatch("fail", "vocab_size", (
            f"draft vocab_size {d_vocab} differs from the target's {t_vocab} {where}: the draft was trained on "
            "another vocabulary; SGLang does not compare them (the draft borrows the target's embedding and LM "
            "head), starts, and drafts tokens the target never accepts: acceptance near 1.0, which the gate's "
            "smoke check fails only after a full start")))
    if dflash:
        dfl = draft_cfg.get("dflash_config") if isinstance(draft_cfg.get("dflash_config"), dict) else {}
        mask = dfl.get("mask_token_id")
        if isinstance(mask, int) and not isinstance(mask, bool) and t_vocab is not None and mask >= t_vocab:
            out.append(Mismatch("fail", "mask_token_id", (
                f"dflash_config.mask_token_id {mask} is outside the target's vocab_size {t_vocab} {where}: SGLang "
                "stops at the draft worker's start with 'DFLASH mask_token_id is outside the target vocab size'")))
        trained = dfl.get("num_target_layers", draft_cfg.get("num_target_layers"))
        layers = _int_field(target_cfg, "num_hidden_layers")
        if isinstance(trained, int) and not isinstance(trained, bool) and layers is not None and trained != layers:
            ids = dfl.get("target_layer_ids", draft_cfg.get("target_layer_ids"))
            past = [i for i in ids if isinstance(i, int) and i >= trained] if isinstance(ids, list) else []
            then = (f"its own target_layer_ids {past} are past its own count, so the draft dies at load "
                    "('DFLASH target_layer_ids contains an out-of-range layer id')" if past else
                    "it serves a draft trained on another model's hidden states: acceptance collapses")
            out.append(Mismatch("fail", "num_target_layers", (
                f"the draft was trained for a {trained}-layer target (num_target_layers {trained}), the target has "
                f"{layers} layers (num_hidden_layers {layers}) {where}: SGLang only warns ('Draft config "
                f"num_target_layers={trained} differs from runtime target num_hidden_layers={layers}') and {then}")))
        block = dfl.get("block_size", draft_cfg.get("block_size"))
        if (isinstance(block, int) and not isinstance(block, bool) and num_draft_tokens is not None
                and block != num_draft_tokens):
            out.append(Mismatch("warn", "block_size", (
                f"the draft was trained with block_size {block}, {block_key} is {num_draft_tokens} "
                "(--speculative-num-draft-tokens): SGLang warns 'DFLASH block size mismatch' and drafts "
                f"{num_draft_tokens} tokens per round; positions past {block} were never trained")))
    return out


# ------------------------------------------------------------------ hidden-state capture per SGLang release
#
# A DFlash-family target model must implement `set_dflash_layers_to_capture` (SGLang's
# `configure_aux_hidden_state_capture` raises "Model X implements neither
# set_dspark_layers_to_capture nor set_dflash_layers_to_capture, one of which is required for
# DFLASH/DSPARK" early in the start otherwise), and which model classes do changes between
# releases: 0.5.17 has it in 44 registered architectures, 0.5.23 in 70 (Qwen2 and GLM-4.5 MoE in
# neither, MiMo-V2 and LFM2 only in 0.5.23). So preflight asks the host's own SGLang: this script
# runs there (stdlib only), reads the target's config.json and walks the class and its bases in
# the installed `sglang/srt/models/*.py` without importing them.

CAPTURE_SCAN = r'''
def capture_scan(models_dir, archs, methods=("set_dflash_layers_to_capture",)):
    import ast, os, re
    texts, trees = {}, {}
    for fn in sorted(os.listdir(models_dir)):
        if fn.endswith(".py"):
            with open(os.path.join(models_dir, fn), encoding="utf-8", errors="replace") as fh:
                texts[fn] = fh.read()
    def classes(name):
        pat = re.compile(r"^class\s+%s\b" % re.escape(name), re.M)
        for fn, text in texts.items():
            if not pat.search(text):
                continue
            if fn not in trees:
                try:
                    trees[fn] = ast.parse(text)
                except SyntaxError:
                    trees[fn] = None
            for node in (trees[fn].body if trees[fn] else []):
                if isinstance(node, ast.ClassDef) and node.name == name:
                    yield fn, node
    def where(name, method, seen):
        if name in seen:
            return None
        for fn, node in classes(name):
            own = set()
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    own.add(item.name)
                elif isinstance(item, ast.Assign):
                    own.update(t.id for t in item.targets if isinstance(t, ast.Name))
            if method in own:
                return "%s:%s" % (fn, name)
            for base in node.bases:
                b = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
                found = where(b, method, seen | {name}) if b else None
                if found:
                    return found
        return None
    for arch in archs:
        defined = [fn for fn, _ in classes(arch)]
        if defined:
            return {"arch": arch, "file": defined[0],
                    "methods": {m: where(arch, m, frozenset()) for m in methods}}
    return {"arch": None, "file": None, "methods": {}}
'''


@dataclass(frozen=True)
class CaptureCheck:
    status: str  # ok | fail | warn | skip
    detail: str


def judge_capture(found: dict[str, Any] | None, sglang_version: str | None, archs: list[str],
                  *, target_key: str = "service.model_path", python_key: str = "service.python") -> CaptureCheck:
    """The host scan's answer (`CAPTURE_SCAN`, run by the host's SGLang) to a verdict."""
    version = sglang_version or "?"
    if not found:
        return CaptureCheck("skip", f"sglang {version} on the host did not report its models' hidden-state capture")
    if "error" in found:
        return CaptureCheck("warn", f"could not read sglang {version}'s model files: {found['error']}")
    if not found.get("arch"):
        return CaptureCheck("warn", f"sglang {version} on the host has no model class named {archs} "
                                    f"({target_key}'s architectures): it would fall back to another implementation "
                                    "or refuse the model, and DFlash needs the target's hidden-state capture")
    method = (found.get("methods") or {}).get("set_dflash_layers_to_capture")
    arch = found["arch"]
    if not method:
        return CaptureCheck("fail", f"sglang {version} on the host has no hidden-state capture for {arch} "
                                    f"({target_key}, models/{found.get('file')}): the start stops with 'Model "
                                    f"{arch} implements neither set_dspark_layers_to_capture nor "
                                    "set_dflash_layers_to_capture'; use a target architecture this release captures, "
                                    f"or an SGLang that has it in {python_key}")
    return CaptureCheck("ok", f"sglang {version} captures {arch}'s hidden states (set_dflash_layers_to_capture in "
                              f"{method.split(':')[0]})")
