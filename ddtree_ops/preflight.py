"""Preflight: everything that can be known before a restart, checked before anything changes.

Each check returns a `Check` (ok / warn / fail, with the numbers behind it); any `fail` refuses
the deploy with exit 3 and nothing on the host touched. Reads are batched so the whole
preflight is a handful of SSH round trips.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ddtree_ops import memory
from ddtree_ops.draftcheck import check_compat, check_target_layer_ids, judge_capture
from ddtree_ops.engine.sglang_settings import version_problem
from ddtree_ops.gpu import GpuSnapshot, card_verdicts, driver_verdict, snapshot
from ddtree_ops.host import Host, Result
from ddtree_ops.hostsglang import SGLANG_CHECK, sglang_check  # noqa: F401  (SGLANG_CHECK: tests run it)
from ddtree_ops.observe import read_files
from ddtree_ops.profile import DDTreeMode, DDTreeShadowMode, DflashMode, Profile
from ddtree_ops.releases import Layout
from ddtree_ops.render import Rendered

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CardRow:
    """One card the service owns, as preflight found it (MiB), and the rank SGLang puts on it."""

    index: int
    name: str
    total_mib: int
    free_mib: int
    ours_mib: int  # held by the service's own unit now (freed by the restart)
    others_mib: int  # held by anything else: stays taken
    rank: str  # "TP0", "TP1", ... ("-" for a single-rank service)

    @property
    def free_for_service(self) -> int:
        return min(self.total_mib, self.free_mib + self.ours_mib)


@dataclass
class Shapes:
    """What preflight read about the model and the draft, for sizing the KV pool again with the
    least free memory of a multi-node service's every card."""

    target: memory.ModelShape
    weights: int
    draft: memory.ModelShape | None = None
    draft_weights: int = 0


@dataclass
class Preflight:
    checks: list[Check] = field(default_factory=list)
    memory: memory.MemoryPlan | None = None
    gpu: GpuSnapshot | None = None
    installed_unit: str | None = None
    installed_env: str | None = None
    plugin_needed: bool = False  # the ddtree plugin must be (re)installed in the host venv
    sglang_version: str | None = None
    cards: list[CardRow] = field(default_factory=list)
    shapes: Shapes | None = None
    free_mib: int | None = None  # the free memory the KV pool was sized from (the least card's, for the service)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    @property
    def ok(self) -> bool:
        return not self.failed

    def add(self, name: str, status: str, detail: str, **data: Any) -> Check:
        check = Check(name, status, detail, data)
        self.checks.append(check)
        return check

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": [c.__dict__ for c in self.checks],
                "memory": None if self.memory is None else {
                    k: v for k, v in self.memory.__dict__.items()},
                "gpu": None if self.gpu is None else self.gpu.to_json(),
                "cards": [dict(c.__dict__, free_for_service_mib=c.free_for_service) for c in self.cards]}

    def replace(self, name: str, check: Check) -> None:
        self.checks = [check if c.name == name else c for c in self.checks]


def _json(data: bytes | None) -> dict[str, Any] | None:
    if data is None:
        return None
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def _draft_path(p: Profile, mode: str) -> str | None:
    return p.mode(mode).draft_model_path


def rank_labels(p: Profile) -> list[str]:
    """SGLang's name of the rank on each of this node's cards (its log prefix: TP0, TP1, ...)."""
    z = p.sizes
    if z.world == 1:
        return ["-"] * len(p.cards())
    first = (p.multinode.node_rank if p.multinode else 0) * p.ranks_per_node
    out = []
    for i in range(len(p.cards())):
        dp, rest = divmod(first + i, z.tp_size * z.pp_size)
        pp, tp = divmod(rest, z.tp_size)
        out.append((f"DP{dp} " if z.dp_size > 1 else "") + (f"PP{pp} " if z.pp_size > 1 else "") + f"TP{tp}")
    return out


def check_gpu(pf: Preflight, p: Profile, snap: GpuSnapshot) -> None:
    pf.gpu = snap
    if not snap.gpus:
        pf.add("gpu", FAIL, "no GPU visible on the host: " + "; ".join(snap.errors or ["probe returned nothing"]))
        return
    cards = p.cards()
    indexes = [c.index for c in cards]
    missing = [c.index for c in cards if snap.card(c.index) is None]
    for c, label in zip(cards, rank_labels(p)):
        g = snap.card(c.index)
        if g is None:
            continue
        ours = sum(a.used_mib for a in snap.apps_on(c.index) if a.unit == p.service.unit)
        pf.cards.append(CardRow(c.index, g.name, g.memory_total_mib, g.memory_free_mib, ours,
                                max(g.memory_used_mib - ours, 0), label))
    wrong = [(c, g) for c in cards if (g := snap.card(c.index)) is not None and g.arch != c.arch]
    gpu = snap.card(indexes[0]) or snap.gpus[0]
    if len(snap.gpus) < p.gpu.count:
        pf.add("gpu", FAIL, f"{len(snap.gpus)} GPU(s) visible, the profile expects {p.gpu.count} (gpu.count)"
                            + _ranks_need(p))
    elif missing:
        seen = ", ".join(str(g.index) for g in snap.gpus)
        pf.add("gpu", FAIL, f"card{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of gpus "
                            f"{'are' if len(missing) > 1 else 'is'} not on the host (it has {len(snap.gpus)}: {seen})"
                            + _ranks_need(p))
    elif wrong:
        c, g = wrong[0]
        pf.add("gpu", FAIL, f"{g.name} is {g.arch}, the profile says {c.arch}: backend rules "
                            "(facts 7.3) were checked for the wrong architecture")
    elif p.gpus is None:
        drift = abs(gpu.memory_total_mib - p.gpu.memory_mib) / p.gpu.memory_mib
        status = WARN if drift > 0.05 or gpu.name != p.gpu.model else OK
        pf.add("gpu", status, f"{len(snap.gpus)} x {gpu.name} ({gpu.arch}), {gpu.memory_free_mib / 1024:.1f} of "
                              f"{gpu.memory_total_mib / 1024:.1f} GiB free ({gpu.memory_free_mib:,} of "
                              f"{gpu.memory_total_mib:,} MiB, via {snap.source})"
                              + ("" if status == OK else f"; profile says {p.gpu.model}, {p.gpu.memory_mib:,} MiB"))
    else:
        drifted = [f"card {c.index} is {g.name}, {g.memory_total_mib:,} MiB (profile: {c.model}, {c.memory_mib:,} MiB)"
                   for c in cards if (g := snap.card(c.index)) is not None
                   and (abs(g.memory_total_mib - c.memory_mib) / c.memory_mib > 0.05 or g.name != c.model)]
        free = ", ".join(f"{r.index}: {r.free_mib:,}" for r in pf.cards)
        pf.add("gpu", WARN if drifted else OK,
               f"cards {', '.join(map(str, indexes))} of {len(snap.gpus)} for this service ({len(cards)} x "
               f"{gpu.name}, {gpu.arch}); MiB free per card {free} (via {snap.source})"
               + ("; " + "; ".join(drifted) if drifted else ""))
    strays = snap.strays(p.service.unit, indexes)
    uuid_index = {g.uuid: g.index for g in snap.gpus}
    if strays:
        listing = ", ".join((f"card {uuid_index.get(a.gpu_uuid, '?')}: " if p.gpus is not None else "")
                            + f"pid {a.pid} {a.name or ''} {a.used_mib:,} MiB ({a.unit or 'no unit'})".replace("  ", " ")
                            for a in strays)
        pf.add("gpu-processes", WARN, f"processes outside {p.service.unit} hold GPU memory: {listing}; "
                                      "stray workers of an earlier run cause false 'Not enough memory' failures",
               strays=[a.__dict__ for a in strays])
        imbalance = _imbalance(pf.cards)
        if imbalance:
            pf.add("gpu-balance", WARN, imbalance)
    else:
        where = f" on cards {', '.join(map(str, indexes))}" if p.gpus is not None else ""
        pf.add("gpu-processes", OK, f"no process outside the service holds GPU memory{where}")
    _check_cards(pf, p, snap, indexes)


def _ranks_need(p: Profile) -> str:
    """What the parallel sizes ask of the node's cards, when they are why it needs several."""
    if p.parallel is None or p.ranks_per_node <= 1:
        return ""
    z = p.sizes
    return (f"; parallel.tp_size {z.tp_size} x pp_size {z.pp_size} x dp_size {z.dp_size} puts {p.ranks_per_node} "
            "ranks on this node, one per card")


def _check_cards(pf: Preflight, p: Profile, snap: GpuSnapshot, indexes: list[int]) -> None:
    """Cards present but not usable (MIG, compute mode) and the driver against the host's torch."""
    issues = card_verdicts(snap, indexes, p.service.unit)
    if issues:
        status = FAIL if any(st == "fail" for st, _ in issues) else WARN
        pf.add("gpu-cards", status, "; ".join(d for _, d in sorted(issues, key=lambda i: i[0] != "fail")))
    else:
        read = [g for i in indexes if (g := snap.card(i)) is not None and (g.mig_mode or g.compute_mode)]
        if read:
            pf.add("gpu-cards", OK, "; ".join(f"{g.label}: MIG {g.mig_mode or 'not supported'}, compute mode "
                                              f"{g.compute_mode or '?'}" for g in read))
    drv = driver_verdict(snap)
    if drv is not None:
        pf.add("driver", drv[0], drv[1])


def _imbalance(cards: list[CardRow]) -> str:
    """SGLang's own TP memory balance rule (distributed/bootstrap.py, _check_tp_memory_balance): the
    least free memory across ranks below 0.9 x a rank's own means another process holds part of
    some card; every rank's pool is then sized for the least (0.5.23 warns; with
    SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK it refuses to start)."""
    if len(cards) < 2:
        return ""
    least = min(cards, key=lambda r: r.free_for_service)
    most = max(cards, key=lambda r: r.free_for_service)
    if least.free_for_service >= 0.9 * most.free_for_service:
        return ""
    return (f"card {least.index} has {least.free_for_service:,} MiB free for the service, card {most.index} "
            f"{most.free_for_service:,}: SGLang sizes every rank's KV pool from the least "
            "('The memory capacity is unbalanced. Some GPUs may be occupied by other processes.')")


def check_models(pf: Preflight, p: Profile, mode: str, files: dict[str, bytes | None]) -> None:
    s = p.service
    target_cfg = _json(files.get(f"{s.model_path}/config.json"))
    if target_cfg is None:
        pf.add("model", FAIL, f"{s.model_path}/config.json is missing or unreadable on the host "
                              "(SGLang would treat the path as a Hub repo id and fail)")
        return
    try:
        target = memory.model_shape(target_cfg)
    except ValueError as exc:
        pf.add("model", FAIL, f"{s.model_path}/config.json: {exc}")
        return
    index = _json(files.get(f"{s.model_path}/model.safetensors.index.json"))
    weights = memory.weights_bytes(target_cfg, index)
    pf.add("model", OK, f"{target.architecture or 'model'}: {target.layers} layers, {target.kv_heads} KV heads x "
                        f"{target.head_dim}, {weights / memory.GIB:.1f} GiB weights")
    _check_context(pf, p, target_cfg)
    draft_cfg, draft_shape, draft_weights = None, None, 0
    draft = _draft_path(p, mode)
    if draft:
        draft_cfg = _json(files.get(f"{draft}/config.json"))
        if draft_cfg is None:
            pf.add("draft", FAIL, f"{draft}/config.json is missing or unreadable on the host "
                                  f"(modes.{mode}.draft_model_path)")
            return
        draft_weights = memory.draft_weights_bytes(draft_cfg, target)
        draft_shape = memory.model_shape(draft_cfg)
        _check_draft(pf, p, mode, draft, draft_cfg, target_cfg)
    pf.shapes = Shapes(target, weights, draft_shape, draft_weights)
    if p.parallel is not None:
        check_parallel(pf, p, mode)
    plan_memory(pf, p, _free_for_service(pf, p), max(len(pf.cards), 1))


def _check_context(pf: Preflight, p: Profile, target_cfg: dict[str, Any]) -> None:
    """memory.context_length past the model's: SGLang refuses it at start (ModelConfig, in the
    main process, before any GPU work) unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN is set,
    then only warns. 0.5.17's parser catches it too; 0.5.23's does not, so preflight checks it
    itself."""
    derived = memory.model_context_length(target_cfg)
    want = p.memory.context_length
    if derived is None or want <= derived:
        return
    flag = str(p.service.env.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "")).strip().lower()
    said = (f"memory.context_length {want:,} is past the model's {derived:,} ({p.service.model_path}/config.json)")
    if flag in ("1", "true", "yes", "on"):
        pf.add("context", WARN, f"{said}; service.env sets SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN, so SGLang "
                                "only warns ('may lead to incorrect model outputs or CUDA errors')")
    else:
        pf.add("context", FAIL, f"{said}: SGLang stops at start with 'User-specified context_length ({want}) is "
                                f"greater than the derived context_length ({derived})'. Lower memory.context_length, "
                                "or set SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 in service.env if the model "
                                "really extrapolates")


def check_parallel(pf: Preflight, p: Profile, mode: str) -> None:
    """The model's heads against tp_size, the way SGLang splits them (the target's attention in
    models/qwen3.py / llama.py, the DFlash draft's in models/dflash.py); and what DDTREE's shadow
    accounting does with a sharded LM head."""
    shapes, z = pf.shapes, p.sizes
    if shapes is None:
        return
    problems = [x for x in (memory.tp_problem(shapes.target, z.tp_size),
                            memory.tp_problem(shapes.draft, z.tp_size, "the draft") if shapes.draft else None) if x]
    ranks = f"dp {z.dp_size} x tp {z.tp_size} x pp {z.pp_size}" + (f", ep {z.ep_size}" if z.ep_size > 1 else "")
    if problems:
        pf.add("parallel", FAIL, "; ".join(problems) + " (SGLang asserts this when it builds the attention layers); "
                                 f"use a tp_size that divides them ({ranks})")
    else:
        nodes = f" on {p.nnodes} nodes" if p.nnodes > 1 else ""
        pf.add("parallel", OK, f"{ranks}{nodes}: {memory.split_of(shapes.target, z.tp_size)}")
    if z.tp_size > 1 and isinstance(p.mode(mode), DDTreeMode):
        pf.add("tree", FAIL, f"tp_size {z.tp_size} with mode ddtree: the served tree is built from the draft's "
                             "per-position top-K, read from an unsharded LM head; the plugin refuses tree mode with "
                             "tp > 1 (deploy ddtree-shadow, which serves DFlash's chain there)")
    if z.tp_size > 1 and isinstance(p.mode(mode), DDTreeShadowMode):
        pf.add("shadow", WARN, f"tp_size {z.tp_size} shards the LM head across ranks: the DDTREE plugin reads the "
                               "draft's per-position distributions only from an unsharded head, so shadow accounting "
                               "stays off (DFlash serves as usual, the plugin logs that it is off, and smoke "
                               "reports no shadow rounds)")


def plan_memory(pf: Preflight, p: Profile, free_mib: int, cards: int) -> None:
    """The per-rank KV pool with SGLang's formula from the least free memory of the service's
    cards (`free_mib`); adds or replaces the `memory` check."""
    shapes = pf.shapes
    if shapes is None:
        return
    z = p.sizes
    kv = p.memory.kv_cache_dtype
    total = min((r.total_mib for r in pf.cards), default=pf.gpu.gpus[0].memory_total_mib
                if pf.gpu and pf.gpu.gpus else p.gpu.memory_mib)

    def at(tp: int, free: int = free_mib) -> memory.MemoryPlan:
        return memory.plan(
            gpu_total_mib=total, free_mib=free, target=shapes.target, weights=shapes.weights,
            draft_cell=shapes.draft.cell_bytes(kv, tp) if shapes.draft else 0, draft_weights=shapes.draft_weights,
            mem_fraction_static=p.memory.mem_fraction_static, context_length=p.memory.context_length,
            concurrency=p.memory.max_running_requests, kv_cache_dtype=kv, page_size=p.memory.page_size,
            speculative=True, cuda_graph_max_bs=p.memory.cuda_graph_max_bs or 0,
            chunked_prefill=p.memory.chunked_prefill_size, tp=tp, pp=z.pp_size, cards=cards)

    plan = at(z.tp_size)
    if not plan.fits:
        def valid(tp: int) -> bool:
            return (not memory.tp_problem(shapes.target, tp) and tp % z.ep_size == 0
                    and not (shapes.draft and memory.tp_problem(shapes.draft, tp)))

        more = memory.smallest_fitting_tp(lambda tp: at(tp).fits, valid, z.tp_size)
        if more is not None:
            bigger = at(more)
            per_node = more * z.pp_size * z.dp_size // p.nnodes
            hint = (f"parallel.tp_size={more} with {per_node} card{'s' if per_node > 1 else ''}"
                    f"{' per node' if p.nnodes > 1 else ''} in gpus (each rank then holds "
                    f"{bigger.weights_gib + bigger.draft_weights_gib:.1f} GiB of weights and a pool of "
                    f"{bigger.tokens:,} tokens)")
            # when the weights alone do not fit, more cards is the fix, not less context
            plan.suggestions.insert(0 if plan.tokens <= 0 else len(plan.suggestions), hint)
    pf.memory = plan
    pf.free_mib = free_mib
    if plan.problems:
        _strays_take_the_pool(pf, p, plan, lambda free: at(z.tp_size, free))
    if plan.problems:
        fixes = "; or ".join(plan.suggestions) if plan.suggestions else "a smaller model, quantization or more GPUs"
        why = plan.problems[0] if plan.tokens <= 0 else "that does not fit"
        check = Check("memory", FAIL, f"{plan.summary()}: {why}. Would fit: {fixes}",
                      dict(tokens=plan.tokens, needed=plan.needed_tokens, suggestions=plan.suggestions))
    else:
        check = Check("memory", WARN if plan.warnings else OK,
                      plan.summary() + ("; " + " ".join(plan.warnings) if plan.warnings else ""),
                      dict(tokens=plan.tokens, needed=plan.needed_tokens))
    if any(c.name == "memory" for c in pf.checks):
        pf.replace("memory", check)
    else:
        pf.checks.append(check)


def _strays_take_the_pool(pf: Preflight, p: Profile, plan: memory.MemoryPlan,
                          at: Any) -> None:
    """A card taken by another process beyond the service's budget: when the pool does not fit
    with what the other processes hold and would fit without them, they are the cause; the
    `gpu-processes` warning becomes a refusal naming them and what to change."""
    if pf.gpu is None:
        return
    cards = [c.index for c in p.cards()]
    strays = pf.gpu.strays(p.service.unit, cards)
    if not strays:
        return
    rows = pf.cards or [CardRow(0, g.name, g.memory_total_mib, g.memory_free_mib, 0, 0, "-") for g in pf.gpu.gpus[:1]]
    freed = min(min(r.total_mib, r.free_for_service + sum(a.used_mib for a in strays
                                                        if a.gpu_uuid == _uuid(pf.gpu, r.index)))
                for r in rows)
    without = at(freed)
    if without.problems:
        return
    labels = {g.uuid: g.label for g in pf.gpu.gpus}
    who = "; ".join(f"{labels.get(a.gpu_uuid, 'a card')}: pid {a.pid} {a.name or '?'} holds {a.used_mib:,} MiB "
                    f"({a.unit or 'no unit'})" for a in strays)
    pf.replace("gpu-processes", Check("gpu-processes", FAIL, (
        f"{who}: beyond what the service can spare. With it the KV pool holds {plan.tokens:,} tokens, without it "
        f"{without.tokens:,}; {p.memory.context_length:,} context x {p.memory.max_running_requests} requests "
        f"need {plan.needed_tokens:,}. Stop {'it' if len(strays) == 1 else 'them'} (kill {' '.join(str(a.pid) for a in strays)}"
        ") or choose other cards in gpus"), dict(strays=[a.__dict__ for a in strays])))


def _uuid(snap: GpuSnapshot, index: int) -> str:
    g = snap.card(index)
    return g.uuid if g else ""


def _free_for_service(pf: Preflight, p: Profile) -> int:
    """Free memory the new server will find on the least free of its cards: today's free plus what
    the service itself holds there (it is stopped by the restart); memory held by anything else
    stays taken. SGLang sizes every rank's pool from this minimum."""
    if pf.cards:
        return min(r.free_for_service for r in pf.cards)
    if not pf.gpu or not pf.gpu.gpus:
        return p.gpu.memory_mib
    gpu = pf.gpu.gpus[0]
    ours = sum(a.used_mib for a in pf.gpu.apps if a.unit == p.service.unit)
    return min(gpu.memory_total_mib, gpu.memory_free_mib + ours)


def _check_draft(pf: Preflight, p: Profile, mode: str, draft: str, draft_cfg: dict[str, Any],
                 target_cfg: dict[str, Any]) -> None:
    """The draft against the target, field by field as SGLang uses them (`draftcheck.check_compat`),
    and for DFlash-family drafts the captured layers (one rule with `diagnose HOST`). One `draft`
    line: the failures first, each naming both values and the profile keys."""
    cfg = p.mode(mode)
    key = f"modes.{mode}.draft_model_path"
    dflash = isinstance(cfg, (DflashMode, DDTreeShadowMode, DDTreeMode))
    block = cfg.block_size if dflash else None
    found = check_compat(draft_cfg, target_cfg, algorithm=cfg.algorithm, num_draft_tokens=block, draft_key=key,
                         target_key="service.model_path", block_key=f"modes.{mode}.block_size")
    fails = [m.detail for m in found if m.status == FAIL]
    warns = [m.detail for m in found if m.status == WARN]
    layers = check_target_layer_ids(draft_cfg, target_cfg) if dflash else None
    if layers is not None and layers.status == "fail":
        fails.append(f"{layers.detail} (a draft asking for them dies at the first request with "
                     f"'DFLASH target_hidden feature dim mismatch'; {key})")
    elif layers is not None and layers.status == "warn" and not any(m.field == "num_target_layers" for m in found):
        warns.append(layers.detail)
    fields = [m.field for m in found]
    if fails:
        pf.add("draft", FAIL, f"{draft}: " + "; ".join(fails + warns), mismatches=fields)
    elif warns:
        pf.add("draft", WARN, f"{draft}: " + "; ".join(warns), mismatches=fields)
    elif dflash:
        dfl = draft_cfg.get("dflash_config") or {}
        ids = list(layers.layer_ids or ()) if layers else []
        trained = draft_cfg.get("block_size") or dfl.get("block_size") or block
        pf.add("draft", OK, f"{draft}: DFlash draft, {len(ids)} captured target layers {ids}, block {trained}; "
                            f"hidden {_field(draft_cfg, 'hidden_size')}, vocab {_field(draft_cfg, 'vocab_size')} "
                            "as the target's")
    else:
        pf.add("draft", OK, f"{draft}: {_field(draft_cfg, 'num_hidden_layers')}-layer draft, hidden "
                            f"{_field(draft_cfg, 'hidden_size')}, vocab {_field(draft_cfg, 'vocab_size')} "
                            "as the target's")


def _field(cfg: dict[str, Any], name: str) -> Any:
    inner = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    return inner.get(name, cfg.get(name, "?"))


def check_sglang(pf: Preflight, p: Profile, mode: str, found: tuple[dict[str, Any] | None, str],
                 plugin_version: str) -> None:
    doc, error = found
    python = p.service.python
    algo = p.mode(mode).algorithm if isinstance(p.mode(mode), (DDTreeShadowMode, DDTreeMode)) else ""
    if doc is None:
        pf.add("sglang", FAIL, error)
        return
    pf.sglang_version = doc.get("sglang")
    if not doc.get("sglang"):
        pf.add("sglang", FAIL, f"sglang is not installed for {python}")
        return
    if doc.get("parse") != "ok":
        pf.add("launch-flags", FAIL, f"sglang {doc['sglang']} refuses the launch flags: {doc.get('parse')}")
    else:
        pf.add("launch-flags", OK, f"accepted by sglang {doc['sglang']}'s own parser on the host")
    if isinstance(p.mode(mode), (DflashMode, DDTreeShadowMode, DDTreeMode)):
        found = doc.get("capture")
        verdict = judge_capture(found if isinstance(found, dict) else None, doc["sglang"],
                                list((found or {}).get("architectures") or []))
        if verdict.status != "skip":
            pf.add("capture", verdict.status, verdict.detail)
    if algo:
        installed = doc.get("ddtree-ops")
        alg = doc.get("algorithm") or {}
        unsupported = version_problem(doc["sglang"])
        if unsupported:
            pf.add("plugin", FAIL, f"{unsupported}: the DFlash worker the shadow hooks into differs between "
                                   "releases; install a supported sglang in the host venv, or a ddtree-ops that "
                                   "lists this one")
        elif installed != plugin_version:
            pf.plugin_needed = True
            pf.add("plugin", OK, f"ddtree plugin {installed or 'not installed'} in {python}: this deploy installs "
                                 f"{plugin_version}")
        elif "error" in alg:
            pf.add("plugin", FAIL, f"DDTREE does not resolve on the host: {alg['error']}")
        elif not alg.get("dflash_family"):
            pf.add("plugin", FAIL, "DDTREE resolves but is not DFlash-family: SGLang will not set up target "
                                   "hidden-state capture (the failure this tool exists for)")
        else:
            pf.add("plugin", OK, f"ddtree plugin {installed} registers DDTREE as DFlash-family ({alg.get('resolved')})")
        if isinstance(p.mode(mode), DDTreeMode) and not unsupported:
            check_tree_backend(pf, doc)


def check_tree_backend(pf: Preflight, doc: dict[str, Any]) -> None:
    """Mode ddtree serves through a tree verify backend declared on the host for its SGLang release
    (entry point group ddtree_ops.tree_verify): the wheel declares 0.5.17's (issue 33), the
    lab's stand-in its simulated one. Without one the server would refuse to start."""
    # the plugin's own rule (which release a declaration covers), pure: no torch, no sglang
    from ddtree_ops.engine.sglang_backend import NO_BACKEND, declared

    found = doc.get("tree_backends")
    if not isinstance(found, dict) or "error" in found:
        why = (found or {}).get("error", "the host did not say") if isinstance(found, dict) else "the host did not say"
        pf.add("tree", FAIL, f"cannot tell whether a tree verify backend is declared on the host: {why}")
        return
    value = declared(found, doc["sglang"])
    if value is None:
        pf.add("tree", FAIL, "mode ddtree: " + NO_BACKEND.format(version=doc["sglang"]))
    else:
        pf.add("tree", OK, f"tree verify backend {value} declared for sglang {doc['sglang']}")


VERIFY_IGNORE = ("Unit sysinit.target not found",)


def verify_unit(host: Host, rendered: Rendered) -> Result:
    """systemd-analyze verify on the host, on a staged copy under the unit's real file name."""
    script = ('d=$(mktemp -d /tmp/ddtree-ops-verify.XXXXXX) || exit 1; f="$d/$1"; cat > "$f"; '
              'systemd-analyze verify -- "$f" 2>&1; rc=$?; rm -rf -- "$d"; exit $rc')
    return host.run(["sh", "-c", script, "sh", rendered.unit_name], stdin=rendered.unit_text.encode(), timeout=60)


def check_unit(pf: Preflight, res: Result, rendered: Rendered) -> None:
    lines = [ln for ln in res.stdout.splitlines()
             if rendered.unit_name in ln and not any(i in ln for i in VERIFY_IGNORE)]
    if lines or (res.rc != 0 and not res.stdout.strip()):
        pf.add("unit", FAIL, "systemd-analyze verify: " + ("; ".join(lines) or res.stderr.strip()[:300]))
    else:
        pf.add("unit", OK, f"systemd-analyze verify passes for {rendered.unit_name} on the host")


def memory_preflight(host: Host, p: Profile, mode: str) -> Preflight:
    """Only the GPU facts and the model checks (memory fit included), for measuring the fit
    against a real start (bench/realsglang's memory probes): what `run_preflight` does with them,
    without SGLang's parser or systemd-analyze."""
    from concurrent.futures import ThreadPoolExecutor

    pf = Preflight()
    s = p.service
    paths = [f"{s.model_path}/config.json", f"{s.model_path}/model.safetensors.index.json"]
    draft = _draft_path(p, mode)
    if draft:
        paths.append(f"{draft}/config.json")
    with ThreadPoolExecutor(2) as pool:
        f_files = pool.submit(read_files, host, paths)
        f_gpu = pool.submit(snapshot, host, s.python)
        files = f_files.result()
    check_gpu(pf, p, f_gpu.result())
    check_models(pf, p, mode, files)
    return pf


def run_preflight(host: Host, p: Profile, mode: str, rendered: Rendered, layout: Layout,
                  plugin_version: str) -> Preflight:
    """The four reads run side by side on the one SSH connection (each is a round trip, one
    imports SGLang on the host); the checks then judge what came back, in a fixed order."""
    from concurrent.futures import ThreadPoolExecutor

    pf = Preflight()
    s = p.service
    paths = [f"{s.model_path}/config.json", f"{s.model_path}/model.safetensors.index.json",
             rendered.unit_path, rendered.env_path]
    draft = _draft_path(p, mode)
    if draft:
        paths.append(f"{draft}/config.json")
    with ThreadPoolExecutor(4) as pool:
        f_files = pool.submit(read_files, host, paths)
        f_gpu = pool.submit(snapshot, host, s.python)
        f_sglang = pool.submit(sglang_check, host, p, mode, rendered, layout, plugin_version)
        f_unit = pool.submit(verify_unit, host, rendered)
        files = f_files.result()
    installed_unit, installed_env = files.get(rendered.unit_path), files.get(rendered.env_path)
    pf.installed_unit = installed_unit.decode() if installed_unit is not None else None
    pf.installed_env = installed_env.decode() if installed_env is not None else None
    check_gpu(pf, p, f_gpu.result())
    check_models(pf, p, mode, files)
    check_sglang(pf, p, mode, f_sglang.result(), plugin_version)
    check_unit(pf, f_unit.result(), rendered)
    return pf
