"""What the stand-in will do, decided from the flags, the host's simulated hardware, the model files
and the injected faults: never from a scenario name. Pure, so it is tested without a lab."""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Any, Optional

from . import lines, memory

FAULTS = ("libcuda-missing", "hang", "crash-after-ready", "slow-start", "accept-collapse", "tree-mask")


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
    # what the registered algorithm answers (a plugin's spec class decides these, not its name)
    verify_for_draft: Optional[bool] = None  # supports_target_verify_for_draft(); None: as its kind
    dflash_hook: Optional[bool] = None  # its handle_server_args runs DFLASH's; None: as its kind
    prefill_graph: Optional[bool] = None  # prefill CUDA graph on; None: as cuda_graph
    cuda_graph_max_bs_prefill: Optional[int] = None
    # SGLANG_SIMULATE_ACC_LEN: SGLang forces every verify round's acceptance to this (the real runs'
    # knob for random weights: their logs say "accept len: 3.00" throughout)
    simulate_acc_len: Optional[float] = None


@dataclass
class Plan:
    mem_fraction_static: float
    pool: memory.Pool
    context_len: int
    derived_context_len: int
    max_running_requests: int
    chunked_prefill_size: int
    max_prefill_tokens: int
    graph_bs: list[int]  # decode / target-verify capture batch sizes ([] without graphs)
    tokens_per_req: int
    draft_window: int  # the most tokens one verify step can commit (num_draft_tokens / block size)
    accept_mean: float
    accept_spread: float
    warnings: list[str] = field(default_factory=list)
    # main: fails in the launcher before any "GPU" work (traceback, exit 1)
    # scheduler: fails in the scheduler (its traceback, then SIGQUIT -> SIGKILL of the launcher)
    # context | libcuda | not-enough-memory | graph-shape | graph-oom | draft-graph | hidden-dim
    failure: Optional[str] = None
    failure_message: str = ""
    hang: bool = False
    slow_start: bool = False
    crash_after_ready: bool = False
    worker: str = "none"  # the speculative worker SGLang builds: none | eagle | dflash | custom
    prefill_graph_tokens: list[int] = field(default_factory=list)  # [] when the prefill graph is off
    block: Optional[int] = None  # the verify width the graphs are captured for (None: unresolved)
    capture_layers: Optional[list[int]] = None  # the target layers SGLang captures for the draft
    draft_layer_ids: Optional[list[int]] = None  # the layers the draft expects (its context features)
    hidden_expected: int = 0  # feature width the draft's fc takes
    hidden_got: int = 0  # feature width the target hands it at the first prefill
    side_draft_cell: int = 0  # a DFlash draft pool SGLang allocates outside the budget (not family)

    @property
    def speculative(self) -> bool:
        return self.draft_window > 1


def _layer_ids(draft_cfg: Optional[dict[str, Any]]) -> Optional[list[int]]:
    """The draft's own `target_layer_ids` (dflash_config first, then top level), if it names any."""
    dc = (draft_cfg or {}).get("dflash_config") or {}
    ids = dc.get("target_layer_ids", (draft_cfg or {}).get("target_layer_ids"))
    if isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids):
        return list(ids)
    return None


def _is_dflash_draft(draft_cfg: Optional[dict[str, Any]]) -> bool:
    return bool(draft_cfg) and ("dflash_config" in draft_cfg or "block_size" in draft_cfg)


def default_layer_ids(target_layers: int, draft_layers: int) -> list[int]:
    """The capture layers SGLang picks for a DFlash draft that names none: the middle layer for a
    one-layer draft, else evenly spread from layer 1 to layer L - 3."""
    if draft_layers <= 1:
        return [target_layers // 2]
    lo, hi = 1, max(target_layers - 3, 1)
    return [int(round(lo + i * (hi - lo) / (draft_layers - 1))) for i in range(draft_layers)]


def capture_bs(speculative: bool, max_bs: int) -> list[int]:
    """0.5.17's decode capture list (dense up to 8 for speculative runs), up to `max_bs`; the
    largest batch is always captured."""
    table = lines.SPEC_DECODE_BS if speculative else lines.DECODE_BS
    out = [b for b in table if b <= max_bs]
    if not out or out[-1] != max_bs:
        out.append(max_bs)
    return out


def plan(x: Inputs) -> Plan:
    t = memory.Shape.from_config(x.target_cfg)
    warnings: list[str] = []
    spec = x.kind != "none"
    dflash_worker = x.kind == "dflash" or (x.kind == "custom" and _is_dflash_draft(x.draft_cfg))
    worker = "dflash" if dflash_worker else x.kind
    hook = x.dflash_hook if x.dflash_hook is not None else x.kind in ("dflash", "eagle")

    # ---- speculative parameters, as SGLang resolves them
    window, tokens_per_req, block = 1, 1, None
    if x.kind == "eagle":
        steps, topk = x.num_steps or 3, x.eagle_topk or 1
        window = x.num_draft_tokens or steps + 1
        if topk == 1 and window != steps + 1:
            warnings.append("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                            "speculative_eagle_topk == 1")
            window = steps + 1
        tokens_per_req = block = window
    elif x.kind in ("dflash", "custom"):
        draft_block = (x.draft_cfg or {}).get("block_size")
        # DFLASH's server-args hook fills the block size in from the draft; an algorithm without the
        # hook leaves --speculative-num-draft-tokens unset, and the graphs are sized from None
        block = x.num_draft_tokens or x.dflash_block_size or (draft_block if hook else None)
        if block is None and hook:
            block = 16
            warnings.append("speculative_num_draft_tokens is not set; defaulting to 16 for DFLASH.")
        # the DFlash worker itself falls back to the draft's block size (default 16)
        window = tokens_per_req = int(block or draft_block or 16)

    # ---- sizes SGLang derives before it touches the GPU
    chunked = x.chunked_prefill_size or memory.default_chunked_prefill(x.total_mib)
    max_bs = x.cuda_graph_max_bs or (8 if x.total_mib < 20 * 1024 else 32 if x.total_mib < 60 * 1024 else 256)
    mfs = x.mem_fraction_static if x.mem_fraction_static is not None else memory.default_mem_fraction(
        x.total_mib, speculative=(x.algorithm or "").upper() or None if spec else None, chunked_prefill=chunked,
        cuda_graph_max_bs=max_bs, tp=x.tp)
    requested = x.max_running_requests
    if requested is None and spec and hook:
        requested = 48
        warnings.append(lines.MAX_RUNNING_RESET)
    bs = capture_bs(spec, min(max_bs, requested or max_bs))
    pool = memory.size_pool(total_mib=x.total_mib, others_mib=x.others_mib, target_cfg=x.target_cfg,
                            target_index=x.target_index, draft_cfg=x.draft_cfg, kind=x.kind, mem_fraction_static=mfs,
                            kv_cache_dtype=x.kv_cache_dtype, page_size=x.page_size,
                            max_total_tokens=x.max_total_tokens, cuda_graph=x.cuda_graph, cuda_graph_bs=bs,
                            tokens_per_req=tokens_per_req, tp=x.tp)
    derived = t.max_position
    context_len = x.context_length or derived
    running = min(requested, pool.tokens // 2) if requested else max(min(int(pool.tokens / context_len * 512), 4096), 2048)
    running = min(running, max(pool.tokens // 2, 1))
    prefill_on = x.cuda_graph if x.prefill_graph is None else x.prefill_graph
    prefill_cap = x.cuda_graph_max_bs_prefill or chunked
    prefill_tokens = [n for n in lines.PREFILL_NUM_TOKENS if n <= prefill_cap] if prefill_on else []

    # ---- what the DFlash worker's draft reads from the target (Qwen3 captures before layer id + 1)
    ids = capture = None
    expected = got = side_cell = 0
    family = x.kind == "dflash"
    if dflash_worker:
        d = memory.Shape.from_config(x.draft_cfg) if x.draft_cfg else t
        ids = _layer_ids(x.draft_cfg) or default_layer_ids(t.layers, d.layers)
        expected = len(ids) * d.hidden
        if family:
            capture = ids
            seen = [i for i in ids if 0 <= i and i + 1 < t.layers]
            got = len(seen) * t.hidden if seen else t.hidden
        else:  # no capture configured: the target hands over its final hidden state
            got = t.hidden
            side_cell = max(1, -(-d.kv_heads // x.tp)) * 2 * d.head_dim * d.layers * memory.kv_bytes(
                x.kv_cache_dtype, t.dtype_bytes)

    # ---- acceptance: what the draft path delivers per verify step (bonus token included)
    mean, spread = 1.0, 0.0
    if x.kind == "eagle":
        mean, spread = min(2.9, window), 0.35
    elif dflash_worker:
        # without target_layer_ids the draft is conditioned on the wrong hidden states: every draft
        # token is rejected and each step commits only the bonus token
        mean, spread = (min(4.6, window), 0.6) if _layer_ids(x.draft_cfg) else (1.0, 0.0)
    elif x.kind == "custom":
        mean, spread = min(2.0, window), 0.3
    if x.simulate_acc_len is not None and spec:
        mean, spread = min(max(x.simulate_acc_len, 1.0), float(window)), 0.0
    if "accept-collapse" in x.faults:
        mean, spread = 1.0, 0.0

    p = Plan(mem_fraction_static=mfs, pool=pool, context_len=context_len, derived_context_len=derived,
             max_running_requests=running, chunked_prefill_size=chunked, max_prefill_tokens=x.max_prefill_tokens,
             graph_bs=bs if x.cuda_graph else [], tokens_per_req=tokens_per_req, draft_window=window,
             accept_mean=mean, accept_spread=spread, warnings=warnings,
             hang="hang" in x.faults, slow_start="slow-start" in x.faults,
             crash_after_ready="crash-after-ready" in x.faults, worker=worker, prefill_graph_tokens=prefill_tokens,
             block=block, capture_layers=capture, draft_layer_ids=ids, hidden_expected=expected, hidden_got=got,
             side_draft_cell=side_cell)

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
    verify_for_draft = x.verify_for_draft if x.verify_for_draft is not None else family
    if "libcuda-missing" in x.faults:
        p.failure = "libcuda"
    elif not pool.fits and pool.rest <= 0:
        # 0.5.17 checks the rest before sizing a pool: weights past the static budget
        minimum = 1 - pool.post / pool.pre
        p.failure, p.failure_message = "weights-leave-no-kv", lines.WEIGHTS_LEAVE_NO_KV.format(
            mfs=mfs, suggested=math.ceil(minimum * 1000) / 1000, minimum=minimum)
    elif not pool.fits:
        p.failure, p.failure_message = "not-enough-memory", lines.NOT_ENOUGH_MEMORY
    elif x.cuda_graph and spec and block is None:
        # graph setup multiplies the batch sizes by the verify width: None for an algorithm whose
        # server-args hook never set it (2_neg_plain_graph)
        p.failure, p.failure_message = "graph-shape", lines.GRAPH_TYPE_ERROR
    elif x.cuda_graph and not pool.graph_fits:
        p.failure = "graph-oom"
    elif x.cuda_graph and dflash_worker and not verify_for_draft:
        # the draft's graphs run in TARGET_VERIFY mode only for algorithms that say they support it
        # (1_neg_nonfamily_graph_layers13)
        p.failure, p.failure_message = "draft-graph", lines.DRAFT_GRAPH_ERROR
    elif dflash_worker and got != expected:
        # the first prefill hands the draft fewer features than it was trained on: an algorithm
        # without hidden capture (2_neg_nonfamily_nograph) or a layer id past the last captured
        # one (1_dflash_layers13)
        p.failure = "hidden-dim"
    return p
