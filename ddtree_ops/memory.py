"""Will the KV pool fit? SGLang's sizing formula, predicted before anything is restarted.

facts/sglang-ddtree.md 7.1 (SGLang `_profile_available_bytes` / `profile_max_num_token`):
    KV bytes = mem_fraction_static x free_before_load - (weights loaded)
    tokens   = floor(KV bytes / cell bytes per token), page aligned
    cell     = 2 x layers x kv_heads x head_dim x bytes(kv dtype)          (standard GQA)
             + the DFlash draft's own cell for DFlash-family algorithms   (draft pool, same capacity)
The (1 - mem_fraction_static) share stays free for activations and CUDA graphs; SGLang's own
default heuristic says how much that needs, so a fraction that leaves less is flagged too.
A startup "Not enough memory" therefore needs a HIGHER fraction (or less context/concurrency);
a runtime CUDA OOM needs a LOWER one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

GIB = 1 << 30
MIB = 1 << 20
CUDA_CONTEXT_MIB = 512  # what creating the CUDA context takes before SGLang measures free memory

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "bf16": 2, "fp16": 2, "float8_e4m3fn": 1,
                "fp8_e5m2": 1, "fp8_e4m3": 1, "auto": 2}


@dataclass(frozen=True)
class ModelShape:
    layers: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    hidden: int
    vocab: int
    dtype_bytes: int
    params: int  # estimated from the shapes when no weights index is available
    architecture: str = ""
    mla_cell: int | None = None  # kv_lora_rank + qk_rope_head_dim for MLA models

    heads: int = 0  # attention (query) heads

    def cell_bytes(self, kv_dtype: str = "auto", tp: int = 1, pp: int = 1) -> int:
        """KV bytes per token on one rank: its share of the KV heads (SGLang replicates them when
        tp > KV heads: each rank then holds one) over its pipeline stage's layers."""
        b = _DTYPE_BYTES.get(kv_dtype, 2) if kv_dtype != "auto" else self.dtype_bytes
        layers = math.ceil(self.layers / pp)
        if self.mla_cell is not None:
            return self.mla_cell * layers * b
        heads = max(1, self.kv_heads // tp)
        return heads * (self.head_dim + self.v_head_dim) * layers * b


def tp_problem(shape: ModelShape, tp: int, what: str = "the model") -> str | None:
    """SGLang's own split of attention over tensor-parallel ranks (models/qwen3.py and llama.py,
    dflash.py for the draft): the query heads must divide by tp; the KV heads too when there are
    at least tp of them, else tp must divide by them (each rank then holds a replica)."""
    if tp <= 1 or shape.mla_cell is not None:
        return None
    if shape.heads and shape.heads % tp:
        return f"{what}'s {shape.heads} attention heads do not divide by tp_size {tp}"
    kv = shape.kv_heads
    if kv >= tp and kv % tp:
        return f"{what}'s {kv} KV heads do not divide by tp_size {tp}"
    if kv < tp and tp % kv:
        return f"tp_size {tp} is not a multiple of {what}'s {kv} KV heads (SGLang replicates them only that way)"
    return None


def split_of(shape: ModelShape, tp: int) -> str:
    """How the attention heads split, in words: `32 heads and 8 KV heads: 16 and 4 per rank`."""
    if shape.mla_cell is not None:
        return "MLA (one latent KV per token on every rank)"
    kv = shape.kv_heads
    per = f"{shape.heads // tp if shape.heads else '?'} and {max(1, kv // tp)} per rank"
    rep = f" (KV heads replicated: {tp // kv} ranks share each)" if kv < tp else ""
    return f"{shape.heads} heads and {kv} KV heads: {per}{rep}"


def model_shape(config: dict[str, Any], *, layers_override: int | None = None) -> ModelShape:
    """Shapes from an HF config.json (text_config for multimodal wrappers)."""
    cfg = config.get("text_config") or config
    try:
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        layers = int(layers_override or cfg["num_hidden_layers"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"config.json lacks {exc} (need hidden_size, num_attention_heads, num_hidden_layers)") from None
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    vocab = int(cfg.get("vocab_size", 0))
    inter = int(cfg.get("intermediate_size", 4 * hidden))
    dtype = str(cfg.get("torch_dtype") or config.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    mla = None
    if cfg.get("kv_lora_rank"):
        mla = int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim", 64))
    per_layer = hidden * (heads * head_dim) * 2 + hidden * (kv_heads * head_dim) * 2 + 3 * hidden * inter
    embeddings = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    archs = config.get("architectures") or [""]
    return ModelShape(layers=layers, kv_heads=kv_heads, head_dim=head_dim, v_head_dim=head_dim, hidden=hidden,
                      vocab=vocab, dtype_bytes=_DTYPE_BYTES.get(dtype, 2), params=per_layer * layers + embeddings,
                      architecture=str(archs[0]), mla_cell=mla, heads=heads)


_CONTEXT_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")


def model_context_length(cfg: dict[str, Any]) -> int | None:
    """SGLang's derived context length (`get_context_length`, 0.5.17 and 0.5.23): the first of its
    keys in the text config, times a rope-scaling factor unless the scaling is llama3's or keeps
    an original_max_position_embeddings."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    rope = text.get("rope_scaling") if isinstance(text.get("rope_scaling"), dict) else None
    factor = 1.0
    if rope and "original_max_position_embeddings" not in rope and rope.get("rope_type") != "llama3":
        factor = float(rope.get("factor", 1) or 1)
    for key in _CONTEXT_KEYS:
        if isinstance(text.get(key), (int, float)) and not isinstance(text.get(key), bool):
            return int(factor * text[key])
    return None


def weights_bytes(config: dict[str, Any], index: dict[str, Any] | None, file_bytes: int = 0) -> int:
    """Prefer the checkpoint's own total (index metadata, or the files' sizes) over an estimate."""
    if index and isinstance(index.get("metadata"), dict) and index["metadata"].get("total_size"):
        return int(index["metadata"]["total_size"])
    if file_bytes:
        return file_bytes
    shape = model_shape(config)
    return shape.params * shape.dtype_bytes


def draft_weights_bytes(draft_config: dict[str, Any], target: ModelShape) -> int:
    """A DFlash/EAGLE draft's own layers (+ DFlash's fc over the captured target layers); it shares
    the target's embedding and LM head, so those are not counted."""
    shape = model_shape(draft_config)
    per_layer = (shape.params - shape.vocab * shape.hidden * 2) // max(shape.layers, 1)
    fc = 0
    dflash = draft_config.get("dflash_config") or {}
    if dflash or "block_size" in draft_config:
        captured = len(dflash.get("target_layer_ids") or []) or shape.layers
        fc = captured * target.hidden * shape.hidden
    return (per_layer * shape.layers + fc) * shape.dtype_bytes


def sglang_reserved_mib(gpu_total_mib: int, *, speculative: bool, cuda_graph_max_bs: int,
                        chunked_prefill: int | None) -> int:
    """SGLang's default-heuristic estimate of what must stay free beyond weights and KV
    (facts 7.1): activations, CUDA graphs, workspaces."""
    if chunked_prefill is None:
        chunked_prefill = 2048 if gpu_total_mib < 35 * 1024 else 4096 if gpu_total_mib < 60 * 1024 else 8192
    reserved = 512 + 1.5 * max(chunked_prefill, 2048) + 2 * cuda_graph_max_bs + 1024 / 8
    if gpu_total_mib > 60 * 1024:
        reserved = max(reserved, 10240)
    if speculative:
        reserved += 2048
    return int(reserved)


@dataclass(frozen=True)
class MemoryPlan:
    gpu_total_mib: int
    free_before_load_gib: float  # SGLang's `pre`
    weights_gib: float
    draft_weights_gib: float
    mem_fraction_static: float
    kv_gib: float
    cell_bytes: int
    tokens: int
    needed_tokens: int
    headroom_gib: float  # (1 - mfs) x pre: activations and graphs live here
    reserve_gib: float  # what SGLang's heuristic says they need
    context_length: int
    concurrency: int
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)
    tp: int = 1  # every figure above is one rank's: weights and cells are its share
    pp: int = 1
    cards: int = 1  # the cards the free memory is the least of

    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def ranks(self) -> int:
        return self.tp * self.pp

    def _split(self) -> str:
        return f" (target {self.weights_gib:.1f} + draft {self.draft_weights_gib:.1f})" if self.draft_weights_gib else ""

    def summary(self) -> str:
        weights = self.weights_gib + self.draft_weights_gib
        if self.ranks == 1 and self.cards == 1:
            return (f"KV pool {self.tokens:,} tokens ({self.kv_gib:.1f} GiB at {self.cell_bytes / 1024:.0f} KiB/token) "
                    f"= {self.mem_fraction_static:g} x {self.free_before_load_gib:.1f} GiB free (the card's free "
                    f"memory less {CUDA_CONTEXT_MIB} MiB of CUDA context) - {weights:.1f} GiB weights"
                    f"{self._split()}; needs {self.context_length:,} x {self.concurrency} = {self.needed_tokens:,}")
        split = " x ".join(f"{k} {v}" for k, v in (("tp", self.tp), ("pp", self.pp)) if v > 1) or "1 rank"
        least = f" (the least of {self.cards} cards)" if self.cards > 1 else ""
        return (f"per rank ({split}): KV pool {self.tokens:,} tokens ({self.kv_gib:.1f} GiB at "
                f"{self.cell_bytes / 1024:.0f} KiB/token) = {self.mem_fraction_static:g} x "
                f"{self.free_before_load_gib:.1f} GiB free{least} - {weights:.1f} GiB weights "
                f"({weights * self.ranks:.1f} GiB / {self.ranks}); needs "
                f"{self.context_length:,} x {self.concurrency} = {self.needed_tokens:,}")


def plan(*, gpu_total_mib: int, free_mib: int, target: ModelShape, weights: int, draft_cell: int = 0,
         draft_weights: int = 0, mem_fraction_static: float, context_length: int, concurrency: int,
         kv_cache_dtype: str = "auto", page_size: int = 1, speculative: bool = True,
         cuda_graph_max_bs: int = 8, chunked_prefill: int | None = None, tp: int = 1, pp: int = 1,
         cards: int = 1) -> MemoryPlan:
    """One rank's budget. `free_mib` is the LEAST free memory over the service's cards (SGLang
    takes the minimum across ranks before sizing: get_available_gpu_memory(distributed=True));
    `weights`, `draft_weights` and `draft_cell` are whole-model figures, split here as SGLang
    splits them: weights over tp x pp ranks, the draft's over tp (it runs on every TP rank, its
    layers tensor-parallel), KV cells by each rank's share of the KV heads and layers."""
    pre = max(free_mib - CUDA_CONTEXT_MIB, 0) * MIB
    weights = math.ceil(weights / (tp * pp))
    draft_weights = math.ceil(draft_weights / tp)
    loaded = weights + draft_weights
    cell = target.cell_bytes(kv_cache_dtype, tp, pp) + draft_cell
    kv = mem_fraction_static * pre - loaded
    tokens = max(0, int(kv // cell) // page_size * page_size) if kv > 0 else 0
    needed = context_length * concurrency
    headroom = (1 - mem_fraction_static) * pre
    reserve = sglang_reserved_mib(gpu_total_mib, speculative=speculative, cuda_graph_max_bs=cuda_graph_max_bs,
                                  chunked_prefill=chunked_prefill) * MIB
    problems: list[str] = []
    warnings: list[str] = []
    if tokens <= 0:
        problems.append(f"weights ({loaded / GIB:.1f} GiB) exceed mem_fraction_static x free memory "
                        f"({mem_fraction_static:g} x {pre / GIB:.1f} GiB): SGLang would stop with "
                        "'Not enough memory. Please try to increase --mem-fraction-static.'")
    elif tokens < needed:
        problems.append(f"the KV pool holds {tokens:,} tokens but {context_length:,} context x "
                        f"{concurrency} requests need {needed:,}")
    if headroom < reserve:
        warnings.append(f"mem_fraction_static {mem_fraction_static:g} leaves {headroom / GIB:.1f} GiB for "
                        f"activations and CUDA graphs; SGLang's own heuristic reserves {reserve / GIB:.1f} GiB "
                        "here: expect CUDA out of memory at graph capture or the first long prefill")
    result = MemoryPlan(
        gpu_total_mib=gpu_total_mib, free_before_load_gib=pre / GIB, weights_gib=weights / GIB,
        draft_weights_gib=draft_weights / GIB, mem_fraction_static=mem_fraction_static,
        kv_gib=max(kv, 0) / GIB, cell_bytes=cell, tokens=tokens, needed_tokens=needed,
        headroom_gib=headroom / GIB, reserve_gib=reserve / GIB, context_length=context_length,
        concurrency=concurrency, problems=problems, warnings=warnings, tp=tp, pp=pp, cards=cards)
    result.suggestions.extend(_suggest(result, pre, loaded, page_size))
    return result


def plan_from_configs(target_cfg: dict[str, Any], *, index: dict[str, Any] | None = None,
                      draft_cfg: dict[str, Any] | None = None, gpu_total_mib: int, free_mib: int,
                      mem_fraction_static: float, context_length: int = 1, concurrency: int = 1,
                      kv_cache_dtype: str = "auto", page_size: int = 1, tp: int = 1, pp: int = 1, cards: int = 1,
                      cuda_graph_max_bs: int = 8, chunked_prefill: int | None = None) -> MemoryPlan:
    """`plan` from the config.json files themselves, as preflight derives its inputs from them
    (the weights from the checkpoint index when there is one, the draft's cell at this tp): what
    bench/memory_table.py and the probe test predict SGLang's pool from."""
    target = model_shape(target_cfg)
    draft = model_shape(draft_cfg) if draft_cfg else None
    return plan(gpu_total_mib=gpu_total_mib, free_mib=free_mib, target=target, weights=weights_bytes(target_cfg, index),
                draft_cell=draft.cell_bytes(kv_cache_dtype, tp) if draft else 0,
                draft_weights=draft_weights_bytes(draft_cfg, target) if draft_cfg else 0,
                mem_fraction_static=mem_fraction_static, context_length=context_length, concurrency=concurrency,
                kv_cache_dtype=kv_cache_dtype, page_size=page_size, speculative=draft_cfg is not None,
                cuda_graph_max_bs=cuda_graph_max_bs, chunked_prefill=chunked_prefill, tp=tp, pp=pp, cards=cards)


def _suggest(p: MemoryPlan, pre: float, loaded: int, page_size: int) -> list[str]:
    """Settings that would fit, each changing one thing."""
    if p.fits:
        return []
    out: list[str] = []
    if p.tokens > 0:
        ctx = (p.tokens // p.concurrency) // 1024 * 1024
        if ctx >= 1024:
            out.append(f"memory.context_length={ctx} (at {p.concurrency} requests)")
        conc = p.tokens // p.context_length
        if conc >= 1:
            out.append(f"memory.max_running_requests={conc} (at {p.context_length} context)")
    need_bytes = p.needed_tokens * p.cell_bytes + loaded
    mfs = math.ceil(need_bytes / pre * 100) / 100 if pre else 1.0
    max_safe = 1 - (p.reserve_gib * GIB) / pre if pre else 0
    if mfs < 1:
        note = "" if mfs <= max_safe else f" (leaves less than SGLang's {p.reserve_gib:.1f} GiB runtime reserve)"
        out.append(f"memory.mem_fraction_static={mfs:.2f}{note}")
    return out


def smallest_fitting_tp(fits_at: Any, valid: Any, start: int, limit: int = 16) -> int | None:
    """The smallest tensor-parallel size above `start` (and at most `limit`) that SGLang accepts for
    the model (`valid(tp)`) and at which the plan fits (`fits_at(tp)`), or None."""
    for tp in range(start + 1, limit + 1):
        if valid(tp) and fits_at(tp):
            return tp
    return None
