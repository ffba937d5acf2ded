"""The engine's DFlash draft: its forward against an independent, literal reading of SGLang 0.5.17's
(`models/dflash.py`, `dflash_worker_v2.py`), the training path against the drafting path, the
target-feature capture against SGLang's "before layer id + 1", and the checkpoint against
SGLang 0.5.17's own `DFlashDraftModel.load_weights`."""

from __future__ import annotations

import ast
import importlib
import json
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from ddtree_ops.engine.dflash import (DFlashDraft, DFlashDrafter, DraftConfigError, DraftSpec, check_pair,
                                      load_draft, save_draft)

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]


def spec(**kw: Any) -> DraftSpec:
    base = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=96,
                vocab_size=96, block_size=6, target_layer_ids=(0, 1), mask_token_id=95, num_target_layers=3)
    base.update(kw)
    return DraftSpec(**base)


@pytest.fixture(scope="module")
def target() -> Any:
    from ddtree_ops.engine.models import tiny_llama

    return tiny_llama(vocab_size=96, hidden=64, layers=3, seed=11)


@pytest.fixture(scope="module")
def draft() -> DFlashDraft:
    torch.manual_seed(5)
    d = DFlashDraft(spec())
    d.init_weights(std=0.08)
    for name, p in d.named_parameters():         # norms away from 1, so a skipped norm shows
        if "norm" in name:
            p.data.uniform_(0.5, 1.5)
    return d.eval()


# -- an independent reading of SGLang's draft forward ------------------------------------------

def _rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def _rope(x: torch.Tensor, pos: int, theta: float = 10000.0) -> torch.Tensor:
    """Rotate-half RoPE of one vector per head, x [H, D], dimension pair (i, i + D/2) by pos * theta^(-2i/D)."""
    d = x.shape[-1]
    out = x.clone()
    for i in range(d // 2):
        ang = pos * theta ** (-2 * i / d)
        c, s = torch.cos(torch.tensor(ang)), torch.sin(torch.tensor(ang))
        out[..., i] = x[..., i] * c - x[..., i + d // 2] * s
        out[..., i + d // 2] = x[..., i + d // 2] * c + x[..., i] * s
    return out


def reference_block(draft: DFlashDraft, target: Any, feats: torch.Tensor, root: int, start: int) -> torch.Tensor:
    """Draft logits [b-1, V] for the block [root, MASK...] at positions start.., against the
    committed context features feats[:start]; token by token, from the checkpoint's tensors."""
    sp, w = draft.spec, {k: v.double() for k, v in draft.state_dict().items()}
    emb = target.get_input_embeddings().weight.double()
    head = target.get_output_embeddings().weight.double()
    hd, rep = sp.head_dim, sp.num_heads // sp.num_kv_heads
    ctx = _rms(feats[:start].double() @ w["fc.weight"].T, w["hidden_norm.weight"])     # [start, d]
    block = [root] + [sp.mask_token_id] * (sp.block_size - 1)
    x = emb[block]                                                                       # [b, d]
    for i in range(sp.num_layers):
        p = f"layers.{i}."
        h = _rms(x, w[p + "input_layernorm.weight"])
        keys, vals = [], []
        for j in range(start):            # context: k_norm(k_proj(ctx)) roped at j, v_proj(ctx); no input norm
            k = _rms((ctx[j] @ w[p + "self_attn.k_proj.weight"].T).view(-1, hd), w[p + "self_attn.k_norm.weight"])
            keys.append(_rope(k, j))
            vals.append((ctx[j] @ w[p + "self_attn.v_proj.weight"].T).view(-1, hd))
        for j in range(sp.block_size):
            k = _rms((h[j] @ w[p + "self_attn.k_proj.weight"].T).view(-1, hd), w[p + "self_attn.k_norm.weight"])
            keys.append(_rope(k, start + j))
            vals.append((h[j] @ w[p + "self_attn.v_proj.weight"].T).view(-1, hd))
        K, V = torch.stack(keys), torch.stack(vals)                                      # [n, Hkv, hd]
        attn = torch.zeros(sp.block_size, sp.num_heads * hd, dtype=torch.float64)
        for j in range(sp.block_size):    # every block row sees every key: no causal order inside the block
            q = _rope(_rms((h[j] @ w[p + "self_attn.q_proj.weight"].T).view(-1, hd), w[p + "self_attn.q_norm.weight"]),
                      start + j)
            for head_i in range(sp.num_heads):
                g = head_i // rep
                a = torch.softmax(K[:, g] @ q[head_i] / hd ** 0.5, dim=0)
                attn[j, head_i * hd:(head_i + 1) * hd] = a @ V[:, g]
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        h = _rms(x, w[p + "post_attention_layernorm.weight"])
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    return (_rms(x, w["norm.weight"]) @ head.T)[1:]


def captured(target: Any, ids: list[int], layers: tuple[int, ...]) -> torch.Tensor:
    """SGLang's capture, taken literally: the residual stream entering layer id + 1."""
    seen: dict[int, torch.Tensor] = {}
    hooks = [target.model.layers[i + 1].register_forward_pre_hook(
        lambda m, a, kw, i=i: seen.__setitem__(i, (a[0] if a else kw["hidden_states"])[0].detach().clone()),
        with_kwargs=True) for i in layers]
    try:
        with torch.no_grad():
            target(input_ids=torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    return torch.cat([seen[i] for i in layers], dim=-1)


CONTEXT = [5, 17, 42, 8, 5, 17, 42, 9, 61, 5, 17, 30, 2]


def test_capture_layers_are_the_inputs_of_layer_id_plus_one(target, draft) -> None:
    """The features the engine hands the draft (hidden_states[id + 1] of the verify forward) are
    the residual stream before layer id + 1: what SGLang's Qwen3/Llama capture."""
    from ddtree_ops.engine.verify import forward

    _, _, hidden = forward(target, torch.tensor(CONTEXT), torch.arange(len(CONTEXT)), None,
                           hidden_layers=draft.spec.capture_layers)
    torch.testing.assert_close(hidden, captured(target, CONTEXT, draft.spec.target_layer_ids))


@pytest.mark.parametrize("start", [1, 7, 12])
def test_drafter_matches_the_literal_reading(target, draft, start: int) -> None:
    feats = captured(target, CONTEXT, draft.spec.target_layer_ids)
    drafter = DFlashDrafter(target, draft)
    got = drafter.draft(CONTEXT[:start + 1], feats[:start])
    want = reference_block(draft, target, feats, CONTEXT[start], start)
    assert got.shape == (draft.spec.horizon, 96)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_context_grows_across_rounds_as_if_built_at_once(target, draft) -> None:
    """Rows are projected once and kept; a round after several must equal a fresh drafter."""
    feats = captured(target, CONTEXT, draft.spec.target_layer_ids)
    kept = DFlashDrafter(target, draft)
    for start in (2, 3, 7, 11):
        kept.draft(CONTEXT[:start + 1], feats[:start])
    fresh = DFlashDrafter(target, draft)
    torch.testing.assert_close(kept.draft(CONTEXT[:13], feats[:12]), fresh.draft(CONTEXT[:13], feats[:12]))
    # a shorter context is another sequence, even without reset(): rebuilt, not appended to
    torch.testing.assert_close(kept.draft(CONTEXT[:5], feats[:4]), fresh.draft(CONTEXT[:5], feats[:4]),
                               rtol=1e-5, atol=1e-5)


def test_drafter_refuses_features_of_another_length(target, draft) -> None:
    feats = captured(target, CONTEXT, draft.spec.target_layer_ids)
    with pytest.raises(ValueError, match="features of 5 tokens"):
        DFlashDrafter(target, draft).draft(CONTEXT[:4], feats[:5])
    with pytest.raises(ValueError, match="width"):
        DFlashDrafter(target, draft).draft(CONTEXT[:4], feats[:3, :64])


def _pair_module(name: str) -> Any:
    """A bench/pair module under its plain name: the scripts import each other that way."""
    here = str(REPO / "bench" / "pair")
    if here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module(name)


def test_training_blocks_equal_drafting_blocks(target, draft) -> None:
    """The training forward (many anchored blocks at once under a mask) gives each block exactly
    what the drafter gives it alone: the objective trains the model that drafts."""
    dt = _pair_module("draft_train")
    seqs = torch.tensor([CONTEXT, list(reversed(CONTEXT))])
    feats = dt.features(target, seqs, draft.spec, "cpu")
    anchors = torch.tensor([[2, 5, 9], [1, 6, 7]])
    logits, labels, valid = dt.block_logits(draft, target, seqs, feats, anchors, "cpu")
    for b in range(2):
        for j, a in enumerate(anchors[b].tolist()):
            want = reference_block(draft, target, feats[b], int(seqs[b, a]), a)
            torch.testing.assert_close(logits[b, j].double(), want, rtol=1e-4, atol=1e-4)
            n = min(draft.spec.horizon, len(CONTEXT) - 1 - a)
            assert labels[b, j, :n].tolist() == seqs[b, a + 1:a + 1 + n].tolist()
            assert valid[b, j].tolist() == [k < n for k in range(draft.spec.horizon)]


def test_spec_round_trips_and_refuses_bad_configs(tmp_path, draft) -> None:
    save_draft(draft, tmp_path / "d", dtype=torch.float32)
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert DraftSpec.from_config(cfg) == draft.spec
    again = load_draft(tmp_path / "d")
    for (n, a), (m, b) in zip(draft.state_dict().items(), again.state_dict().items()):
        assert n == m and torch.equal(a, b)
    for mutate, field in [(lambda c: c.pop("dflash_config"), "dflash_config"),
                          (lambda c: c["dflash_config"].update(target_layer_ids="0,1"), "target_layer_ids"),
                          (lambda c: c["dflash_config"].pop("mask_token_id"), "mask_token_id"),
                          (lambda c: c.update(architectures=["Qwen3ForCausalLM"]), "architectures"),
                          (lambda c: c.update(num_hidden_layers="2"), "num_hidden_layers")]:
        bad = json.loads(json.dumps(cfg))
        mutate(bad)
        with pytest.raises(DraftConfigError, match=field):
            DraftSpec.from_config(bad, "x/config.json")


def test_check_pair_names_what_sglang_would_trip_on() -> None:
    target_cfg = {"hidden_size": 64, "vocab_size": 96, "num_hidden_layers": 3, "architectures": ["Qwen3ForCausalLM"]}
    check_pair(spec(), target_cfg, "d")
    with pytest.raises(DraftConfigError, match="last layer"):
        check_pair(spec(target_layer_ids=(0, 2)), target_cfg, "d")       # 2 = the last of 3: never captured
    with pytest.raises(DraftConfigError, match="hidden_size"):
        check_pair(spec(), {**target_cfg, "hidden_size": 128}, "d")
    with pytest.raises(DraftConfigError, match="mask_token_id"):
        check_pair(spec(mask_token_id=96), target_cfg, "d")


# -- the checkpoint through SGLang 0.5.17's own loader -------------------------------------------

def _sglang_0517_source() -> str:
    from ddtree_ops.engine.sglang_settings import reference_wheel

    wheel = reference_wheel("0.5.17")
    if wheel is None:
        pytest.skip("the sglang 0.5.17 reference wheel is not installed (make install keeps it)")
    with zipfile.ZipFile(wheel) as z:
        return z.read("sglang/srt/models/dflash.py").decode()


def _sglang_param_names(src: str, n_layers: int) -> set[str]:
    """DFlashDraftModel's parameter names, from the module attributes its __init__s assign
    (a class from sglang.srt.layers that holds weights: *Linear, RMSNorm; nn.Linear)."""
    tree = ast.parse(src)
    classes = {c.name: c for c in tree.body if isinstance(c, ast.ClassDef)}

    def attrs(cls: str) -> dict[str, str]:
        init = next(f for f in classes[cls].body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
        out = {}
        for node in ast.walk(init):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                t = node.targets[0]
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    f = node.value.func
                    out[t.attr] = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        return out

    weighted = lambda kind: kind.endswith("Linear") or kind == "RMSNorm"   # noqa: E731
    names = {f"{a}.weight" for a, k in attrs("DFlashDraftModel").items() if weighted(k)}
    layer = attrs("DFlashDecoderLayer")
    assert layer.get("mlp") == "DFlashMLP" and "self_attn" in layer
    per_layer = {f"{a}.weight" for a, k in layer.items() if weighted(k)}
    per_layer |= {f"self_attn.{a}.weight" for a, k in attrs("DFlashAttention").items() if weighted(k)}
    per_layer |= {f"mlp.{a}.weight" for a, k in attrs("DFlashMLP").items() if weighted(k)}
    return names | {f"layers.{i}.{n}" for i in range(n_layers) for n in per_layer}


def test_checkpoint_loads_through_sglang_0517_load_weights(tmp_path, draft) -> None:
    """Run SGLang 0.5.17's `DFlashDraftModel.load_weights` itself (its source from the wheel) over
    the names and shapes the engine saves: every SGLang parameter is loaded, q/k/v and gate/up into
    their fused shards, and no saved tensor is ignored."""
    from safetensors.torch import load_file

    src = _sglang_0517_source()
    tree = ast.parse(src)
    cls = next(c for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "DFlashDraftModel")
    fn = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "load_weights")
    fn.decorator_list = []
    module = ast.Module(body=[fn], type_ignores=[])
    loaded: list[tuple[str, Any, tuple[int, ...]]] = []

    def default_weight_loader(param: Any, w: torch.Tensor, shard: Any = None) -> None:
        loaded.append((param.name, shard, tuple(w.shape)))

    scope: dict[str, Any] = {"Iterable": Any, "Tuple": Any, "Optional": Any, "torch": torch,
                             "default_weight_loader": default_weight_loader}
    exec(compile(module, "sglang/srt/models/dflash.py", "exec"), scope)

    class Param:
        def __init__(self, name: str) -> None:
            self.name, self.shape = name, (0,)

    names = _sglang_param_names(src, draft.spec.num_layers)
    save_draft(draft, tmp_path / "d", dtype=torch.float32)
    weights = load_file(str(tmp_path / "d" / "model.safetensors"))
    params = {n: Param(n) for n in names}
    params["fc.weight"].shape = tuple(weights["fc.weight"].shape)   # SGLang checks fc's shape against K * d
    fake = SimpleNamespace(named_parameters=lambda: list(params.items()), num_context_features=2,
                           config=SimpleNamespace(hidden_size=64))
    scope["load_weights"](fake, list(weights.items()))
    got = {(n, s) for n, s, _ in loaded}
    assert {n for n, _ in got} == names                                   # every SGLang parameter filled
    assert len(loaded) == len(weights)                                    # every saved tensor used
    for i in range(draft.spec.num_layers):
        p = f"layers.{i}."
        assert {s for n, s in got if n == p + "self_attn.qkv_proj.weight"} == {"q", "k", "v"}
        assert {s for n, s in got if n == p + "mlp.gate_up_proj.weight"} == {0, 1}


def test_check_capture_refuses_a_transformers_that_records_hidden_states_elsewhere(target) -> None:
    """load_pair and train.py check, on the model at hand, that hidden_states[id + 1] is what SGLang
    captures; a release that recorded, say, each layer's output one index earlier is refused."""
    from ddtree_ops.engine.dflash import check_capture

    check_capture(target, (0, 1))

    class Shifted(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner, self.model = inner, inner.model

        def forward(self, **kw: Any) -> Any:
            out = self.inner(**kw)
            out.hidden_states = tuple(out.hidden_states[1:]) + (out.hidden_states[-1],)
            return out

    with pytest.raises(RuntimeError, match="not the input of layer"):
        check_capture(Shifted(target), (0, 1))


def _cli(*args: str) -> Any:
    import os
    import subprocess

    return subprocess.run([sys.executable, "-m", "ddtree_ops", "engine", "verify", *args], capture_output=True,
                          text=True, timeout=300, cwd=REPO, env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)})


def test_engine_verify_pair_options_are_checked_before_anything_loads(tmp_path, draft) -> None:
    save_draft(draft, tmp_path / "draft", dtype=torch.float32)
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text("{}")
    cases = [
        (["--draft", str(tmp_path / "draft")], "--draft needs --target PATH"),
        (["--target", str(tmp_path / "target"), "--draft", str(tmp_path / "nowhere")], "not a directory holding config.json"),
        (["--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"), "--device", "tpu"],
         "--device must be cpu or cuda"),
        (["--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"), "--horizon", "9"],
         "drafts 5 positions a round"),
    ]
    if not torch.cuda.is_available():
        cases.append((["--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"), "--device", "cuda"],
                      "torch sees no CUDA device"))
    for args, needle in cases:
        proc = _cli(*args)
        assert proc.returncode == 64 and needle in proc.stderr and proc.stdout == "", (args, proc.stderr)
    cfg = json.loads((tmp_path / "draft" / "config.json").read_text())
    del cfg["dflash_config"]["target_layer_ids"]
    (tmp_path / "draft" / "config.json").write_text(json.dumps(cfg))
    proc = _cli("--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"))
    assert proc.returncode == 64 and "config.json: field 'dflash_config.target_layer_ids'" in proc.stderr, proc.stderr


def test_decoder_resets_the_drafter_between_sequences(target, draft) -> None:
    """The drafter keeps a sequence's context K/V between rounds; the decoder must start each
    sequence afresh, or a longer second prompt would be drafted against the first one's rows."""
    from ddtree_ops.engine.decoder import Decoder

    class Recording(DFlashDrafter):
        def __init__(self, *a: Any) -> None:
            super().__init__(*a)
            self.seen: list[torch.Tensor] = []

        def draft(self, context: list[int], hidden: torch.Tensor | None) -> torch.Tensor:
            out = super().draft(context, hidden)
            self.seen.append(out)
            return out

    used = Recording(target, draft)
    Decoder(target, used, budget=8).generate(CONTEXT[:3], 4, "chain")
    used.seen.clear()
    Decoder(target, used, budget=8).generate(CONTEXT, 4, "chain")
    fresh = Recording(target, draft)
    Decoder(target, fresh, budget=8).generate(CONTEXT, 4, "chain")
    assert len(used.seen) == len(fresh.seen) > 0
    for a, b in zip(used.seen, fresh.seen):
        torch.testing.assert_close(a, b)
