"""The DFlash draft model in plain torch, as SGLang 0.5.17 runs it, and a drafter for the engine.

What SGLang 0.5.17 does (`sglang/srt/models/dflash.py`, `speculative/dflash_worker_v2.py`):

- The target captures, for every committed token, the residual stream *before* layer `id + 1`
  for each `id` in the draft's `dflash_config.target_layer_ids` (`set_dflash_layers_to_capture`
  in `models/qwen3.py`), i.e. Hugging Face's `hidden_states[id + 1]`, and concatenates them.
- The draft projects them: `ctx = hidden_norm(fc(concat))`; in every draft layer the context's
  K/V are `k_norm(k_proj(ctx))` (rotated at the token's own position) and `v_proj(ctx)`, the same
  `ctx` for every layer (`_append_target_hidden_sequential`). Only committed tokens are in this
  context: the round's root (the bonus token) is not.
- A round drafts one block `[root, MASK, ..., MASK]` (block_size tokens) at positions
  `p .. p + block_size - 1` (p = committed length), embedded with the *target's* embedding. The
  block attends to the whole context and to itself without a causal mask (the draft layers are
  ENCODER_ONLY attention when the config has no `is_causal`). Pre-norm Qwen3 layers with per-head
  q/k RMSNorm; a final norm; the *target's* LM head over block rows 1.. gives one distribution per
  future position (depth 1..block_size - 1): the row at position p + d predicts the token there.

`DFlashDraft` holds exactly the checkpoint's weights under the names `DFlashDraftModel.load_weights`
resolves (`layers.N.self_attn.{q,k,v,o}_proj`, `q_norm`, `k_norm`, `input_layernorm`,
`post_attention_layernorm`, `mlp.{gate,up,down}_proj`, `norm`, `fc`, `hidden_norm`); it has no
embedding and no head. The same module trains (many blocks at once under a mask, in
`bench/pair/`) and drafts (one block against cached context K/V, `DFlashDrafter`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ddtree_ops.draftcheck import check_target_layer_ids
from ddtree_ops.errors import UsageError

DEFAULT_MASK_TOKEN = "<|MASK|>"           # sglang.srt.speculative.dflash_utils.DEFAULT_DFLASH_MASK_TOKEN
ARCHITECTURE = "DFlashDraftModel"


class DraftConfigError(UsageError):
    """A draft config.json that SGLang would refuse or misread, named by file and field."""


def _field(cfg: dict[str, Any], key: str, source: str, kind: type = int, inner: dict[str, Any] | None = None) -> Any:
    value = (inner or {}).get(key, cfg.get(key))
    if value is None:
        raise DraftConfigError(f"{source}: field {key!r} is missing")
    if kind is int and (not isinstance(value, int) or isinstance(value, bool)):
        raise DraftConfigError(f"{source}: field {key!r} must be an integer, got {value!r}")
    if kind is float and not isinstance(value, (int, float)):
        raise DraftConfigError(f"{source}: field {key!r} must be a number, got {value!r}")
    return value


@dataclass(frozen=True)
class DraftSpec:
    """The draft's shape and its DFlash settings, as SGLang's `parse_dflash_draft_config` reads them."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    num_target_layers: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    mask_token: str = DEFAULT_MASK_TOKEN

    @property
    def horizon(self) -> int:
        """Draft positions per round (depths 1..block_size - 1)."""
        return self.block_size - 1

    @property
    def capture_layers(self) -> tuple[int, ...]:
        """Hugging Face `hidden_states` indices of the features: SGLang captures before layer id + 1."""
        return tuple(i + 1 for i in self.target_layer_ids)

    @property
    def feature_dim(self) -> int:
        return len(self.target_layer_ids) * self.hidden_size

    @classmethod
    def from_config(cls, cfg: dict[str, Any], source: str = "draft config.json") -> "DraftSpec":
        archs = cfg.get("architectures") or []
        if ARCHITECTURE not in archs:
            raise DraftConfigError(f"{source}: architectures is {archs!r}, expected [{ARCHITECTURE!r}]")
        dfl = cfg.get("dflash_config")
        if not isinstance(dfl, dict):
            raise DraftConfigError(f"{source}: field 'dflash_config' is missing (SGLang reads target_layer_ids, "
                                   "block_size and the mask token from it)")
        ids = dfl.get("target_layer_ids", cfg.get("target_layer_ids"))
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and i >= 0 for i in ids):
            raise DraftConfigError(f"{source}: field 'dflash_config.target_layer_ids' must be a non-empty list of "
                                   f"non-negative ints, got {ids!r}")
        heads = _field(cfg, "num_attention_heads", source)
        hidden = _field(cfg, "hidden_size", source)
        rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
        theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
        if cfg.get("hidden_act", "silu") != "silu":
            raise DraftConfigError(f"{source}: field 'hidden_act' is {cfg.get('hidden_act')!r}; DFlash drafts use silu")
        spec = cls(hidden_size=hidden, num_layers=_field(cfg, "num_hidden_layers", source), num_heads=heads,
                   num_kv_heads=int(cfg.get("num_key_value_heads", heads)),
                   head_dim=int(cfg.get("head_dim", hidden // heads)),
                   intermediate_size=_field(cfg, "intermediate_size", source),
                   vocab_size=_field(cfg, "vocab_size", source),
                   block_size=_field(cfg, "block_size", source, inner=dfl),
                   target_layer_ids=tuple(ids), mask_token_id=_field(cfg, "mask_token_id", source, inner=dfl),
                   num_target_layers=_field(cfg, "num_target_layers", source, inner=dfl),
                   rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=float(theta),
                   max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                   mask_token=str(dfl.get("mask_token", DEFAULT_MASK_TOKEN)))
        if spec.block_size < 2:
            raise DraftConfigError(f"{source}: field 'dflash_config.block_size' must be >= 2, got {spec.block_size}")
        if spec.num_heads % spec.num_kv_heads:
            raise DraftConfigError(f"{source}: num_attention_heads {spec.num_heads} is not a multiple of "
                                   f"num_key_value_heads {spec.num_kv_heads}")
        return spec

    def to_config(self, transformers_version: str = "5.12.1") -> dict[str, Any]:
        """config.json in the shape SGLang 0.5.17 served (bench/realsglang/models/tiny-qwen3-dflash)."""
        return {
            "architectures": [ARCHITECTURE], "attention_bias": False, "attention_dropout": 0.0,
            "dtype": "bfloat16", "head_dim": self.head_dim, "hidden_act": "silu", "hidden_size": self.hidden_size,
            "initializer_range": 0.02, "intermediate_size": self.intermediate_size,
            "layer_types": ["full_attention"] * self.num_layers,
            "max_position_embeddings": self.max_position_embeddings, "model_type": "qwen3",
            "num_attention_heads": self.num_heads, "num_hidden_layers": self.num_layers,
            "num_key_value_heads": self.num_kv_heads, "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {"rope_theta": self.rope_theta, "rope_type": "default"},
            "sliding_window": None, "tie_word_embeddings": False, "transformers_version": transformers_version,
            "use_cache": True, "use_sliding_window": False, "vocab_size": self.vocab_size,
            "block_size": self.block_size, "num_target_layers": self.num_target_layers,
            "dflash_config": {"block_size": self.block_size, "target_layer_ids": list(self.target_layer_ids),
                              "mask_token": self.mask_token, "mask_token_id": self.mask_token_id,
                              "num_target_layers": self.num_target_layers},
        }


class RMSNorm(nn.Module):
    """Hugging Face Qwen3's RMSNorm: in float32, the weight applied after casting back."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Default (neox-style, rotate-half) RoPE tables for `positions` [..., N] -> [..., N, head_dim]."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.float().unsqueeze(-1) * inv
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, N, D]; cos/sin [B, N, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)


class DraftAttention(nn.Module):
    def __init__(self, spec: DraftSpec) -> None:
        super().__init__()
        d, h, kv, hd = spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.heads, self.kv_heads, self.head_dim, self.theta = h, kv, hd, spec.rope_theta
        self.q_proj = nn.Linear(d, h * hd, bias=False)
        self.k_proj = nn.Linear(d, kv * hd, bias=False)
        self.v_proj = nn.Linear(d, kv * hd, bias=False)
        self.o_proj = nn.Linear(h * hd, d, bias=False)
        self.q_norm = RMSNorm(hd, spec.rms_norm_eps)
        self.k_norm = RMSNorm(hd, spec.rms_norm_eps)

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of projected context features ctx [B, T, d] at positions [B, T]: [B, Hkv, T, hd] each.
        No input norm and no Q: SGLang's `kv_proj_only`, `apply_k_norm`, `apply_k_rope`."""
        b, t, _ = ctx.shape
        k = self.k_norm(self.k_proj(ctx).view(b, t, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(ctx).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope_cos_sin(positions, self.head_dim, self.theta, k.dtype)
        return apply_rope(k, cos, sin), v

    def forward(self, x: torch.Tensor, positions: torch.Tensor, ctx_k: torch.Tensor, ctx_v: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        b, n, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, n, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, n, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope_cos_sin(positions, self.head_dim, self.theta, q.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        keys, values = torch.cat([ctx_k, k], dim=2), torch.cat([ctx_v, v], dim=2)
        if self.kv_heads != self.heads:
            rep = self.heads // self.kv_heads
            keys, values = keys.repeat_interleave(rep, dim=1), values.repeat_interleave(rep, dim=1)
        # the block sees the whole context and itself with no causal order (ENCODER_ONLY in SGLang)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, self.heads * self.head_dim))


class DraftMLP(nn.Module):
    def __init__(self, spec: DraftSpec) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.up_proj = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.down_proj = nn.Linear(spec.intermediate_size, spec.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, spec: DraftSpec) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = DraftAttention(spec)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = DraftMLP(spec)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, ctx_k: torch.Tensor, ctx_v: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraft(nn.Module):
    """The checkpoint's modules under SGLang's weight names; no embedding, no LM head (the target's)."""

    def __init__(self, spec: DraftSpec) -> None:
        super().__init__()
        self.spec = spec
        self.layers = nn.ModuleList([DraftLayer(spec) for _ in range(spec.num_layers)])
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.fc = nn.Linear(spec.feature_dim, spec.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def project(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """Concatenated target features [..., K * d] -> context hidden [..., d] (SGLang's project_target_hidden)."""
        if target_hidden.shape[-1] != self.fc.in_features:
            raise ValueError(f"DFlash target features have width {target_hidden.shape[-1]}, the draft's fc expects "
                             f"{self.fc.in_features} ({len(self.spec.target_layer_ids)} layers x "
                             f"{self.spec.hidden_size}): the target captured other layers than the draft was made for")
        return self.hidden_norm(self.fc(target_hidden))

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [layer.self_attn.context_kv(ctx, positions) for layer in self.layers]

    def forward(self, block_embeds: torch.Tensor, positions: torch.Tensor,
                ctx_kv: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor | None = None) -> torch.Tensor:
        """block_embeds [B, N, d] at positions [B, N] against per-layer context K/V -> normed hidden [B, N, d].
        `mask` [B, 1, N, T + N] (True = visible) for many blocks at once; None = one block, all visible."""
        x = block_embeds
        for layer, (k, v) in zip(self.layers, ctx_kv):
            x = layer(x, positions, k, v, mask)
        return self.norm(x)

    def init_weights(self, std: float = 0.02) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)


# -- checkpoints -------------------------------------------------------------------------------

def read_config(path: Path) -> dict[str, Any]:
    file = Path(path) / "config.json"
    try:
        doc = json.loads(file.read_text())
    except FileNotFoundError:
        raise DraftConfigError(f"{path} is not a model directory (no config.json)") from None
    except json.JSONDecodeError as exc:
        raise DraftConfigError(f"{file}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(doc, dict):
        raise DraftConfigError(f"{file}: expected a JSON object")
    return doc


def save_draft(draft: DFlashDraft, path: Path, dtype: torch.dtype = torch.bfloat16,
               transformers_version: str = "5.12.1") -> None:
    """config.json + model.safetensors under the names SGLang's loader resolves."""
    from safetensors.torch import save_file  # a transformers dependency, only needed to write

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to("cpu", dtype).contiguous() for name, t in draft.state_dict().items()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(draft.spec.to_config(transformers_version), indent=2) + "\n")


def load_draft(path: Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> DFlashDraft:
    from safetensors.torch import load_file  # a transformers dependency, only needed to read

    path = Path(path)
    spec = DraftSpec.from_config(read_config(path), str(path / "config.json"))
    draft = DFlashDraft(spec)
    weights = path / "model.safetensors"
    if not weights.exists():
        raise DraftConfigError(f"{path}: no model.safetensors")
    state = load_file(str(weights))
    missing, unexpected = draft.load_state_dict(state, strict=False)
    if missing:
        raise DraftConfigError(f"{weights}: missing weights {missing[:4]}{' ...' if len(missing) > 4 else ''}")
    if unexpected:
        raise DraftConfigError(f"{weights}: unexpected weights {unexpected[:4]}{' ...' if len(unexpected) > 4 else ''}")
    return draft.to(device=device, dtype=dtype).eval()


def check_pair(spec: DraftSpec, target_cfg: dict[str, Any], source: str) -> None:
    """What SGLang needs of a target for this draft: same hidden size, the mask id inside its
    vocabulary, layer ids it captures (the project's rule: below num_hidden_layers - 1)."""

    problems = []
    if target_cfg.get("hidden_size") != spec.hidden_size:
        problems.append(f"draft hidden_size {spec.hidden_size} != target hidden_size {target_cfg.get('hidden_size')}")
    vocab = target_cfg.get("vocab_size")
    if not isinstance(vocab, int) or not 0 <= spec.mask_token_id < vocab:
        problems.append(f"mask_token_id {spec.mask_token_id} is outside the target's vocabulary ({vocab})")
    layers = check_target_layer_ids(spec.to_config(), target_cfg)
    if not layers.ok:
        problems.append(layers.detail)
    if problems:
        raise DraftConfigError(f"{source}: " + "; ".join(problems))


# -- the drafter ---------------------------------------------------------------------------------

class DFlashDrafter:
    """The engine's drafter on a trained DFlash draft and its target.

    `draft(context, hidden)`: `context` ends with the round's root; `hidden` holds the target's
    captured features of every committed token (all of `context` but the root), as the decoder
    gathers them. The context K/V are kept between rounds and only the new rows are projected,
    as SGLang materialises them into the draft's KV pool. Rows already seen are trusted to be the
    same sequence's (comparing them would cost a device sync a round): call `reset()` before each
    new sequence, as `Decoder.generate` does.
    """

    needs_hidden = True

    def __init__(self, target: Any, draft: DFlashDraft) -> None:
        self.target, self.draft_model, self.spec = target, draft, draft.spec
        self.horizon = draft.spec.horizon
        self.hidden_layers = draft.spec.capture_layers
        self.embed = target.get_input_embeddings()
        self.head = target.get_output_embeddings()
        self.vocab_size = int(self.head.weight.shape[0])
        self.device = self.head.weight.device
        self.dtype = self.head.weight.dtype
        self.reset()

    def reset(self) -> None:
        self._kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self._rows = 0

    def _extend(self, hidden: torch.Tensor) -> None:
        n = int(hidden.shape[0])
        if n < self._rows:
            self.reset()                            # a shorter context: another sequence, rebuild it
        if n == self._rows:
            return
        new = hidden[self._rows:].to(self.device, self.dtype).unsqueeze(0)
        positions = torch.arange(self._rows, n, device=self.device).unsqueeze(0)
        kv = self.draft_model.context_kv(self.draft_model.project(new), positions)
        if self._kv is None:
            self._kv = kv
        else:
            self._kv = [(torch.cat([k0, k], dim=2), torch.cat([v0, v], dim=2)) for (k0, v0), (k, v) in zip(self._kv, kv)]
        self._rows = n

    @torch.inference_mode()
    def draft(self, context: list[int], hidden: torch.Tensor | None) -> torch.Tensor:
        if hidden is None:
            raise ValueError("the DFlash drafter needs the target's hidden features (decoder hidden_layers unset?)")
        start = len(context) - 1                    # committed tokens in KV; the root is not one of them
        if int(hidden.shape[0]) != start:
            raise ValueError(f"DFlash drafter got features of {hidden.shape[0]} tokens for a context of {start} "
                             "committed tokens")
        self._extend(hidden)
        assert self._kv is not None
        block = torch.full((1, self.spec.block_size), self.spec.mask_token_id, dtype=torch.long, device=self.device)
        block[0, 0] = int(context[-1])
        positions = torch.arange(start, start + self.spec.block_size, device=self.device).unsqueeze(0)
        out = self.draft_model(self.embed(block), positions, self._kv)
        return self.head(out[0, 1:]).float()


@torch.inference_mode()
def check_capture(model: Any, target_layer_ids: tuple[int, ...]) -> None:
    """Hugging Face's `hidden_states[id + 1]` must be the residual stream entering layer id + 1,
    which is what SGLang captures. transformers releases record hidden states in their own ways
    (the GPU host runs another release than this one), so it is checked on the model at hand."""
    layers = model.model.layers
    seen: dict[int, torch.Tensor] = {}
    hooks = [layers[i + 1].register_forward_pre_hook(
        lambda m, a, kw, i=i: seen.__setitem__(i, (a[0] if a else kw["hidden_states"]).detach().clone()),
        with_kwargs=True) for i in target_layer_ids if i + 1 < len(layers)]
    try:
        device = next(model.parameters()).device
        out = model(input_ids=torch.arange(2, 10, device=device).view(1, -1), output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    for i in target_layer_ids:
        if i not in seen or not torch.equal(out.hidden_states[i + 1], seen[i]):
            raise RuntimeError(f"this transformers' hidden_states[{i + 1}] is not the input of layer {i + 1}: the "
                               "engine would hand the draft other features than SGLang captures")


def load_pair(target_dir: Path, draft_dir: Path, device: str = "cpu",
              dtype: torch.dtype = torch.float32) -> tuple[Any, Any, DFlashDrafter]:
    """(target model, tokenizer, drafter) from a trained pair's two directories."""
    # transformers (seconds): only when a pair is loaded, not when a draft's config is checked
    from ddtree_ops.engine.models import load_model

    target_dir, draft_dir = Path(target_dir), Path(draft_dir)
    spec = DraftSpec.from_config(read_config(draft_dir), str(draft_dir / "config.json"))
    check_pair(spec, read_config(target_dir), str(draft_dir / "config.json"))
    model, tok = load_model(str(target_dir), dtype=dtype, device=device)
    check_capture(model, spec.target_layer_ids)
    draft = load_draft(draft_dir, device=device, dtype=dtype)
    return model, tok, DFlashDrafter(model, draft)


def expected_chain_tau(depth_correct: torch.Tensor) -> float:
    """Mean accepted tokens per round (root included) from per-depth greedy agreement [N, L] (bool):
    1 + the length of the leading run of correct depths."""
    if depth_correct.numel() == 0:
        return math.nan
    run = torch.cumprod(depth_correct.long(), dim=1).sum(dim=1)
    return float(1.0 + run.float().mean())
