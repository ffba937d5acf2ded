"""ddtree-ops LAB STAND-IN: SGLang's start-up phases, in order, with what each prints and holds.

    distributed   torch distributed init (several nodes: the rendezvous, `nodes.py`)
    weights       the target's weights, then the draft worker's (DFlash: its runner's lines)
    kv_pools      the KV pools, sized with SGLang's formula (`behaviour.py`, `memory.py`)
    graphs        CUDA graph captures out of the headroom the pools leave; the ddtree shadow's set-up
    ready_lines   the summary lines SGLang prints before its HTTP server starts

A phase where the plan (or an injected fault) says SGLang fails ends in the scheduler's crash with
SGLang's traceback (`faults.py`). Waits are compressed: a start takes seconds.
"""

from __future__ import annotations

import asyncio
import sys
import time

from . import STANDIN_LABEL, behaviour, lines, memory, nodes, shadow, simgpu, sglog
from .faults import graph_oom, libcuda_traceback, rank_oom, traceback_text
from .faults import seconds as fault_seconds
from .scheduler import GB, Scheduler


async def distributed(s: Scheduler) -> int:
    """torch distributed: the CUDA context on every local card; returns the bytes used."""
    ctx = simgpu.CUDA_CONTEXT_MIB * memory.MIB
    tic = time.monotonic()
    s.log("Init torch distributed begin.")
    s.hold(ctx)
    await asyncio.sleep(0.15)
    if s.topo.nnodes > 1:
        await nodes.rendezvous(s)
    s.log(f"Init torch distributed ends. elapsed={time.monotonic() - tic:.2f} s, mem usage={ctx / GB:.2f} GB")
    if s.p.failure == "libcuda":
        await asyncio.sleep(1.5)
        await s.crash(libcuda_traceback())
    return ctx


async def weights(s: Scheduler, used: int) -> tuple[int, float]:
    """The target's weights, then the draft worker's; returns the bytes used and load_weight's seconds."""
    p, pool = s.p, s.pool
    tic = time.monotonic()
    s.log(f"Load weight begin. avail mem={s.avail(used):.2f} GB")
    await asyncio.sleep(0.5 + (fault_seconds("slow-start") if p.slow_start else 0.0))
    if "rank-oom" in s.x.faults:
        await rank_oom(s, used)
    used += pool.target_weights
    s.hold(used)
    load_weight = time.monotonic() - tic
    s.log(f"Load weight end. elapsed={load_weight:.2f} s, type={s.t.architecture}, "
          f"avail mem={s.avail(used):.2f} GB, mem usage={pool.target_weights / GB:.2f} GB.")
    if p.worker != "none" and s.x.draft_cfg:
        s.log("Init torch distributed begin.")  # the draft worker's own TpModelWorker
        s.log("Init torch distributed ends. elapsed=0.00 s, mem usage=0.00 GB")
        tic = time.monotonic()
        s.log(f"Load weight begin. avail mem={s.avail(used):.2f} GB")
        await asyncio.sleep(0.2)
        used += pool.draft_weights
        s.hold(used)
        arch = str(((s.x.draft_cfg or {}).get("architectures") or ["?"])[0])
        s.log(f"Load weight end. elapsed={time.monotonic() - tic:.2f} s, type={arch}, "
              f"avail mem={s.avail(used):.2f} GB, mem usage={pool.draft_weights / GB:.2f} GB.")
    if p.worker == "dflash":
        dflash_setup(s)
    return used, load_weight


async def kv_pools(s: Scheduler, used: int) -> tuple[int, float]:
    """The KV pools: the target's, then the draft's (DFlash: a pool of its own); returns the bytes
    used and the allocation's seconds."""
    p, pool = s.p, s.pool
    tic = time.monotonic()
    if p.failure == "not-enough-memory":
        await asyncio.sleep(0.1)
        await s.crash(traceback_text([lines.TB_SCHEDULER_INIT, lines.TB_NOT_ENOUGH_MEMORY],
                                     f"RuntimeError: {p.failure_message}\n"))
    if p.failure == "weights-leave-no-kv":
        await asyncio.sleep(0.1)
        await s.crash(traceback_text([lines.TB_SCHEDULER_INIT, lines.TB_WEIGHTS_LEAVE_NO_KV],
                                     f"ValueError: {p.failure_message}\n"))
    dtype = memory.TORCH_DTYPE.get(memory.kv_bytes(s.x.kv_cache_dtype, s.t.dtype_bytes), "torch.bfloat16")
    half = pool.kv_target / 2 / GB
    s.log(f"KV Cache is allocated. dtype: {dtype}, #tokens: {pool.tokens}, K size: {half:.2f} GB, "
          f"V size: {half:.2f} GB")
    used += pool.kv_target
    s.hold(used)
    s.log(f"Memory pool end. avail mem={s.avail(used):.2f} GB")
    draft_pool = pool.kv_draft or pool.tokens * p.side_draft_cell
    if draft_pool:
        dhalf = draft_pool / 2 / GB
        s.log(f"KV Cache is allocated. dtype: {dtype}, #tokens: {pool.tokens}, K size: {dhalf:.2f} GB, "
              f"V size: {dhalf:.2f} GB")
        used += draft_pool
        s.hold(used)
        s.log(f"Memory pool end. avail mem={s.avail(used):.2f} GB")
    kv_time = time.monotonic() - tic
    if p.worker == "dflash":
        backend = s.sa.speculative_draft_attention_backend or s.sa.attention_backend or "flashinfer"
        s.warn(f"Overriding draft attention backend to {backend}.")
    return used, kv_time


def ready_lines(s: Scheduler, used: int, t0: float, load_weight: float, kv_time: float) -> None:
    """What SGLang prints once the scheduler is set up, before the HTTP server starts."""
    p, pool = s.p, s.pool
    s.log(f"max_total_num_tokens={pool.tokens}, chunked_prefill_size={p.chunked_prefill_size}, "
          f"max_prefill_tokens={p.max_prefill_tokens}, max_running_requests={p.max_running_requests}, "
          f"context_len={p.context_len}, available_gpu_mem={s.avail(used):.2f} GB")
    s.log(lines.TREE_CACHE)
    graphs_ = ", ".join(f"{k}={v:.2f}" for k, v in s.timings.items())
    e2e = time.monotonic() - t0
    s.log(f"Engine startup timings (s): load_weight={load_weight:.2f}, kv_cache_allocation={kv_time:.2f}, "
          f"scheduler_e2e={e2e:.2f}, cuda_graph={{{graphs_}}}, tokenizer_e2e={e2e + 0.05:.2f}")


def dflash_setup(s: Scheduler) -> None:
    """DFlashWorkerV2's constructor lines (2_dflash)."""
    d = s.d or s.t
    dc = (s.x.draft_cfg or {}).get("dflash_config") or {}
    backend = s.sa.speculative_draft_attention_backend or s.sa.attention_backend or "flashinfer"
    s.log(f"Initialized DFLASH draft runner. attention_backend={backend}, model={d.architecture}, "
          f"block_size={s.p.draft_window}, draft_window_size=None, compact_cache=False")
    override = dc.get("mask_token_id")
    s.log(f"DFLASH draft runner ready. mask_token={dc.get('mask_token') or '<|MASK|>'}, "
          f"mask_token_id={override}, mask_token_id_override={override}")
    kv_heads = max(1, -(-d.kv_heads // s.x.tp))
    s.log(f"DFLASH fused KV materialization enabled. n_layers={d.layers}, num_kv_heads={kv_heads}, "
          f"head_dim={d.head_dim}")


# --------------------------------------------------------------------------- CUDA graphs


async def graphs(s: Scheduler, used: int) -> int:
    """CUDA graphs, captured after the pools out of the (1 - mfs) headroom; returns the bytes used."""
    p, x = s.p, s.x
    spec = p.worker != "none"
    if not x.cuda_graph or not p.prefill_graph_tokens:
        # one line per model runner: the target's here; the DFlash draft's here too without
        # graphs (2_neg_nonfamily_nograph), else where its runner sets up its graphs, after the
        # target's capture (4_layers_last, 5_ddtree_s025)
        for _ in range(2 if p.worker == "dflash" and not x.cuda_graph else 1):
            s.warn(lines.PREFILL_GRAPH_DISABLED)
    if p.worker == "dflash" and not x.cuda_graph:
        start_shadow(s, graphs=False)
    if not x.cuda_graph:
        return used
    if p.failure == "graph-shape":
        await s.crash(traceback_text([lines.TB_SCHEDULER_INIT, lines.TB_GRAPH_TYPE_ERROR],
                                     f"TypeError: {p.failure_message}\n"))
    parts = _graph_parts(p)
    if p.prefill_graph_tokens:
        used = await capture(s, "target prefill", "prefill", used, parts["prefill"],
                             f"backend=breakable, num_tokens={p.prefill_graph_tokens}",
                             "Capturing num tokens (num_tokens={n} avail_mem={m:.2f} GB)",
                             list(reversed(p.prefill_graph_tokens)))
    name, phase = ("target verify", "target_verify") if spec else ("target decode", "decode")
    if p.failure == "graph-oom":
        s.log(f"Capture {name} CUDA graph begin. backend=full, num_tokens_per_req={p.tokens_per_req}, "
              f"bs={p.graph_bs}, avail mem={s.avail(used):.2f} GB")
        await asyncio.sleep(0.4)
        await s.crash(traceback_text([lines.TB_SCHEDULER_INIT, lines.TB_GRAPH_OOM], graph_oom(s.pool)))
    used = await capture(s, name, phase, used, parts["target"],
                         f"backend=full, num_tokens_per_req={p.tokens_per_req}, bs={p.graph_bs}",
                         "Capturing batches (bs={n} avail_mem={m:.2f} GB)", list(reversed(p.graph_bs)))
    if p.worker == "dflash":
        start_shadow(s, graphs=True)
        if not p.prefill_graph_tokens:
            s.warn(lines.PREFILL_GRAPH_DISABLED)
        head = f"backend=full, num_tokens_per_req={p.tokens_per_req}, bs={p.graph_bs}"
        if p.failure == "draft-graph":
            s.log(f"Capture draft verify CUDA graph begin. {head}, avail mem={s.avail(used):.2f} GB")
            await s.crash(traceback_text([lines.TB_SCHEDULER_INIT, lines.TB_DRAFT_GRAPH],
                                         f"RuntimeError: {p.failure_message}\n"))
        used = await capture(s, "draft verify", "draft_decode", used, parts["draft"], head,
                             "Capturing batches (bs={n} avail_mem={m:.2f} GB)", list(reversed(p.graph_bs)))
    elif p.worker == "eagle":  # source: eagle_worker_v2.py (no real 0.5.17 log)
        steps = x.num_steps or 3
        if steps > 1:
            used = await capture(s, "draft decode", "draft_decode", used, parts["draft"] // 2,
                                 f"backend=full, num_tokens_per_req={x.eagle_topk or 1}, bs={p.graph_bs}",
                                 "Capturing batches (bs={n} avail_mem={m:.2f} GB)", list(reversed(p.graph_bs)))
        used = await capture(s, "draft extend", "draft_extend", used, parts["draft"] - parts["draft"] // 2,
                             f"backend=full, num_tokens_per_req={p.tokens_per_req}, bs={p.graph_bs}",
                             "Capturing batches (bs={n} avail_mem={m:.2f} GB)", list(reversed(p.graph_bs)))
    return used


async def capture(s: Scheduler, name: str, phase: str, used: int, nbytes: int, head: str, bar: str,
                  sizes: list[int]) -> int:
    tic = time.monotonic()
    before = s.avail(used)
    s.log(f"Capture {name} CUDA graph begin. {head}, avail mem={before:.2f} GB")
    _progress(bar, sizes, before, nbytes / GB)
    await asyncio.sleep(0.15)
    used += nbytes
    s.hold(used)
    took = time.monotonic() - tic
    s.timings[phase] += took
    s.log(f"Capture {name} CUDA graph end. elapsed={took:.2f} s, mem usage={nbytes / GB:.2f} GB, "
          f"avail mem={s.avail(used):.2f} GB.")
    return used


def start_shadow(s: Scheduler, *, graphs: bool) -> None:
    """The DFlash worker's draft sampler, built before its graph capture: the ddtree plugin's
    mixin decides here whether the head stays eager (and says so), else DFlash folds it in."""
    if shadow.is_plugin_worker(s.algo):
        mixin, why = shadow.plugin_mixin()
        if mixin is None:
            sglog.info(f"{STANDIN_LABEL}: the ddtree plugin's shadow accounting cannot run here ({why}); "
                       "serving as SGLang's DFlash worker alone")
        else:
            # the verify cost is simulated from this card and the target's weights (treesim.VerifyCost);
            # the tree-mask fault breaks the served tree's verify (treesim.SimTreeVerify)
            s.shadow = shadow.ShadowRun(mixin, s.p.draft_window, s.p.capture_layers, card=s.card,
                                        weight_bytes=s.p.pool.target_weights,
                                        faults=frozenset(f for f in s.x.faults if f == "tree-mask"))
            if graphs:
                s.shadow.init_cuda_graphs()
            return
    if graphs:
        sglog.info(lines.DRAFT_HEAD_FOLDED)


def _graph_parts(p: behaviour.Plan) -> dict[str, int]:
    """How the graphs' memory splits between the captures (the total is the pool's estimate)."""
    total = p.pool.graph
    prefill = total // 8 if p.prefill_graph_tokens else 0
    draft = (total - prefill) // 3 if p.worker in ("dflash", "eagle") else 0
    return {"prefill": prefill, "target": total - prefill - draft, "draft": draft}


def _progress(bar: str, sizes: list[int], avail: float, mem: float) -> None:
    """The capture's tqdm bar on stderr, as SGLang draws it (one line of carriage returns in a log)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return
    with tqdm(total=len(sizes), file=sys.stderr, mininterval=0, ascii=False, dynamic_ncols=False,
              ncols=None) as t:
        for i, n in enumerate(sizes):
            t.set_description(bar.format(n=n, m=avail - mem * i / max(len(sizes), 1)))
            t.update(1)
