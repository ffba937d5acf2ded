"""What the stand-in will do, decided from the flags, the host's simulated hardware, the model files
and the injected faults: never from a scenario name. Pure, so it is tested without a lab."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from . import memory

FAULTS = ("libcuda-missing", "hang", "crash-after-ready", "slow-start", "accept-collapse")


@dataclass(frozen=True)
class Inputs:
    algorithm: Optional[str]  # as given on the command line (NEXTN, DFLASH, DDTREE, ...)
    kind: memory.DraftKind  # how the algorithm treats its draft: none | eagle | dflash | custom
    target_cfg: dict[str, Any]
    target_index: Optional[dict[str, Any]]
    draft_cfg: Optional[dict[str, Any]]
    total_mib: int
    others_mib: int
    mem_fraction_static: Optional[float]
    kv_cache_dtype: str = "auto"
    page_size: int = 1
    max_total_tokens: Optional[int] = None
    context_length: Optional[int] = None
    max_running_requests: Optional[int] = None
    chunked_prefill_size: Optional[int] = None
    max_prefill_tokens: int = 16384
    cuda_graph: bool = True
    cuda_graph_max_bs: Optional[int] = None
    num_steps: Optional[int] = None
    eagle_topk: Optional[int] = None
    num_draft_tokens: Optional[int] = None
    dflash_block_size: Optional[int] = None
    tp: int = 1
    allow_longer_context: bool = False
    faults: frozenset[str] = frozenset()


@dataclass
class Plan:
    mem_fraction_static: float
    pool: memory.Pool
    context_len: int
    derived_context_len: int
    max_running_requests: int
    chunked_prefill_size: int
    max_prefill_tokens: int
    graph_bs: list[int]
    tokens_per_req: int
    draft_window: int  # the most tokens one verify step can commit (num_draft_tokens / block size)
    accept_mean: float
    accept_spread: float
    warnings: list[str] = field(default_factory=list)
    # main: fails in the launcher before any "GPU" work (traceback, exit 1)
    # scheduler: fails in the scheduler (its traceback, then SIGQUIT -> SIGKILL of the launcher)
    failure: Optional[str] = None  # context | libcuda | not-enough-memory | graph-oom | aux-hidden
    failure_message: str = ""
    hang: bool = False
    slow_start: bool = False
    crash_after_ready: bool = False

    @property
    def speculative(self) -> bool:
        return self.draft_window > 1


def _has_layer_ids(draft_cfg: Optional[dict[str, Any]]) -> bool:
    dc = (draft_cfg or {}).get("dflash_config") or {}
    ids = dc.get("target_layer_ids", (draft_cfg or {}).get("target_layer_ids"))
    return isinstance(ids, list) and len(ids) > 0


def _is_dflash_draft(draft_cfg: Optional[dict[str, Any]]) -> bool:
    return bool(draft_cfg) and ("dflash_config" in draft_cfg or "block_size" in draft_cfg)


def _valid_layer_ids(draft_cfg: Optional[dict[str, Any]], target_layers: int) -> bool:
    dc = (draft_cfg or {}).get("dflash_config") or {}
    ids = dc.get("target_layer_ids", (draft_cfg or {}).get("target_layer_ids"))
    return _has_layer_ids(draft_cfg) and all(isinstance(i, int) and 0 <= i < target_layers for i in ids)


def plan(x: Inputs) -> Plan:
    t = memory.Shape.from_config(x.target_cfg)
    warnings: list[str] = []
    spec = x.kind != "none"

    # ---- speculative parameters, as SGLang resolves them
    window, tokens_per_req = 1, 1
    if x.kind == "eagle":
        steps, topk = x.num_steps or 3, x.eagle_topk or 1
        window = x.num_draft_tokens or steps + 1
        if topk == 1 and window != steps + 1:
            warnings.append("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                            "speculative_eagle_topk == 1")
            window = steps + 1
        tokens_per_req = window
    elif x.kind in ("dflash", "custom"):
        block = x.dflash_block_size or x.num_draft_tokens or (x.draft_cfg or {}).get("block_size")
        if block is None:
            block = 16
            warnings.append("speculative_num_draft_tokens is not set; defaulting to 16 for DFLASH.")
        window = tokens_per_req = int(block)

    # ---- sizes SGLang derives before it touches the GPU
    chunked = x.chunked_prefill_size or memory.default_chunked_prefill(x.total_mib)
    max_bs = x.cuda_graph_max_bs or (8 if x.total_mib < 20 * 1024 else 32 if x.total_mib < 60 * 1024 else 256)
    mfs = x.mem_fraction_static if x.mem_fraction_static is not None else memory.default_mem_fraction(
        x.total_mib, speculative=(x.algorithm or "").upper() or None if spec else None, chunked_prefill=chunked,
        cuda_graph_max_bs=max_bs, tp=x.tp)
    requested = x.max_running_requests
    if requested is None and spec:
        requested = 48
        warnings.append("Max running requests is reset to 48 for speculative decoding. You can override this "
                        "by explicitly setting --max-running-requests.")
    bs = memory.graph_bs(min(max_bs, requested or max_bs))
    pool = memory.size_pool(total_mib=x.total_mib, others_mib=x.others_mib, target_cfg=x.target_cfg,
                            target_index=x.target_index, draft_cfg=x.draft_cfg, kind=x.kind, mem_fraction_static=mfs,
                            kv_cache_dtype=x.kv_cache_dtype, page_size=x.page_size,
                            max_total_tokens=x.max_total_tokens, cuda_graph=x.cuda_graph, cuda_graph_bs=bs,
                            tokens_per_req=tokens_per_req, tp=x.tp)
    derived = t.max_position
    context_len = x.context_length or derived
    running = min(requested, pool.tokens // 2) if requested else max(min(int(pool.tokens / context_len * 512), 4096), 2048)
    running = min(running, max(pool.tokens // 2, 1))

    # ---- acceptance: what the draft path delivers per verify step (bonus token included)
    mean, spread = 1.0, 0.0
    if x.kind == "eagle":
        mean, spread = min(2.9, window), 0.35
    elif x.kind == "dflash":
        # without target_layer_ids the draft is conditioned on the wrong hidden states: every draft
        # token is rejected and each step commits only the bonus token
        mean, spread = (min(4.6, window), 0.6) if _valid_layer_ids(x.draft_cfg, t.layers) else (1.0, 0.0)
    elif x.kind == "custom" and not _is_dflash_draft(x.draft_cfg):
        mean, spread = min(2.0, window), 0.3
    if "accept-collapse" in x.faults:
        mean, spread = 1.0, 0.0

    p = Plan(mem_fraction_static=mfs, pool=pool, context_len=context_len, derived_context_len=derived,
             max_running_requests=running, chunked_prefill_size=chunked, max_prefill_tokens=x.max_prefill_tokens,
             graph_bs=bs if x.cuda_graph else [], tokens_per_req=tokens_per_req, draft_window=window,
             accept_mean=mean, accept_spread=spread, warnings=warnings,
             hang="hang" in x.faults, slow_start="slow-start" in x.faults,
             crash_after_ready="crash-after-ready" in x.faults)

    # ---- the first thing that fails, in the order SGLang gets there
    if context_len > derived:
        msg = (f"Warning: User-specified context_length ({context_len}) is greater than the derived context_length "
               f"({derived}). This may lead to incorrect model outputs or CUDA errors. Note that the derived "
               "context_length may differ from max_position_embeddings in the model's config.")
        if x.allow_longer_context:
            p.warnings.append(msg)
        else:
            p.failure, p.failure_message = "context", (
                msg + " To allow overriding this maximum, set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1")
            return p
    if "libcuda-missing" in x.faults:
        p.failure = "libcuda"
    elif not pool.fits:
        p.failure = "not-enough-memory"
        p.failure_message = ("Not enough memory. Please try to increase --mem-fraction-static. "
                             f"Current value: mem_fraction_static={mfs}")
    elif x.cuda_graph and not pool.graph_fits:
        p.failure = "graph-oom"
    elif x.kind == "custom" and _is_dflash_draft(x.draft_cfg):
        # a plugin algorithm that is not DFlash-family gets no hidden-state capture from the target,
        # and the DFlash draft it drives asks for it at the first prefill (the warmup request)
        p.failure = "aux-hidden"
        p.failure_message = ("DFLASH requires target aux hidden capture for prefill, but got None. "
                             "Make sure the target model has DFlash layers-to-capture configured.")
    return p
