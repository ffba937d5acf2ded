"""SGLang 0.5.23's KV-pool sizing, as the stand-in applies it (pure, stdlib only).

Mirrors `kv_cache_configurator._profile_available_bytes` and `pool_configurator.DefaultPoolConfigurator`:
    pre   = free GPU memory before weights load (after the CUDA context)
    post  = pre - target weights - draft weights           (0.5.23 counts the draft: "draft weights are
                                                              now counted")
    rest  = post - pre * (1 - mem_fraction_static)
    cell  = kv_heads x (head_dim + v_head_dim) x layers x bytes     (target)
            + cell x draft_layers / layers                           (EAGLE/NEXTN draft, same layout)
            + draft kv_heads x 2 x head_dim x draft_layers x bytes   (DFlash family: the draft's own pool)
    tokens = floor(rest / cell), page aligned, capped by --max-total-tokens
CUDA graphs are captured after the pool, out of the (1 - mfs) headroom (SGLANG_ENABLE_POST_CAPTURE_KV_SIZING
is off by default in 0.5.23), so they do not shrink the pool; a headroom too small for them fails at capture.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

GIB = 1 << 30
MIB = 1 << 20
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "fp8_e5m2": 1, "fp8_e4m3": 1,
               "bf16": 2}
TORCH_DTYPE = {2: "torch.bfloat16", 4: "torch.float32", 1: "torch.float8_e4m3fn"}
DraftKind = Literal["none", "eagle", "dflash", "custom"]


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    dtype_bytes: int
    architecture: str
    max_position: int

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> Shape:
        c = cfg.get("text_config") or cfg
        hidden, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
        dtype = str(c.get("torch_dtype") or cfg.get("torch_dtype") or c.get("dtype") or "bfloat16")
        return cls(layers=int(c["num_hidden_layers"]), hidden=hidden, heads=heads,
                   kv_heads=int(c.get("num_key_value_heads") or heads), head_dim=int(c.get("head_dim") or hidden // heads),
                   intermediate=int(c.get("intermediate_size", 4 * hidden)), vocab=int(c.get("vocab_size", 0)),
                   dtype_bytes=DTYPE_BYTES.get(dtype, 2), architecture=str((cfg.get("architectures") or ["?"])[0]),
                   max_position=int(c.get("max_position_embeddings", 4096)))

    def layer_params(self) -> int:
        attn = self.hidden * self.heads * self.head_dim * 2 + self.hidden * self.kv_heads * self.head_dim * 2
        return attn + 3 * self.hidden * self.intermediate + 2 * self.hidden + 2 * self.head_dim

    def params(self, *, embeddings: bool = True) -> int:
        emb = 2 * self.vocab * self.hidden + self.hidden if embeddings else 0
        return self.layer_params() * self.layers + emb


def target_weight_bytes(cfg: dict[str, Any], index: dict[str, Any] | None) -> int:
    """The checkpoint's own total when its index says it; else the shapes' bf16 bytes."""
    meta = (index or {}).get("metadata") or {}
    if meta.get("total_size"):
        return int(meta["total_size"])
    s = Shape.from_config(cfg)
    return s.params() * s.dtype_bytes


def draft_weight_bytes(draft_cfg: dict[str, Any], target: Shape, kind: DraftKind) -> int:
    """Draft layers (+ the fc over captured target layers for DFlash, over [emb, hidden] for EAGLE);
    embedding and LM head are shared with the target."""
    d = Shape.from_config(draft_cfg)
    fc = 0
    if kind == "dflash" or "dflash_config" in draft_cfg or "block_size" in draft_cfg:
        ids = (draft_cfg.get("dflash_config") or {}).get("target_layer_ids") or []
        fc = (len(ids) or d.layers) * target.hidden * d.hidden
    elif kind == "eagle":
        fc = 2 * target.hidden * d.hidden
    return (d.params(embeddings=False) + fc) * d.dtype_bytes


def kv_bytes(kv_cache_dtype: str, model_bytes: int) -> int:
    return model_bytes if kv_cache_dtype in ("auto", "", None) else DTYPE_BYTES.get(kv_cache_dtype, 2)


def target_cell(s: Shape, kv_dtype_bytes: int, tp: int = 1) -> int:
    heads = max(1, math.ceil(s.kv_heads / tp))  # replicated when tp > kv heads
    return heads * 2 * s.head_dim * s.layers * kv_dtype_bytes


def default_mem_fraction(gpu_mib: int, *, speculative: str | None, chunked_prefill: int | None,
                         cuda_graph_max_bs: int | None, tp: int = 1) -> float:
    """SGLang's default heuristic when --mem-fraction-static is not given (facts 7.1)."""
    if chunked_prefill is None:
        chunked_prefill = 2048 if gpu_mib < 35 * 1024 else 4096 if gpu_mib < 60 * 1024 else 8192
    if cuda_graph_max_bs is None:
        cuda_graph_max_bs = 8 if gpu_mib < 20 * 1024 else 24 if gpu_mib < 35 * 1024 else 32 if gpu_mib < 60 * 1024 else 256
    reserved = 512 + 1.5 * max(chunked_prefill, 2048) + 2 * cuda_graph_max_bs + 1024 * tp / 8
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10240)
    if speculative == "STANDALONE":
        reserved += 6144
    elif speculative and speculative != "NGRAM":
        reserved += 2048
    return round((gpu_mib - reserved) / gpu_mib, 3)


def default_chunked_prefill(gpu_mib: int) -> int:
    return 2048 if gpu_mib < 35 * 1024 else 4096 if gpu_mib < 60 * 1024 else 8192


def graph_bs(max_bs: int) -> list[int]:
    """SGLang's capture list up to max_bs: 1, 2, 4, 8, then steps of 8 (and 16 past 160)."""
    out = [b for b in (1, 2, 4) if b <= max_bs]
    b = 8
    while b <= max_bs:
        out.append(b)
        b += 8 if b < 160 else 16
    return out or [1]


def graph_bytes(s: Shape, bs: list[int], tokens_per_req: int) -> int:
    """What capturing the decode/verify graphs takes: a fixed pool plus activations per captured
    batch (an estimate in the range SGLang logs for 8B-class models: 0.3-1.5 GB)."""
    act = sum(b * tokens_per_req * (s.hidden * 2 + s.intermediate) * 2 * 4 for b in bs)
    return int(0.25 * GIB + act + len(bs) * 24 * MIB)


@dataclass(frozen=True)
class Pool:
    """Every figure the stand-in logs, in bytes unless named otherwise."""

    total: int
    others: int
    pre: int
    target_weights: int
    draft_weights: int
    mem_fraction_static: float
    slack: int
    rest: int
    cell: int
    target_cell: int
    draft_cell: int
    tokens: int
    graph: int

    @property
    def post(self) -> int:
        return self.pre - self.target_weights - self.draft_weights

    @property
    def fits(self) -> bool:
        return self.tokens > 0

    @property
    def kv_target(self) -> int:
        return self.tokens * self.target_cell

    @property
    def kv_draft(self) -> int:
        return self.tokens * self.draft_cell

    @property
    def kv_total(self) -> int:
        return self.tokens * self.cell

    @property
    def avail_after_pool(self) -> int:
        return self.post - self.kv_total

    @property
    def avail_after_graph(self) -> int:
        return self.avail_after_pool - self.graph

    @property
    def graph_fits(self) -> bool:
        # graphs and the first activations must fit beside the pool; 256 MiB is the workspace
        # SGLang's sampler and attention backend grab right after capture
        return self.avail_after_graph > 256 * MIB

def size_pool(*, total_mib: int, others_mib: int, target_cfg: dict[str, Any], target_index: dict[str, Any] | None,
              draft_cfg: dict[str, Any] | None, kind: DraftKind, mem_fraction_static: float,
              kv_cache_dtype: str = "auto", page_size: int = 1, max_total_tokens: int | None = None,
              cuda_graph: bool = True, cuda_graph_bs: list[int] | None = None, tokens_per_req: int = 1,
              tp: int = 1, context_mib: int = 512) -> Pool:
    total = total_mib * MIB
    others = others_mib * MIB
    pre = max(total - others - context_mib * MIB, 0)
    t = Shape.from_config(target_cfg)
    # one rank's share: SGLang shards the target's and the draft's layers over the TP ranks
    tw = math.ceil(target_weight_bytes(target_cfg, target_index) / tp)
    dw = math.ceil(draft_weight_bytes(draft_cfg, t, kind) / tp) if draft_cfg and kind != "none" else 0
    kvb = kv_bytes(kv_cache_dtype, t.dtype_bytes)
    tcell = target_cell(t, kvb, tp)
    extra = 0
    dcell = 0
    if draft_cfg and kind == "eagle":
        extra = int(tcell * Shape.from_config(draft_cfg).layers / t.layers)
    elif kind == "dflash":
        if draft_cfg:
            d = Shape.from_config(draft_cfg)
            dcell = max(1, math.ceil(d.kv_heads / tp)) * 2 * d.head_dim * d.layers * kvb
        else:  # SGLang's fallback when the draft's shapes are unknown
            dcell = math.ceil(tcell * 1 / t.layers)
    cell = tcell + extra + dcell
    slack = int(pre * (1 - mem_fraction_static))
    rest = pre - tw - dw - slack
    tokens = 0
    if rest > 0:
        tokens = rest // cell // page_size * page_size
        if max_total_tokens:
            tokens = min(tokens, max_total_tokens // page_size * page_size)
    graph = graph_bytes(t, cuda_graph_bs or [1], tokens_per_req) if cuda_graph and tokens > 0 else 0
    # the EAGLE draft's share of the cell is reported with the target pool (one pool, wider cell)
    return Pool(total=total, others=others, pre=pre, target_weights=tw, draft_weights=dw,
                mem_fraction_static=mem_fraction_static, slack=slack, rest=rest, cell=cell,
                target_cell=tcell + extra, draft_cell=dcell, tokens=max(tokens, 0), graph=graph)
