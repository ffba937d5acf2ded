"""Triton kernels for the fused GPU tree build (imported lazily, only where Triton runs).

Three kernels, one launch each, no host synchronisation (CUDA-graph safe):

1. `_topk_kernel`, one program per depth row: the exact top-K of the row's fp32 log-probs in
   the canonical order of `tree.topk_logprobs` (log-prob descending, token id ascending; the
   log-probs themselves come from the very `torch.log_softmax` call the reference makes, so
   they are bit-identical). Pass 1 takes per-lane maxima over the row (LANES lanes); the K-th
   largest lane maximum T0 is a real value with at least K elements >= T0, so every member of
   the top-K is >= T0. Pass 2 compacts the survivors (x >= T0, ties included) as unique int64
   keys (ordered float bits << 32 | ~id). Pass 3 sorts them (bitonic, in registers) and writes
   the first K with their quantised scores. Survivors are usually 1.0-1.5 K; any number is
   handled exactly by merging chunks of M - KP into the running top-KP.
2. `_select_kernel`, one program per tree: the budget's nodes in the heap's pop order. Depth by
   depth it keeps G, the best B nodes found so far in the global total order (score desc, depth
   asc, parent position, rank). A depth-(d+1) candidate (beam position i, rank r) can only enter
   the final tree if its score is strictly above G's B-th score (that node is shallower, so it
   wins a tie, and the final threshold can only rise), so candidates are generated from the
   staircase pair table ((i+1)(r+1) <= B), filtered by that threshold, compacted, and merged
   into G by sorting [G | chunk] (2 * BP keys). The depth's new nodes, in order, are the next
   beam. At the end G, in order, is the node list; parents are mapped through a (depth, beam
   position) -> node table.
3. `_visibility_kernel`: vis[i, j] = j is i or an ancestor of i, by walking parents up.

Keys are int64 and unique, so bitonic sorts (unstable) give exactly one answer.
"""

from __future__ import annotations

import triton
import triton.language as tl

_MINK = tl.constexpr(-(2 ** 63))     # below every key: padding
_TIE = tl.constexpr(1 << 23)         # selection keys: score * 2**23 + tie bits
_HALF = tl.constexpr(1 << 22)        # tie bits >= HALF: an entry of G (old position); below: a candidate (i * K + r)


@triton.jit
def _order_key(x, ids):
    """Unique int64 key: larger = earlier in (value desc, id asc). -0.0 counts as +0.0."""
    x = tl.where(x == 0.0, 0.0, x)
    bits = x.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return ordered.to(tl.int64) * 4294967296 + (4294967295 - ids.to(tl.int64))


@triton.jit
def _quantize(x):
    """round-half-even(max(x, -1000) * 2**24) as int64, exactly like torch.round on fp32."""
    y = (tl.maximum(x, -1000.0) * 16777216.0).to(tl.float64)
    f = tl.floor(y)
    frac = y - f
    fi = f.to(tl.int64)
    up = (frac > 0.5) | ((frac == 0.5) & ((fi & 1) == 1))
    return fi + up.to(tl.int64)


@triton.jit
def _topk_kernel(LP, stride_lp, V, K, TOK, SC, stride_out, SURV, stride_surv, WORK,
                 LANES: tl.constexpr, R: tl.constexpr, KP: tl.constexpr, M: tl.constexpr,
                 BLK: tl.constexpr):
    row = tl.program_id(0)
    base = LP + row.to(tl.int64) * stride_lp
    # pass 1: per-lane maxima (R rows of LANES per step: more loads in flight)
    lanes = tl.arange(0, LANES)
    rr = tl.arange(0, R)
    lm = tl.full([LANES], float("-inf"), tl.float32)
    for start in range(0, V, R * LANES):
        o = start + rr[:, None] * LANES + lanes[None, :]
        x = tl.load(base + o, mask=o < V, other=float("-inf"))
        lm = tl.maximum(lm, tl.max(x, axis=0))
    best = tl.sort(lm, descending=True)
    t0 = tl.max(tl.where(lanes == K - 1, best, float("-inf")), axis=0)
    # pass 2: survivors x >= t0 as unique keys, compacted in id order
    surv = SURV + row.to(tl.int64) * stride_surv
    ob = tl.arange(0, BLK)
    ns = 0
    for start in range(0, V, BLK):
        o = start + ob
        x = tl.load(base + o, mask=o < V, other=float("-inf"))
        m = (o < V) & (x >= t0)
        cnt = tl.sum(m.to(tl.int32), axis=0)
        if cnt > 0:
            pos = ns + tl.cumsum(m.to(tl.int32), axis=0) - 1
            tl.store(surv + pos, _order_key(x, o), mask=m)
            ns += cnt
    tl.debug_barrier()
    # pass 3: sort; merge further chunks of M - KP into the running top-KP if there are more
    om = tl.arange(0, M)
    keys = tl.sort(tl.load(surv + om, mask=om < ns, other=_MINK), descending=True)
    work = WORK + row.to(tl.int64) * KP
    for c in range(M, ns, M - KP):
        tl.store(work + om, keys, mask=om < KP)
        tl.debug_barrier()
        src = c + om - KP
        ptr = tl.where(om < KP, work + om, surv + src)
        keys = tl.sort(tl.load(ptr, mask=(om < KP) | (src < ns), other=_MINK), descending=True)
        tl.debug_barrier()
    ids = 4294967295 - (keys & 4294967295)
    ordered = (keys >> 32).to(tl.int32)
    x = (ordered ^ ((ordered >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
    out = row.to(tl.int64) * stride_out + om
    tl.store(TOK + out, ids, mask=om < K)
    tl.store(SC + out, _quantize(x), mask=om < K)


@triton.jit
def _select_kernel(S, T, stride_st, PI, PR, PLEN, ROOT,
                   OUT_TOK, OUT_PAR, OUT_DEP, OUT_RANK, OUT_VALID,
                   SURV, GKEY, GSC, GMETA, BEAM, NODE_OF,
                   L, K, B,
                   BP: tl.constexpr, CB: tl.constexpr):
    ob = tl.arange(0, BP)
    om = tl.arange(0, 2 * BP)
    oc = tl.arange(0, CB)
    neg = -(2 ** 62)
    tl.store(BEAM + ob, tl.where(ob == 0, 0, neg).to(tl.int64))
    ng = 0          # nodes in G
    nb = 1          # beam entries at the current depth (the root)
    cur = 0         # which half of GSC / GMETA holds G
    tl.debug_barrier()
    for d in range(0, L):
        if nb > 0:
            srow = S + d * stride_st
            gs_last = tl.load(GSC + cur * BP + (B - 1))
            tau = tl.where(ng == B, gs_last, neg)
            # beam positions that can still produce a survivor: beam[i] + S[d, 0] > tau
            bsc = tl.load(BEAM + ob, mask=ob < nb, other=neg)
            s0 = tl.load(srow)
            nbe = tl.sum(((ob < nb) & (bsc + s0 > tau)).to(tl.int32), axis=0)
            npairs = tl.load(PLEN + nbe)
            ns = 0
            for c in range(0, npairs, CB):
                o = c + oc
                m = o < npairs
                i = tl.load(PI + o, mask=m, other=0)
                r = tl.load(PR + o, mask=m, other=0)
                sc = tl.load(BEAM + i, mask=m, other=0) + tl.load(srow + r, mask=m, other=0)
                m = m & (sc > tau)
                cnt = tl.sum(m.to(tl.int32), axis=0)
                if cnt > 0:
                    key = sc * _TIE + (_HALF - 1 - (i.to(tl.int64) * K + r))
                    pos = ns + tl.cumsum(m.to(tl.int32), axis=0) - 1
                    tl.store(SURV + pos, key, mask=m)
                    ns += cnt
            if ns > 0:
                gsc = tl.load(GSC + cur * BP + ob, mask=ob < ng, other=0)
                gk = tl.where(ob < ng, gsc * _TIE + _HALF + (_HALF - 1 - ob), _MINK)
                tl.store(GKEY + ob, gk)
                tl.debug_barrier()
                for c in range(0, ns, BP):
                    src = c + om - BP
                    ptr = tl.where(om < BP, GKEY + om, SURV + src)
                    k = tl.load(ptr, mask=(om < BP) | (src < ns), other=_MINK)
                    k = tl.sort(k, descending=True)
                    tl.debug_barrier()
                    tl.store(GKEY + om, k, mask=om < BP)
                    tl.debug_barrier()
                # the new G (first B), its new nodes in order = the next beam
                k = tl.load(GKEY + ob)
                valid = (ob < B) & (k != _MINK)
                score = k >> 23
                low = k & (_TIE - 1)
                is_g = low >= _HALF
                idx = (_HALF - 1) - (low & (_HALF - 1))
                new = valid & (low < _HALF)
                j = tl.cumsum(new.to(tl.int32), axis=0) - 1
                old = valid & is_g
                gidx = idx.to(tl.int32)
                mo = GMETA + cur * 4 * BP
                o_dep = tl.load(mo + gidx, mask=old, other=0)
                o_pos = tl.load(mo + BP + gidx, mask=old, other=0)
                o_par = tl.load(mo + 2 * BP + gidx, mask=old, other=0)
                o_rank = tl.load(mo + 3 * BP + gidx, mask=old, other=0)
                pi = (idx // K).to(tl.int32)
                pr = (idx % K).to(tl.int32)
                nxt = 1 - cur
                mn = GMETA + nxt * 4 * BP
                tl.store(GSC + nxt * BP + ob, score, mask=valid)
                tl.store(mn + ob, tl.where(is_g, o_dep, d + 1), mask=valid)
                tl.store(mn + BP + ob, tl.where(is_g, o_pos, j), mask=valid)
                tl.store(mn + 2 * BP + ob, tl.where(is_g, o_par, pi), mask=valid)
                tl.store(mn + 3 * BP + ob, tl.where(is_g, o_rank, pr), mask=valid)
                tl.store(BEAM + j, score, mask=new)
                ng = tl.sum(valid.to(tl.int32), axis=0)
                nb = tl.sum(new.to(tl.int32), axis=0)
                cur = nxt
                tl.debug_barrier()
            else:
                nb = 0
    # G, in order, is the node list: node g + 1
    valid = ob < ng
    mc = GMETA + cur * 4 * BP
    dep = tl.load(mc + ob, mask=valid, other=0)
    pos = tl.load(mc + BP + ob, mask=valid, other=0)
    ppos = tl.load(mc + 2 * BP + ob, mask=valid, other=0)
    rank = tl.load(mc + 3 * BP + ob, mask=valid, other=0)
    tl.store(NODE_OF + dep * BP + pos, ob + 1, mask=valid)
    tl.debug_barrier()
    deep = valid & (dep > 1)
    par = tl.load(NODE_OF + (dep - 1) * BP + ppos, mask=deep, other=0)
    par = tl.where(valid, par, -1)
    tok = tl.load(T + (dep - 1) * stride_st + rank, mask=valid, other=0)
    out = ob + 1
    mo = ob < B
    tl.store(OUT_TOK + out, tl.where(valid, tok, 0), mask=mo)
    tl.store(OUT_PAR + out, par.to(tl.int64), mask=mo)
    tl.store(OUT_DEP + out, dep.to(tl.int64), mask=mo)
    tl.store(OUT_RANK + out, rank.to(tl.int64), mask=mo)
    tl.store(OUT_VALID + out, valid.to(tl.int8), mask=mo)
    # the root
    first = ob == 0
    root = tl.load(ROOT + ob * 0, mask=first, other=0)
    tl.store(OUT_TOK + ob, root, mask=first)
    tl.store(OUT_PAR + ob, tl.full([BP], -1, tl.int64), mask=first)
    tl.store(OUT_DEP + ob, tl.zeros([BP], tl.int64), mask=first)
    tl.store(OUT_RANK + ob, tl.zeros([BP], tl.int64), mask=first)
    tl.store(OUT_VALID + ob, tl.full([BP], 1, tl.int8), mask=first)


@triton.jit
def _visibility_kernel(PAR, VIS, N, L, BI: tl.constexpr, BJ: tl.constexpr):
    i = tl.program_id(0) * BI + tl.arange(0, BI)
    j = tl.program_id(1) * BJ + tl.arange(0, BJ)
    a = tl.where(i < N, i, -1).to(tl.int64)
    vis = a[:, None] == j[None, :]
    for _ in range(0, L):
        a = tl.load(PAR + a, mask=a >= 0, other=-1)
        vis = vis | (a[:, None] == j[None, :])
    m = (i[:, None] < N) & (j[None, :] < N)
    tl.store(VIS + i[:, None].to(tl.int64) * N + j[None, :], vis.to(tl.int8), mask=m)


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"


def topk_config(k: int) -> dict[str, int]:
    """LANES >= 2 KP lanes; with 1024+ lanes the survivors of T0 are ~1.05-1.5 K on real
    draft rows (151936 vocab), so one sort of M = 2 KP keys usually finishes the row. The
    interpreter (CPU tests) uses the same code with small blocks."""
    kp = max(2, next_pow2(k))
    if interpreting():
        return {"KP": kp, "M": 2 * kp, "LANES": 2 * kp, "R": 1, "BLK": 64}
    lanes = max(1024, 2 * kp)
    return {"KP": kp, "M": 2 * kp, "LANES": lanes, "R": max(1, 4096 // lanes), "BLK": 4096}


# ----------------------------------------------------------------------------------------------
# launchers (torch tensors on a CUDA device, or on the CPU under TRITON_INTERPRET=1)

import functools  # noqa: E402

import torch  # noqa: E402


def _warps(n: int) -> int:
    return 4 if n <= 256 else 8 if n <= 2048 else 16


def topk_rows(lp: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of each row of fp32 log-probs [L, V] in (value desc, id asc): (tokens, scores) int64."""
    rows, vocab = int(lp.shape[0]), int(lp.shape[1])
    lp = lp.contiguous()
    cfg = topk_config(k)
    tokens = torch.empty((rows, k), dtype=torch.int64, device=lp.device)
    scores = torch.empty((rows, k), dtype=torch.int64, device=lp.device)
    if rows == 0 or k == 0:
        return tokens, scores
    surv = torch.empty((rows, max(vocab, cfg["M"])), dtype=torch.int64, device=lp.device)
    work = torch.empty((rows, cfg["KP"]), dtype=torch.int64, device=lp.device)
    _topk_kernel[(rows,)](lp, lp.stride(0), vocab, k, tokens, scores, k, surv, surv.stride(0), work,
                          LANES=cfg["LANES"], R=cfg["R"], KP=cfg["KP"], M=cfg["M"], BLK=cfg["BLK"],
                          num_warps=16)
    return tokens, scores


@functools.lru_cache(maxsize=64)
def pair_tables(budget: int, k: int, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The staircase pairs (i, r) with (i + 1)(r + 1) <= B, r < K, ordered by i; PLEN[n] is the
    number of pairs with i < n (n = 0..BP)."""
    pi, pr, plen = [], [], [0]
    for i in range(budget):
        width = min(k, budget // (i + 1))
        pi.extend([i] * width)
        pr.extend(range(width))
        plen.append(len(pi))
    bp = max(2, next_pow2(budget))
    plen.extend([len(pi)] * (bp + 1 - len(plen)))
    as_t = lambda xs: torch.tensor(xs or [0], dtype=torch.int32, device=device)  # noqa: E731
    return as_t(pi), as_t(pr), as_t(plen)


def select_nodes(scores: torch.Tensor, tokens: torch.Tensor, budget: int, root: torch.Tensor,
                 depth_limit: int | None = None) -> dict[str, torch.Tensor]:
    """Tree nodes 0..B (0 = root) from the [L, K] top-k table: tokens, parents, depths, ranks,
    valid; invalid slots (fewer than B prefixes exist) come last with parent -1."""
    depth, k = int(scores.shape[0]), int(scores.shape[1])
    dev = scores.device
    bp = max(2, next_pow2(budget))
    pi, pr, plen = pair_tables(budget, k, str(dev))
    scores = scores.contiguous()
    tokens = tokens.to(torch.int64).contiguous()
    n = budget + 1
    out = {name: torch.empty(n, dtype=torch.int64, device=dev) for name in ("tokens", "parents", "depths", "ranks")}
    valid = torch.empty(n, dtype=torch.int8, device=dev)
    cp = int(pi.shape[0])
    surv = torch.empty(max(cp, 1), dtype=torch.int64, device=dev)
    gkey = torch.empty(2 * bp, dtype=torch.int64, device=dev)
    gsc = torch.empty(2 * bp, dtype=torch.int64, device=dev)
    gmeta = torch.empty(8 * bp, dtype=torch.int32, device=dev)
    beam = torch.empty(bp, dtype=torch.int64, device=dev)
    node_of = torch.empty((depth + 1) * bp, dtype=torch.int32, device=dev)
    cb = min(1024, max(16, next_pow2(cp)))
    _select_kernel[(1,)](scores, tokens, k, pi, pr, plen, root.view(-1)[:1].to(torch.int64),
                         out["tokens"], out["parents"], out["depths"], out["ranks"], valid,
                         surv, gkey, gsc, gmeta, beam, node_of,
                         depth, k, budget, BP=bp, CB=cb, num_warps=_warps(2 * bp))
    out["valid"] = valid.view(torch.bool)
    return out


def visibility(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """vis[i, j]: j is i or an ancestor of i ([N] parents, root -1)."""
    n = int(parents.shape[0])
    vis = torch.empty((n, n), dtype=torch.int8, device=parents.device)
    bi, bj = 32, 128
    _visibility_kernel[(triton.cdiv(n, bi), triton.cdiv(n, bj))](parents.contiguous(), vis, n, max_depth,
                                                                  BI=bi, BJ=bj, num_warps=4)
    return vis.view(torch.bool)
