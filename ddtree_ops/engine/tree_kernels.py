"""Triton kernels for the fused GPU tree build (imported lazily, only where Triton runs).

Three kernels, one launch each, no host synchronisation (CUDA-graph safe):

1. The exact top-K of each depth row's fp32 log-probs, in the canonical order of
   `tree.topk_logprobs` (log-prob descending, token id ascending), in two kernels over (row,
   chunk) programs. `_stats_kernel`: each chunk's max, sum of exp and per-lane maxima; the row's
   last program (an atomic count) forms m and c (log-probs are (x - m) - c, the same bits that
   `tree.log_probs` computes from this kernel's output) and T0, the K-th largest lane maximum:
   a real log-prob with at least K log-probs >= it, so every top-K member is >= T0.
   `_filter_kernel`: each chunk appends its survivors (lp >= T0, ties included) to the row's
   list as unique int64 keys (ordered float bits << 32 | ~id), at slots from an atomic count;
   the row's last program sorts them (bitonic, in registers) and writes the first K with their
   quantised scores. Survivors are usually 1.0-1.5 K; any number is handled exactly by merging
   M - KP more at a time into the running top-KP.
2. `_select_kernel`, one program per tree: the budget's nodes in the heap's pop order. Depth by
   depth it keeps G, the best B nodes found so far in the global total order (score desc, depth
   asc, parent position, rank). A depth-(d+1) candidate (beam position i, rank r) can only enter
   the final tree if its score is strictly above G's B-th score (that node is shallower, so it
   wins a tie, and the final threshold can only rise), so candidates are generated from the
   staircase pair table ((i+1)(r+1) <= B), filtered by that threshold, compacted, and merged
   into G (kept sorted in registers) BP at a time: the chunk is sorted ascending, the top BP of
   both is max(G, chunk), a bitonic sequence, and log2(BP) compare-exchange steps sort it. When
   at most 32, 64 or 128 survive (the usual case), they are sorted at that width and placed
   last in a row of padding before the merge (`_merge_narrow`). A node's key in G carries its
   id (ids given in (depth, beam position) order), so it never changes and per-node data is
   written once, by id. The depth's new nodes, in order, are the next beam. At the end G, in
   order, is the node list; parents are mapped through a (depth, beam position) -> node table,
   and the visibility (j is i or an ancestor of i) is marked by walking every node's parents
   up at once, in a buffer that the filter kernel's programs zeroed. A kernel of its own for
   it cost more in launch than in work. SPINE (the spine tree, `tree_shape`): the root's key
   carries `SPINE_BONUS`, beam position 0 is then always the spine node, and a candidate
   (0, r > 0) drops the bonus; the pair table is the spine's staircase.

Keys are int64 and unique, so bitonic sorts (unstable) give exactly one answer.
"""

from __future__ import annotations

import bisect
import functools
import os

import torch
import triton
import triton.language as tl

from ddtree_ops.engine.tree_shape import SPINE_BONUS, spine_for, staircase_pairs

_MINK = tl.constexpr(-(2 ** 63))     # below every key: padding
_MAXK = tl.constexpr(2 ** 63 - 1)
_TIE = tl.constexpr(1 << 23)         # selection keys: score * 2**23 + tie bits
_HALF = tl.constexpr(1 << 22)        # tie bits >= HALF: an entry of G (old position); below: a candidate (i * K + r)
_BONUS = tl.constexpr(SPINE_BONUS)   # a spine node's key bonus


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
def _stats_kernel(X, stride_x, V, K, LANEMAX, MSTAT, SSTAT, CNT, ROWSTAT,
                  S: tl.constexpr, SP: tl.constexpr, LANES: tl.constexpr, R: tl.constexpr):
    """Program (row, chunk c) of R * LANES logits: the chunk's max, sum of exp(x - max) and
    per-lane maxima. The row's last program (atomic count) combines them: ROWSTAT[row] =
    (m, c, t0) with log-probs lp = (x - m) - c, and t0 (K > 0) the K-th largest lane maximum
    as a log-prob, a value with at least K log-probs >= it."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    lanes = tl.arange(0, LANES)
    o = chunk * (R * LANES) + tl.arange(0, R)[:, None] * LANES + lanes[None, :]
    x = tl.load(X + row.to(tl.int64) * stride_x + o, mask=o < V, other=float("-inf")).to(tl.float32)
    lm = tl.max(x, axis=0)
    mc = tl.max(lm, axis=0)
    sc = tl.sum(tl.sum(tl.where(o < V, tl.exp(x - mc), 0.0), axis=1), axis=0)
    part = row * S + chunk
    tl.store(LANEMAX + part.to(tl.int64) * LANES + lanes, lm)
    tl.store(MSTAT + part, mc)
    tl.store(SSTAT + part, sc)
    tl.debug_barrier()
    done = tl.atomic_add(CNT + row, 1, sem="acq_rel")
    if done == S - 1:
        oc = tl.arange(0, SP)
        ms = tl.load(MSTAT + row * S + oc, mask=oc < S, other=float("-inf"), cache_modifier=".cg")
        ss = tl.load(SSTAT + row * S + oc, mask=oc < S, other=0.0, cache_modifier=".cg")
        m = tl.max(ms, axis=0)
        c = tl.log(tl.sum(tl.where(ms > float("-inf"), ss * tl.exp(ms - m), 0.0), axis=0))
        # t0 (K is a runtime value: one compiled kernel for every budget and for the
        # reference's log-probs, so m and c are the same bits whoever asks)
        best = tl.full([LANES], float("-inf"), tl.float32)
        o4 = tl.arange(0, 4)
        for j0 in tl.static_range(0, S, 4):      # 4 rows per load, unrolled: the loads overlap
            jj = j0 + o4
            lmj = tl.load(LANEMAX + (row * S + jj).to(tl.int64)[:, None] * LANES + lanes[None, :],
                          mask=(jj < S)[:, None], other=float("-inf"), cache_modifier=".cg")
            best = tl.maximum(best, tl.max(lmj, axis=0))
        if K <= LANES // 8:
            top_c = tl.topk(best, LANES // 8)
            xk = tl.max(tl.where(tl.arange(0, LANES // 8) == K - 1, top_c, float("-inf")), axis=0)
        elif K <= LANES // 2:
            top_a = tl.topk(best, LANES // 2)
            xk = tl.max(tl.where(tl.arange(0, LANES // 2) == K - 1, top_a, float("-inf")), axis=0)
        else:
            top_b = tl.sort(best, descending=True)
            xk = tl.max(tl.where(lanes == K - 1, top_b, float("-inf")), axis=0)   # K > LANES: -inf
        t0 = (xk - m) - c
        tl.store(ROWSTAT + row * 3, m)
        tl.store(ROWSTAT + row * 3 + 1, c)
        tl.store(ROWSTAT + row * 3 + 2, t0)
        tl.atomic_xchg(CNT + row, 0)


@triton.jit
def _xor_combine(a, b):
    return a ^ b


@triton.jit
def _cas_desc(x, N: tl.constexpr, W: tl.constexpr):
    """Compare-exchange of x[n] and x[n ^ W], the larger to the lower index."""
    y = tl.reshape(x, [N // (2 * W), 2, W])
    p = y ^ tl.reduce(y, 1, _xor_combine, keep_dims=True)     # the partner W away
    right = tl.arange(0, 2)[None, :, None] == 1
    return tl.reshape(tl.where(right, tl.minimum(y, p), tl.maximum(y, p)), [N])


@triton.jit
def _merge_desc(x, N: tl.constexpr, LOGN: tl.constexpr):
    """A bitonic sequence of N = 2**LOGN int64 keys, sorted descending (LOGN compare-exchange steps)."""
    for t in tl.static_range(LOGN):
        x = _cas_desc(x, N, N >> (t + 1))
    return x


@triton.jit
def _filter_kernel(X, stride_x, V, K, ROWSTAT, SURV, CNT, NSURV, WORK, TOK, SC, stride_out, CLR, NCLR, SLICE,
                   CH: tl.constexpr, KP: tl.constexpr, M: tl.constexpr, CLEAR: tl.constexpr):
    """Program (row, chunk c): the chunk's log-probs >= t0 as unique keys, appended to the row's
    survivor list (slots from an atomic count, so in no fixed order: the keys are unique and
    only sorted from here on). The row's last program sorts them (merging M - KP more at a
    time into the running top-KP when there are more than M) and writes the top K.
    CLEAR: every program also zeroes its SLICE bytes of CLR[0:NCLR], the selection's
    visibility buffer (zeroing a 1025 x 1025 matrix in the selection's one CTA cost about
    27 us more)."""
    row = tl.program_id(0)
    o = tl.program_id(1) * CH + tl.arange(0, CH)
    if CLEAR:
        start = (row * tl.num_programs(1) + tl.program_id(1)) * SLICE
        oz = tl.arange(0, 1024)
        for f in range(0, SLICE, 1024):
            at = start + f + oz
            tl.store(CLR + at, tl.zeros([1024], tl.int8), mask=(f + oz < SLICE) & (at < NCLR))
    m = tl.load(ROWSTAT + row * 3)
    c = tl.load(ROWSTAT + row * 3 + 1)
    t0 = tl.load(ROWSTAT + row * 3 + 2)
    x = tl.load(X + row.to(tl.int64) * stride_x + o, mask=o < V, other=float("-inf")).to(tl.float32)
    lp = (x - m) - c
    keep = (o < V) & (lp >= t0)
    # a few dozen survivors per chunk: one atomic each is cheaper than a scan of the chunk
    slot = tl.atomic_add(NSURV + row + o * 0, 1, mask=keep, sem="relaxed")
    surv = SURV + row.to(tl.int64) * V
    tl.store(surv + slot, _order_key(lp, o), mask=keep)
    tl.debug_barrier()
    done = tl.atomic_add(CNT + row, 1, sem="acq_rel")
    if done == tl.num_programs(1) - 1:
        total = tl.atomic_xchg(NSURV + row, 0)
        om = tl.arange(0, M)
        work = WORK + row.to(tl.int64) * KP
        # the first M survivors, then M - KP more at a time merged into the running top-KP
        keys = tl.sort(tl.load(surv + om, mask=om < total, other=_MINK, cache_modifier=".cg"), descending=True)
        for base in range(M, total, M - KP):
            tl.store(work + om, keys, mask=om < KP)
            tl.debug_barrier()
            src = base + om - KP
            more = tl.load(surv + src, mask=(om >= KP) & (src < total), other=_MINK, cache_modifier=".cg")
            keys = tl.where(om < KP, tl.load(work + om, mask=om < KP, other=_MINK), more)
            keys = tl.sort(keys, descending=True)
            tl.debug_barrier()
        ids = 4294967295 - (keys & 4294967295)
        ordered = (keys >> 32).to(tl.int32)
        v = (ordered ^ ((ordered >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
        out = row.to(tl.int64) * stride_out + om
        tl.store(TOK + out, ids, mask=om < K)
        tl.store(SC + out, _quantize(v), mask=om < K)
        tl.atomic_xchg(CNT + row, 0)


@triton.jit
def _merge_narrow(G, SURV, ns, BP: tl.constexpr, LOGBP: tl.constexpr, W: tl.constexpr):
    """G (BP keys, descending) merged with the ns <= W keys SURV[0:ns]: they are sorted ascending
    at width W and placed last in a BP-wide row of MINK (W == BP: as is), then merged as usual."""
    ow = tl.arange(0, W)
    k = tl.sort(tl.load(SURV + ow, mask=ow < ns, other=_MINK))     # ascending
    if W < BP:
        rows = tl.arange(0, BP // W)[:, None]
        k = tl.reshape(tl.where(rows == BP // W - 1, k[None, :], _MINK), [BP])
    return _merge_desc(tl.maximum(G, k), BP, LOGBP)


@triton.jit
def _select_kernel(S, T, stride_st, PI, PR, PLEN, ROOT,
                   OUT_TOK, OUT_PAR, OUT_DEP, OUT_RANK, OUT_VALID,
                   SURV, META, BEAM, NODE_OF, VIS,
                   L, K, B,
                   BP: tl.constexpr, LOGBP: tl.constexpr, CB: tl.constexpr, NP: tl.constexpr,
                   W1: tl.constexpr, W2: tl.constexpr, W3: tl.constexpr, WITH_VIS: tl.constexpr,
                   SPINE_TREE: tl.constexpr):
    ob = tl.arange(0, BP)
    oc = tl.arange(0, CB)
    pi0 = tl.load(PI + oc)          # the first chunk of the pair table: loaded once
    pr0 = tl.load(PR + oc)
    neg = -(2 ** 62)
    nmax = L * BP                   # node ids < L * B: META is [4, L * BP] (depth, position, parent position, rank)
    root_key = _BONUS if SPINE_TREE else 0          # the root heads the spine
    tl.store(BEAM + ob, tl.where(ob == 0, root_key, neg).to(tl.int64))
    # G: the best B nodes so far, keys sorted descending, in registers. A node's key is
    # score * 2**23 + HALF + (HALF - 1 - id), ids given in (depth, position) order, so equal
    # scores order exactly as (depth, parent position, rank); the key never changes.
    G = tl.full([BP], _MINK, tl.int64)
    bs = tl.where(ob == 0, root_key, neg).to(tl.int64)
    o2 = tl.arange(0, 2 * BP)
    plen = tl.load(PLEN + o2, mask=o2 <= BP, other=0)
    nb = 1          # beam entries at the current depth (the root)
    base = 0        # node ids given so far
    # depth d's scores at the first chunk's ranks, loaded one depth ahead: the loads of depth
    # d + 1 are in flight while depth d sorts and merges
    s_cur = tl.load(S + pr0)
    s0 = tl.load(S)
    tl.debug_barrier()
    for d in range(0, L):
        ahead = tl.where(d + 1 < L, d + 1, d)       # the last depth reloads itself, unused
        s_nxt = tl.load(S + ahead * stride_st + pr0)
        s0_nxt = tl.load(S + ahead * stride_st)
        if nb > 0:
            srow = S + d * stride_st
            gmin = tl.min(tl.where(ob < B, G, _MAXK), axis=0)       # G's B-th key (MINK: not full)
            tau = gmin >> 23
            # beam positions that can still produce a survivor: beam[i] + S[d, 0] > tau
            # (bs: the beam's scores where its nodes sit in G, neg elsewhere; from registers)
            nbe = tl.sum(((bs != neg) & (bs + s0 > tau)).to(tl.int32), axis=0)
            npairs = tl.sum(tl.where(o2 == nbe, plen, 0), axis=0)
            ns = 0
            for c in range(0, npairs, CB):
                o = c + oc
                m = o < npairs
                if c == 0:
                    i = pi0
                    r = pr0
                    sr = s_cur
                else:
                    i = tl.load(PI + o, mask=m, other=0)
                    r = tl.load(PR + o, mask=m, other=0)
                    sr = tl.load(srow + r, mask=m, other=0)
                sc = tl.load(BEAM + i, mask=m, other=0) + sr
                if SPINE_TREE:      # position 0 is the spine node: its rank > 0 children leave it
                    sc = sc - tl.where((i == 0) & (r > 0), _BONUS, 0).to(tl.int64)
                m = m & (sc > tau)
                cnt = tl.sum(m.to(tl.int32), axis=0)
                if cnt > 0:
                    key = sc * _TIE + (_HALF - 1 - (i.to(tl.int64) * K + r))
                    pos = ns + tl.cumsum(m.to(tl.int32), axis=0) - 1
                    tl.store(SURV + pos, key, mask=m)
                    ns += cnt
            if ns > 0:
                tl.debug_barrier()
                # few survivors (the usual case): sort them at a narrower width, then merge
                if ns <= W1:
                    G = _merge_narrow(G, SURV, ns, BP, LOGBP, W1)
                elif ns <= W2:
                    G = _merge_narrow(G, SURV, ns, BP, LOGBP, W2)
                elif ns <= W3:
                    G = _merge_narrow(G, SURV, ns, BP, LOGBP, W3)
                else:
                    for c in range(0, ns, BP):
                        src = c + ob
                        k = tl.sort(tl.load(SURV + src, mask=src < ns, other=_MINK))     # ascending
                        G = _merge_desc(tl.maximum(G, k), BP, LOGBP)                     # the top BP of both
                G = tl.where(ob < B, G, _MINK)
                # the depth's new nodes, in order = the next beam
                low = G & (_TIE - 1)
                new = (G != _MINK) & (low < _HALF)
                j = tl.cumsum(new.to(tl.int32), axis=0) - 1
                cidx = low ^ (_HALF - 1)       # i * K + r (HALF - 1 - low)
                score = G >> 23
                nid = base + j
                tl.store(META + nid, (d + 1) + j * 0, mask=new)
                tl.store(META + nmax + nid, j, mask=new)
                tl.store(META + 2 * nmax + nid, (cidx // K).to(tl.int32), mask=new)
                tl.store(META + 3 * nmax + nid, (cidx % K).to(tl.int32), mask=new)
                tl.store(BEAM + j, score, mask=new)
                G = tl.where(new, score * _TIE + _HALF + (_HALF - 1 - nid), G)
                bs = tl.where(new, score, neg)
                nb = tl.sum(new.to(tl.int32), axis=0)
                base += nb
                tl.debug_barrier()
            else:
                nb = 0
        s_cur = s_nxt
        s0 = s0_nxt
    # G, in order, is the node list: node g + 1
    valid = (ob < B) & (G != _MINK)
    nid = ((G & (_HALF - 1)) ^ (_HALF - 1)).to(tl.int32)     # HALF - 1 - id
    dep = tl.load(META + nid, mask=valid, other=0)
    pos = tl.load(META + nmax + nid, mask=valid, other=0)
    ppos = tl.load(META + 2 * nmax + nid, mask=valid, other=0)
    rank = tl.load(META + 3 * nmax + nid, mask=valid, other=0)
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
    tl.store(OUT_PAR + ob * 0, tl.full([BP], -1, tl.int64), mask=ob == 0)     # the root's parent
    if WITH_VIS:
        # vis[i, j] = j is i or an ancestor of i ((B + 1)^2 bytes, row-major, zeroed by the
        # filter kernel): a one per (node, ancestor), walking every node's parents up at once
        tl.debug_barrier()
        on = tl.arange(0, NP)
        pn = tl.load(OUT_PAR + on, mask=on <= B, other=-1).to(tl.int32)
        a = tl.where(on <= B, on, -1)
        one = tl.full([NP], 1, tl.int8)
        for t in range(0, L + 1):
            tl.store(VIS + on * (B + 1) + a, one, mask=a >= 0)
            a = tl.where(a >= 0, tl.gather(pn, tl.maximum(a, 0), 0), -1)
    # the root
    first = ob == 0
    root = tl.load(ROOT + ob * 0, mask=first, other=0)
    tl.store(OUT_TOK + ob, root, mask=first)
    tl.store(OUT_DEP + ob, tl.zeros([BP], tl.int64), mask=first)
    tl.store(OUT_RANK + ob, tl.zeros([BP], tl.int64), mask=first)
    tl.store(OUT_VALID + ob, tl.full([BP], 1, tl.int8), mask=first)


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _warps(n: int) -> int:
    return 4 if n <= 256 else 8 if n <= 1024 else 16


# ----------------------------------------------------------------------------------------------
# launchers (torch tensors on a CUDA device, or on the CPU under TRITON_INTERPRET=1)


def topk_config(k: int) -> dict[str, int]:
    """The filter's chunk of a row (CH logits per program) and its final sort: M = 2 KP keys.
    With the 2048 lane maxima of `_stats_kernel` the survivors of t0 are ~1.05-1.5 K on real
    draft rows (151936 vocab), so one sort usually finishes a row; more are merged M - KP at
    a time."""
    kp = max(2, next_pow2(k))
    return {"KP": kp, "M": 2 * kp, "CH": 64 if interpreting() else 8192}


def stats_config() -> dict[str, int]:
    """Fixed chunking of a row for the log-softmax statistics: the same compiled kernel for
    every budget and for `tree.log_probs`, so the normaliser has the same bits everywhere."""
    return {"LANES": 64, "R": 1} if interpreting() else {"LANES": 2048, "R": 4}


def _row_stats(x: torch.Tensor, k: int, counters: torch.Tensor) -> torch.Tensor:
    rows, vocab = int(x.shape[0]), int(x.shape[1])
    cfg = stats_config()
    lanes, rr = cfg["LANES"], cfg["R"]
    s = max(1, -(-vocab // (lanes * rr)))
    lanemax = torch.empty((rows * s, lanes), dtype=torch.float32, device=x.device)
    mstat = torch.empty(rows * s, dtype=torch.float32, device=x.device)
    sstat = torch.empty(rows * s, dtype=torch.float32, device=x.device)
    rowstat = torch.empty((rows, 3), dtype=torch.float32, device=x.device)
    _stats_kernel[(rows, s)](x, x.stride(0), vocab, k, lanemax, mstat, sstat, counters, rowstat,
                             S=s, SP=next_pow2(s), LANES=lanes, R=rr, num_warps=8)
    return rowstat


def log_softmax_stats(x: torch.Tensor) -> torch.Tensor:
    """[L, V] logits -> [L, 3] fp32 (m, c, -): log-probs are (x - m) - c, computed by the caller
    with plain fp32 subtractions (bit-identical in PyTorch and in `_filter_kernel`)."""
    x = x.contiguous()
    return _row_stats(x, 0, torch.zeros(int(x.shape[0]), dtype=torch.int32, device=x.device))


def vis_bytes(budget: int) -> int:
    """Bytes of a visibility buffer for `topk_rows(clear=)` and `select_nodes(vis=)`: the
    (B + 1)^2 matrix rounded up to 16, so the clearing stores are 16 bytes wide."""
    return -(-((budget + 1) ** 2) // 16) * 16


def topk_rows(x: torch.Tensor, k: int, counters: torch.Tensor | None = None,
              clear: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of the log-probs of each row of logits [L, V] (any float dtype), in (log-prob desc,
    id asc), log-probs as in `log_softmax_stats`: (tokens, quantised scores), both int64 [L, k].

    `counters`: int32 [3 L] zeros that the caller keeps (a graph-captured builder); the kernels
    leave them zero again, so a replay needs no memset node. Builds that share one buffer must
    not run concurrently. `clear`: an int8 buffer (`vis_bytes` long) that the filter kernel
    zeroes on the way, for `select_nodes(vis=)`."""
    rows, vocab = int(x.shape[0]), int(x.shape[1])
    x = x.contiguous()
    tokens = torch.empty((rows, k), dtype=torch.int64, device=x.device)
    scores = torch.empty((rows, k), dtype=torch.int64, device=x.device)
    if rows == 0 or k == 0:
        return tokens, scores
    cfg = topk_config(k)
    if counters is None:
        counters = torch.zeros(3 * rows, dtype=torch.int32, device=x.device)
    rowstat = _row_stats(x, k, counters[:rows])
    surv = torch.empty((rows, vocab), dtype=torch.int64, device=x.device)   # room for every logit
    work = torch.empty((rows, cfg["KP"]), dtype=torch.int64, device=x.device)
    chunks = triton.cdiv(vocab, cfg["CH"])
    nclr = int(clear.numel()) if clear is not None else 0
    slice_ = -(-nclr // (rows * chunks * 16)) * 16                           # bytes per program
    _filter_kernel[(rows, chunks)](
        x, x.stride(0), vocab, k, rowstat, surv, counters[rows:2 * rows], counters[2 * rows:], work,
        tokens, scores, k, clear if clear is not None else work, nclr, slice_,
        CH=cfg["CH"], KP=cfg["KP"], M=cfg["M"], CLEAR=clear is not None,
        num_warps=16 if cfg["KP"] >= 1024 else 8)
    return tokens, scores


@functools.lru_cache(maxsize=64)
def pair_tables(budget: int, k: int, device: str, spine: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`tree_shape.staircase_pairs` as int32 tables; PLEN[n] is the number of pairs with i < n
    (n = 0..BP)."""
    pi, pr = staircase_pairs(budget, k, spine)
    bp = max(2, next_pow2(budget))
    plen = [bisect.bisect_left(pi, n) for n in range(bp + 1)]
    pad = min(1024, max(16, next_pow2(len(pi)))) - len(pi)      # whole first chunk (CB) readable
    pi.extend([0] * max(0, pad))
    pr.extend([0] * max(0, pad))
    as_t = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
    return as_t(pi), as_t(pr), as_t(plen)


def select_nodes(scores: torch.Tensor, tokens: torch.Tensor, budget: int, root: torch.Tensor,
                 vis: torch.Tensor | None = None, num_warps: int | None = None,
                 spine: bool | None = None) -> dict[str, torch.Tensor]:
    """Tree nodes 0..B (0 = root) from the [L, K] top-k table: tokens, parents, depths, ranks,
    valid; invalid slots (fewer than B prefixes exist) come last with parent -1 and see only
    themselves. `vis`: a zeroed int8 buffer (`vis_bytes(B)`, cleared by `topk_rows(clear=)`)
    that receives the ancestor-only mask, returned as "visibility", bool [B + 1, B + 1].
    `spine`: the spine tree or the plain best-first one; None: the default (`tree_shape.spine_for`)."""
    depth, k = int(scores.shape[0]), int(scores.shape[1])
    dev = scores.device
    spine = spine_for(budget, depth, spine)
    bp = max(2, next_pow2(budget))
    pi, pr, plen = pair_tables(budget, k, str(dev), spine)
    scores = scores.contiguous()
    tokens = tokens.to(torch.int64).contiguous()
    n = budget + 1
    out = {name: torch.empty(n, dtype=torch.int64, device=dev) for name in ("tokens", "parents", "depths", "ranks")}
    valid = torch.empty(n, dtype=torch.int8, device=dev)
    cp = int(pi.shape[0])
    surv = torch.empty(max(cp, 1), dtype=torch.int64, device=dev)
    meta = torch.empty(4 * depth * bp, dtype=torch.int32, device=dev)
    beam = torch.empty(bp, dtype=torch.int64, device=dev)
    node_of = torch.empty((depth + 1) * bp, dtype=torch.int32, device=dev)
    cb = min(1024, max(16, next_pow2(cp)))
    _select_kernel[(1,)](scores, tokens, k, pi, pr, plen, root.view(-1)[:1].to(torch.int64),
                         out["tokens"], out["parents"], out["depths"], out["ranks"], valid,
                         surv, meta, beam, node_of, vis if vis is not None else valid,
                         depth, k, budget, BP=bp, LOGBP=bp.bit_length() - 1, CB=cb, NP=next_pow2(n),
                         W1=min(bp, 32), W2=min(bp, 64), W3=min(bp, 128), WITH_VIS=vis is not None,
                         SPINE_TREE=bool(spine), num_warps=num_warps or _warps(2 * bp))
    out["valid"] = valid.view(torch.bool)
    if vis is not None:
        out["visibility"] = vis[: n * n].view(n, n).view(torch.bool)
    return out

