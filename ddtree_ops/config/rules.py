"""The rules that span a profile's fields: backends and quantisation the GPU cannot run, windows
that contradict each other, flags rendered twice, SGLang's own rules for parallel sizes. Each rule
returns the key path to blame and why; `validate.py` names the file and line.
"""

from __future__ import annotations

from typing import get_args

from ddtree_ops.config.model import INHERITED, AttentionBackend, DDTreeMode, Profile
from ddtree_ops.config.source import Loc

# facts/sglang-ddtree.md 7.3: sm_120 has no FA3 (SM 8x-9x only), no FA4 / trtllm (tcgen05, SM100/103 only)
_BACKEND_ARCH = {
    "fa3": (80, 90),
    "fa4": (100, 103),
    "trtllm_mha": (100, 103),
    "trtllm_mla": (100, 103),
    "cutlass_mla": (100, 103),
}
# Quantization schemes that need FP8/FP4 tensor cores (sm_89+ / sm_100+); sm_86 runs plain
# "fp8" checkpoints as weight-only Marlin, which is allowed.
_QUANT_MIN_ARCH = {"w8a8_fp8": 89, "modelopt_fp4": 100, "nvfp4": 100, "mxfp4": 100, "fp4": 100}


# flags `render.launch_argv` writes from profile keys: extra_args may not say them twice
RENDERED_FLAGS = {
    "--model-path": "service.model_path", "--host": "service.listen_host", "--port": "service.port",
    "--mem-fraction-static": "memory.mem_fraction_static", "--context-length": "memory.context_length",
    "--max-running-requests": "memory.max_running_requests", "--attention-backend": "memory.attention_backend",
    "--served-model-name": "service.served_model_name", "--dtype": "memory.dtype",
    "--kv-cache-dtype": "memory.kv_cache_dtype", "--page-size": "memory.page_size",
    "--quantization": "memory.quantization", "--chunked-prefill-size": "memory.chunked_prefill_size",
    "--disable-cuda-graph": "memory.cuda_graph", "--cuda-graph-max-bs-decode": "memory.cuda_graph_max_bs",
    "--speculative-algorithm": "modes.<mode>.algorithm",
    "--speculative-draft-model-path": "modes.<mode>.draft_model_path",
    "--speculative-num-draft-tokens": "modes.<mode>.block_size / num_draft_tokens",
    "--speculative-num-steps": "modes.nextn.num_steps", "--speculative-eagle-topk": "modes.nextn.eagle_topk",
    "--speculative-draft-attention-backend": "modes.<mode>.draft_attention_backend",
    "--tp-size": "parallel.tp_size", "--tensor-parallel-size": "parallel.tp_size", "--tp": "parallel.tp_size",
    "--dp-size": "parallel.dp_size", "--data-parallel-size": "parallel.dp_size", "--dp": "parallel.dp_size",
    "--pp-size": "parallel.pp_size", "--pipeline-parallel-size": "parallel.pp_size",
    "--ep-size": "parallel.ep_size", "--expert-parallel-size": "parallel.ep_size", "--ep": "parallel.ep_size",
    "--nnodes": "multinode.nodes", "--node-rank": "multinode.nodes (the order)",
    "--dist-init-addr": "multinode.dist_init_host / dist_init_port",
    "--nccl-init-addr": "multinode.dist_init_host / dist_init_port", "--dist-timeout": "multinode.dist_timeout_s",
    "--base-gpu-id": "gpus", "--gpu-id-step": "gpus",
}


def allowed_backends(arch: int) -> list[str]:
    """The attention backends a profile may name on sm_<arch> (the rule check_rules applies)."""
    return [b for b in get_args(AttentionBackend)
            if b not in _BACKEND_ARCH or _BACKEND_ARCH[b][0] <= arch <= _BACKEND_ARCH[b][1]]


def check_rules(p: Profile) -> list[tuple[Loc, str]]:
    """Rules that span fields; each returns the key path to blame and why."""
    out: list[tuple[Loc, str]] = []
    arch = p.arch_number

    def backend_ok(loc: Loc, backend: str | None) -> None:
        if backend in _BACKEND_ARCH:
            lo, hi = _BACKEND_ARCH[backend]
            if not lo <= arch <= hi:
                out.append((loc, f"{backend!r} needs sm_{lo}..sm_{hi}; this host is {p.gpu.arch} "
                                 "(use flashinfer or triton)"))

    backend_ok(("memory", "attention_backend"), p.memory.attention_backend)
    for name in ("dflash", "ddtree-shadow", "ddtree"):
        cfg = {"dflash": p.modes.dflash, "ddtree-shadow": p.modes.ddtree_shadow, "ddtree": p.modes.ddtree}[name]
        if cfg is not None:
            backend_ok(("modes", name, "draft_attention_backend"), cfg.draft_attention_backend)
    out += _tree_rules(p)
    q = p.memory.quantization
    if q and q in _QUANT_MIN_ARCH and arch < _QUANT_MIN_ARCH[q]:
        out.append((("memory", "quantization"),
                    f"{q!r} needs sm_{_QUANT_MIN_ARCH[q]}+ tensor cores; {p.gpu.arch} runs FP8 weight-only "
                    "(use 'fp8', which SGLang runs as W8A16 Marlin here)"))
    if p.gate.stay_healthy_s >= p.gate.startup_deadline_s:
        out.append((("gate", "stay_healthy_s"), "must be shorter than gate.startup_deadline_s"))
    if p.smoke.latency_warning_s > p.smoke.latency_critical_s:
        out.append((("smoke", "latency_warning_s"), "must not exceed smoke.latency_critical_s"))
    if p.smoke.accept_len_critical > p.smoke.accept_len_warning:
        out.append((("smoke", "accept_len_critical"), "must not exceed smoke.accept_len_warning"))
    if p.service.timeout_start_s < p.gate.startup_deadline_s:
        out.append((("service", "timeout_start_s"),
                    "must cover gate.startup_deadline_s, or systemd kills a start the gate still waits for"))
    if p.service.start_limit_interval_s <= p.service.restart_sec * p.service.start_limit_burst:
        out.append((("service", "start_limit_interval_s"),
                    "must exceed restart_sec x start_limit_burst, or the start limit never trips"))
    configured = p.configured_modes()
    for key, value in (("mode", p.desired_mode), ("known_good_mode", p.known_good_mode)):
        if value not in configured:
            out.append(((key,), f"{value!r} is not configured under modes (configured: {', '.join(configured)})"))
    if p.host.transport == "ssh" and not p.host.ssh_host:
        out.append((("host", "ssh_host"), "required when host.transport is ssh (the ssh_config name of the host)"))
    rendered = RENDERED_FLAGS
    for i, arg in enumerate(p.service.extra_args):
        flag = arg.split("=", 1)[0]
        if flag in rendered:
            out.append((("service", "extra_args", str(i)), f"{flag} is rendered from {rendered[flag]}; set it there"))
    out += _parallel_rules(p)
    for name, ref in p.service.secrets.items():
        if ref.startswith("file:") and not ref[5:].startswith("/"):
            out.append((("service", "secrets", name), "file: references need an absolute path"))
    clash = set(p.service.env) & set(p.service.secrets)
    for name in sorted(clash):
        out.append((("service", "secrets", name), "also set in service.env; keep it in one place"))
    return out


def _tree_rules(p: Profile) -> list[tuple[Loc, str]]:
    """The served tree (mode ddtree) is the tree the shadow (ddtree-shadow) measured: promote moves a host
    from one to the other on the shadow's prediction, which holds only for the same draft, block size,
    budget and draft attention backend (left out, mode ddtree takes the shadow's). The tree is built
    from the draft's top-K, which needs an unsharded LM head."""
    out: list[tuple[Loc, str]] = []
    tree, shadow = p.modes.ddtree, p.modes.ddtree_shadow
    if tree is None:
        return out
    if shadow is not None:
        for key in INHERITED:
            given = getattr(tree, key)
            if given is not None and given != getattr(shadow, key):
                out.append((("modes", "ddtree", key), f"{given!r} differs from modes.ddtree-shadow.{key} "
                                                      f"{getattr(shadow, key)!r}: the served tree must be the one the "
                                                      "shadow measured (promote acts on its prediction); leave it out "
                                                      "to take the shadow's"))
    elif tree.draft_model_path is None:
        out.append((("modes", "ddtree"), "draft_model_path is required when modes.ddtree-shadow is not configured "
                                         "(otherwise the tree takes the shadow's draft, block size and budget)"))
        return out
    cfg = p.mode("ddtree")
    assert isinstance(cfg, DDTreeMode)
    if cfg.budget is not None and cfg.block_size is not None and cfg.budget < cfg.block_size - 1:
        out.append((("modes", "ddtree", "budget"), f"{cfg.budget} is below the draft horizon {cfg.block_size - 1} "
                                                   "(block_size - 1): the tree could not hold the chain's spine, and "
                                                   "the plugin refuses it"))
    if p.sizes.tp_size > 1 and "ddtree" in (p.desired_mode, p.known_good_mode):
        out.append((("parallel", "tp_size"), f"{p.sizes.tp_size} with mode ddtree: the served tree is built from the "
                                             "draft's top-K, read from an unsharded LM head (the plugin refuses "
                                             "tp > 1 in tree mode; ddtree-shadow serves the chain there)"))
    return out


def _parallel_rules(p: Profile) -> list[tuple[Loc, str]]:
    """SGLang's own rules for parallel sizes, checked before anything reaches a host (the model's
    head counts are checked at preflight, where its config.json is read)."""
    out: list[tuple[Loc, str]] = []
    z = p.sizes
    nn = p.nnodes
    where = ("parallel", "tp_size")
    if z.tp_size % z.ep_size:
        out.append((("parallel", "ep_size"), f"{z.ep_size} does not divide tp_size {z.tp_size}: experts are split "
                                             "inside the tensor-parallel group (SGLang: tp = ep x moe_dp x moe_tp)"))
    if p.multinode is not None:
        m = p.multinode
        if (z.tp_size * z.pp_size) % nn:
            out.append((where, f"tp_size x pp_size = {z.tp_size * z.pp_size} does not divide over the {nn} nodes of "
                               "multinode.nodes (SGLang: 'tp_size must be divisible by number of nodes')"))
        if z.dp_size > 1:
            out.append((("parallel", "dp_size"), "data-parallel replicas cannot span nodes (SGLang refuses --dp-size "
                                                 "with --nnodes > 1; deploy one service per replica)"))
        seen: set[str] = set()
        for i, node in enumerate(m.nodes):
            if node in seen:
                out.append((("multinode", "nodes", str(i)), f"{node!r} is listed twice"))
            seen.add(node)
        if not 0 <= m.node_rank < nn:
            out.append((("multinode", "node_rank"), f"{m.node_rank} is not a rank of {nn} nodes"))
    if z.world % nn:
        return out
    per_node = z.world // nn
    sizes = f"dp {z.dp_size} x tp {z.tp_size} x pp {z.pp_size} = {z.world} rank(s)" + (
        f" over {nn} nodes = {per_node} per node" if nn > 1 else "")
    if p.gpus is None:
        if per_node > 1:
            out.append((where, f"{sizes}: list the {per_node} cards each node gives the service in gpus "
                               f"(e.g. gpus: {list(range(per_node))})"))
        return out
    if len(p.gpus) != per_node:
        out.append((("gpus",), f"{len(p.gpus)} card(s) listed, but {sizes}: SGLang starts one rank per card"))
    seen_idx: dict[int, int] = {}
    for i, c in enumerate(p.gpus):
        if c.index in seen_idx:
            out.append((("gpus", str(i), "index"), f"card {c.index} is listed twice (also gpus.{seen_idx[c.index]})"))
        seen_idx.setdefault(c.index, i)
    archs = {c.arch for c in p.cards()}
    if len(archs) > 1:
        out.append((("gpus",), f"the cards mix architectures ({', '.join(sorted(archs))}): every rank runs the same "
                               "kernels and backends, so a service's cards share one"))
    elif archs and archs != {p.gpu.arch}:
        (arch,) = archs
        for loc, backend in [(("memory", "attention_backend"), p.memory.attention_backend)]:
            if backend in _BACKEND_ARCH and not _BACKEND_ARCH[backend][0] <= int(arch[3:]) <= _BACKEND_ARCH[backend][1]:
                out.append((loc, f"{backend!r} does not run on the service's {arch} cards (use flashinfer or triton)"))
    return out
