"""The SGLang plugin: DDTREE as a DFlash-family speculative algorithm (sglang 0.5.17 and 0.5.23).

The story this fixes: SGLang wires the target's hidden-state capture (`target_layer_ids`,
`set_dflash_layers_to_capture`), the draft KV pool, the DFlash verify input and the CUDA-graph
spec info behind `spec_algorithm.is_dflash()` / `is_dflash_family()`. A plugin algorithm is a
`CustomSpecAlgo`, whose predicates all answer False: registered plainly, DDTREE gets no capture
and dies at serving time. Worse, a plain `CustomSpecAlgo` lacks `create_future_map`,
`carries_draft_hidden_states` and `need_topk`, which 0.5.23's scheduler calls on every algorithm.

`DDTreeSpecAlgo` answers every predicate as DFLASH does (it delegates to the enum member, so the
answers cannot drift apart), runs DFLASH's own server-args hook, and adds the scheduler methods.
The worker is SGLang's DFlash V2 worker plus shadow accounting (`sglang_worker.py`): the
committed path is DFlash's chain, so DFLASH's answers are the right ones everywhere.

Entry point (pyproject): `[project.entry-points."sglang.srt.plugins"] ddtree = ...:register`.
SGLang runs it from `load_plugins()` when `SGLANG_PLUGINS` is unset or names `ddtree`, before
it sets up logging: registration is therefore announced on stderr (which reaches the journal),
and the worker logs the hidden-capture layers once SGLang's logging is up. Settings and the
table of supported SGLang releases live in `sglang_settings`; an unsupported release is refused
by the validator with the releases that work, never served silently. Imports here are sglang's
and the standard library's; the engine modules (torch) load inside the worker.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from ddtree_ops.engine.sglang_settings import (
    MAX_HORIZON,
    NAME,
    PLUGIN,
    SUPPORTED,
    read_settings,
    sglang_version,
    version_problem,
)

logger = logging.getLogger(__name__)

# (where, what it gates, what DDTREE gets) for every predicate site in sglang 0.5.23 that
# decides DFlash behaviour; docs/engine.md renders this table.
SITES: tuple[tuple[str, str, str], ...] = (
    ("model_runner_components/spec_aux_hidden_state.py `_resolve_dflash_aux_hidden_state`",
     "is_dflash_family() and not draft: parse the draft's dflash_config, resolve target_layer_ids, "
     "dflash_use_aux_hidden_state=True", "taken: target hidden capture configured (the fix)"),
    ("model_runner.py `configure_kv_cache_dtype` (is_dflash=is_dflash_family())",
     "draft KV dtype for the fa4 draft backend", "as DFLASH"),
    ("model_runner_components/misc_utils.py `resolve_aux_hidden_states_width`",
     "packed aux hidden-state buffer width for the target", "as DFLASH"),
    ("model_runner_components/kv_pool_runtime.py", "DFlash draft KV pool sharing the target's allocator",
     "as DFLASH"),
    ("pool_configurator.py :111, :318", "combined target+draft KV cell size (memory fit)", "as DFLASH"),
    ("mem_cache/kv_cache_configurator.py :371, :836, :1105, :1121, :1202, :1214, :1396",
     "draft KV layers in the pool, draft window, fa4 draft dtype", "as DFLASH"),
    ("mem_cache/hybrid_cache/hybrid_pool_assembler.py :1784 (is_dflash)", "hybrid (Mamba) pools with a DFlash draft",
     "as DFLASH"),
    ("runner/decode_cuda_graph_runner.py :549, :1439, :1586, :1658, :2106",
     "graph metadata glue and the DFlashVerifyInput built for capture (FULL hidden capture on the target)",
     "as DFLASH"),
    ("runner/decode_cuda_graph_runner.py :365, runner/base_runner.py :512 (supports_target_verify_for_draft)",
     "draft runs TARGET_VERIFY graphs", "True, as DFLASH"),
    ("runner/prefill_cuda_graph_runner.py :421", "prefill graphs with aux hidden capture", "as DFLASH"),
    ("runner_utils/shared_read_event.py (supports_prefill_shared_read_done)", "prefill shared-buffer read end",
     "True, as DFLASH"),
    ("managers/scheduler.py :1231 (min-free-slots delay), :3144 (validate_dflash_request)",
     "DFlash request limits (no return_logprob, no grammar...)", "as DFLASH"),
    ("managers/scheduler.py :1540 carries_draft_hidden_states(), :1681 create_future_map()",
     "PD wire schema; overlap future map. Missing on CustomSpecAlgo: AttributeError at scheduler start",
     "defined: False / FutureMap(self), as DFLASH"),
    ("managers/overlap_utils.py :381 need_topk()", "top-k relay buffers. Missing on CustomSpecAlgo",
     "defined: False, as DFLASH"),
    ("managers/schedule_batch.py :2724, scheduler.py :4698 (supports_grammar_overlap)", "grammar + spec overlap",
     "True, as DFLASH"),
    ("managers/scheduler_components/internal_state.py :198 (is_dflash)", "accept-threshold updates vs sampling masks",
     "as DFLASH"),
    ("speculative/base_spec_worker.py :186, spec_utils.py :1259, spec_sampling_mask.py :26, :39",
     "DFlash verify/sampling-mask plumbing", "as DFLASH"),
    ("speculative/draft_parallel.py :23, :74 (is_dflash)", "draft TP layout", "as DFLASH"),
    ("speculative/spec_info.py build_disagg_draft_input (is_dflash)", "PD-disaggregated draft input",
     "delegated to DFLASH's (but disaggregation is refused by the validator)"),
    ("arg_groups/speculative_hook.py handle_speculative_decoding -> algo.handle_server_args",
     "_handle_dflash: draft path, block size, num_steps/topk=1, draft attention backend, max_running_requests",
     "DDTREE runs _handle_dflash itself, after its own validator"),
    ("arg_groups/speculative_hook.py :1108, validation_hook.py :232 (supports_mixed_chunk)", "--enable-mixed-chunk",
     "True, as DFLASH"),
    ("arg_groups/overrides.py :1835 (is_dflash_family)", "speculative defaults", "as DFLASH"),
    ("models/kimi_k3.py :2430 (is_dflash_family)", "Kimi K3 aux capture", "as DFLASH"),
    ("speculative/spec_utils.py :407 spec_need_hidden_states() (name in STANDALONE/DFLASH/DSPARK; 0.5.17 :253)",
     "FutureMap relays draft hidden states",
     "NOT as DFLASH by SGLang (string test), and not harmless: DFlash's draft input carries an empty (bs, 0) "
     "hidden-state tensor, not None, so the map would allocate a buffer and scatter/gather it every round; the "
     "worker factory makes the function answer False in a DDTREE process (sglang_relay, logged)"),
    ("managers/scheduler_components/metrics_reporter.py :65 (enum members)",
     "forward-pass decode metrics snapshot", "NOT recorded for DDTREE (enum test); shadow figures are "
     "exported by the worker instead"),
    ("arg_groups/speculative_hook.py :176, :213 (name in EAGLE/EAGLE3/DFLASH)",
     "--speculative-use-block-verification; draft window warning", "block verification refused by the validator; "
     "the window warning is wrong for DDTREE (the DFlash worker honours the window)"),
    ("arg_groups/lora_hook.py :252, kv_cache_hook.py :593, :647, validation_hook.py :694, cp_tp_group_sharing_hook.py, "
     "disaggregation/mooncake/conn.py :949 (name tests)", "LoRA, unified memory, aux capture without draft, CP/TP "
     "sharing, PD transfer", "refused by the DDTREE validator with a clear message"),
    ("arg_groups/model_override_base.py :274 _forces_eagle_topk_one (name == 'DFLASH')",
     "attention-backend default picked with topk=1", "NOT as DFLASH: topk is declared 1 by _handle_dflash later"),
)


def _view(server_args: Any) -> Any:
    """Reads through SGLang's resolving view when there is one (declarations over raw input)."""
    try:
        from sglang.srt.arg_groups.overrides import resolving_view

        return resolving_view(server_args)
    except Exception:       # a plain namespace in tests, or an sglang without the view
        return server_args


def server_args_problems(server_args: Any, env: dict[str, str] | None = None) -> list[str]:
    """Everything wrong with a DDTREE launch, as sentences an operator can act on."""
    cfg = _view(server_args)
    get = lambda name, default=None: getattr(cfg, name, default)  # noqa: E731
    settings, problems = read_settings(env)
    unsupported = version_problem(sglang_version())
    if unsupported:
        problems.append(unsupported)
    if not get("speculative_draft_model_path"):
        problems.append("--speculative-draft-model-path is required: the tree is built from a DFlash block "
                        "drafter's per-position distributions (e.g. z-lab/Qwen3-8B-DFlash-b16)")
    ndt, dbs = get("speculative_num_draft_tokens"), get("speculative_dflash_block_size")
    if ndt is not None and dbs is not None and int(ndt) != int(dbs):
        problems.append(f"--speculative-num-draft-tokens {ndt} and --speculative-dflash-block-size {dbs} differ: "
                        "both are the DFlash block size, give one")
    block = int(ndt if ndt is not None else dbs) if (ndt is not None or dbs is not None) else None
    if block is not None:
        if block < 2:
            problems.append(f"block size {block} leaves no draft position (need >= 2: root + at least one draft)")
        elif block - 1 > MAX_HORIZON:
            problems.append(f"block size {block} exceeds the engine's draft horizon limit {MAX_HORIZON + 1}")
        elif settings.budget is not None and settings.budget < block - 1:
            problems.append(f"DDTREE_BUDGET={settings.budget} is below the draft horizon {block - 1} "
                            f"(block size {block} - 1): the tree could not hold the chain it shadows")
    if get("speculative_use_rejection_sampling"):
        problems.append("--speculative-use-rejection-sampling is refused: DDTREE verifies by walking the target's "
                        "own choices (lossless without draft probabilities); rejection sampling is EAGLE-only")
    if get("speculative_use_block_verification"):
        problems.append("--speculative-use-block-verification is refused for DDTREE")
    for flag, name in (("--speculative-eagle-topk", "speculative_eagle_topk"),
                       ("--speculative-num-steps", "speculative_num_steps")):
        value = get(name)
        if value is not None and int(value) != 1:
            problems.append(f"{flag} {value}: DDTREE's width is DDTREE_BUDGET and its depth the block size; "
                            f"leave {flag} unset")
    if int(get("pp_size", 1) or 1) != 1:
        problems.append("pipeline parallelism (--pp-size > 1) is not supported (DFlash needs pp_size 1)")
    if (get("disaggregation_mode") or "null") != "null":
        problems.append("--disaggregation-mode is refused for DDTREE: SGLang's PD transfer tests the algorithm "
                        "by the name DFLASH")
    if get("enable_lora"):
        problems.append("--enable-lora is refused for DDTREE: SGLang's LoRA check lists algorithms by name")
    if get("enable_unified_memory"):
        problems.append("--enable-unified-memory is refused for DDTREE: SGLang audits that pool by algorithm name")
    if get("enable_return_aux_hidden_states"):
        problems.append("--enable-return-aux-hidden-states is a capture-only mode without a draft; not for DDTREE")
    if get("speculative_adaptive"):
        problems.append("--speculative-adaptive is refused: DDTREE shadow needs a fixed block size")
    if settings.mode == "tree":
        problems += tree_mode_problems(cfg, settings)
    device = get("device")
    if isinstance(device, str) and not device.startswith("cuda"):
        problems.append(f"--device {device}: the DDTREE worker (SGLang's DFlash worker) needs CUDA")
    return problems


def tree_mode_problems(cfg: Any, settings: Any) -> list[str]:
    """What DDTREE_MODE=tree needs beyond the shadow: a tree verify backend for this SGLang (0.5.17's
    ships in the wheel, issue 33), and an unsharded LM head (the served tree is built from the draft's
    top-K, which the shadow may go without but the tree cannot)."""
    # the backend's entry points (standard library); its module loads only where one is declared
    from ddtree_ops.engine.sglang_backend import tree_problem

    problems = []
    missing = tree_problem(sglang_version())
    if missing:
        problems.append(missing)
    if int(getattr(cfg, "tp_size", 1) or 1) > 1:
        problems.append("DDTREE_MODE=tree with --tp-size > 1 is refused: the tree is built from the draft's per-"
                        "position top-K, read from an unsharded LM head (serve ddtree-shadow, which goes on "
                        "serving DFlash's chain there)")
    if settings.chain_share == 0:
        logger.warning("DDTREE_CHAIN_SHARE=0: no round verifies the spine alone, so the tree/chain cost ratio is "
                       "not measured on this server (the configured one is used)")
    return problems


def validate_server_args(server_args: Any) -> None:
    """SGLang's validator hook: raise one ValueError naming every problem."""
    problems = server_args_problems(server_args)
    if problems:
        raise ValueError("DDTREE launch refused:\n  - " + "\n  - ".join(problems))
    cfg = _view(server_args)
    if int(getattr(cfg, "tp_size", 1) or 1) > 1 and read_settings()[0].mode == "shadow":
        logger.warning("DDTREE: tp_size > 1 shards the LM head; shadow accounting reads the draft's per-position "
                       "distributions only from an unsharded head and stays off (DFlash serves as usual)")


def _record(server_args: Any) -> Any:
    """SGLang hands a plugin's handle_server_args a write recorder; DFLASH's own hook must declare on
    the record itself, as the in-tree dispatcher does for DFLASH."""
    try:
        cfg = object.__getattribute__(server_args, "_cfg")
    except AttributeError:
        return server_args
    from sglang.srt.arg_groups.model_override_base import record_of

    return record_of(cfg)


def _spec_class() -> type:
    """Build the CustomSpecAlgo subclass (needs sglang; built on first registration)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    dflash = SpeculativeAlgorithm.DFLASH

    class DDTreeSpecAlgo(CustomSpecAlgo):
        """DDTREE: served by the DFlash chain path, so it answers as DFLASH everywhere."""

        family_of = dflash

        # the other algorithms' identities: False, as for DFLASH
        def is_eagle(self) -> bool:
            return dflash.is_eagle()

        def is_eagle3(self) -> bool:
            return dflash.is_eagle3()

        def is_frozen_kv_mtp(self) -> bool:
            return dflash.is_frozen_kv_mtp()

        def is_uno(self) -> bool:
            return dflash.is_uno()

        def is_standalone(self) -> bool:
            return dflash.is_standalone()

        def is_ngram(self) -> bool:
            return dflash.is_ngram()

        # the capture, KV, graph and scheduler gates (see SITES)
        def is_dflash(self) -> bool:
            return dflash.is_dflash()

        def is_dflash_family(self) -> bool:
            return dflash.is_dflash_family()

        def is_dspark(self) -> bool:
            return dflash.is_dspark()

        def supports_target_verify_for_draft(self) -> bool:
            return dflash.supports_target_verify_for_draft()

        def supports_prefill_shared_read_done(self) -> bool:
            return dflash.supports_prefill_shared_read_done()

        def supports_mixed_chunk(self) -> bool:
            return dflash.supports_mixed_chunk()

        def supports_ragged_verify(self) -> bool:
            return dflash.supports_ragged_verify()

        def supports_grammar_overlap(self) -> bool:
            return dflash.supports_grammar_overlap()

        def has_draft_kv(self) -> bool:
            return dflash.has_draft_kv()

        # called by 0.5.23's scheduler on every algorithm, absent from CustomSpecAlgo
        def need_topk(self) -> bool:
            return dflash.need_topk()

        def carries_draft_hidden_states(self) -> bool:
            return dflash.carries_draft_hidden_states()

        def create_future_map(self, device: Any, req_to_token_pool: Any, needs_cpu_seq_lens: bool = True,
                              needs_confidence_relay: bool = False) -> Any:
            from sglang.srt.managers.overlap_utils import FutureMap

            return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)

        def get_platform_worker_cls(self) -> None:
            return None      # an out-of-tree platform's DFLASH worker would drop the shadow accounting

        def get_num_tokens_per_req_for_target_verify(self, num_draft_tokens: int, is_draft_worker: bool) -> int:
            return dflash.get_num_tokens_per_req_for_target_verify(num_draft_tokens, is_draft_worker)

        def build_disagg_draft_input(self, batch: Any, last_tokens_tensor: Any, future_map: Any) -> Any:
            return dflash.build_disagg_draft_input(batch, last_tokens_tensor, future_map)

        def resolve_max_speculative_num_draft_tokens(self, server_args: Any) -> Any:
            return dflash.resolve_max_speculative_num_draft_tokens(server_args)

        def handle_server_args(self, server_args: Any) -> None:
            from sglang.srt.arg_groups.speculative_hook import _handle_dflash

            _handle_dflash(_record(server_args))

    # Drift guard: a predicate a later sglang adds to the enum would otherwise inherit
    # CustomSpecAlgo's False, the very trap this class exists for. Answer as DFLASH and say so.
    for name in vars(SpeculativeAlgorithm):
        if name.startswith(("is_", "supports_", "has_", "need_", "carries_")) and name not in vars(DDTreeSpecAlgo):
            if name in ("is_some", "is_none", "is_speculative"):
                continue
            logger.warning("DDTREE: sglang predicate %s() not reviewed for this version; answering as DFLASH", name)
            setattr(DDTreeSpecAlgo, name, (lambda n: lambda self, *a, **k: getattr(dflash, n)(*a, **k))(name))
    return DDTreeSpecAlgo


def worker_factory(server_args: Any) -> type:
    """SGLang calls this at server start (GPU), in the scheduler process, before its overlap
    FutureMap exists: SGLang's DFlash V2 worker plus shadow accounting (DDTREE_MODE=shadow) or
    serving the tree (DDTREE_MODE=tree, `sglang_tree`), and DFLASH's answer to the hidden-state
    relay question (`sglang_relay`)."""
    # sglang's GPU stack (both modules import it): only inside a server, never at plugin load
    from ddtree_ops.engine.sglang_relay import exempt_from_hidden_relay

    exempt_from_hidden_relay(server_args)
    # sglang's DFlash worker (GPU stack): only inside a server
    from ddtree_ops.engine.sglang_worker import DDTreeShadowWorker, DDTreeTreeWorker

    return DDTreeTreeWorker if read_settings()[0].mode == "tree" else DDTreeShadowWorker


def registered() -> Any:
    """The registered DDTREE spec, or None."""
    from sglang.srt.speculative.spec_registry import get_spec

    return get_spec(NAME)


def register() -> None:
    """The `sglang.srt.plugins` entry point. Idempotent: SGLang calls it once per process, tests and
    the lab's stand-in may call it again."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    if registered() is not None:
        return
    version = sglang_version()
    try:
        SpeculativeAlgorithm.register(NAME, supports_overlap=True, validate_server_args=validate_server_args,
                                      spec_class=_spec_class())(worker_factory)
    except ValueError as exc:       # a later sglang that ships DDTREE itself reserves the name
        announce(f"DDTREE plugin: not registered: {exc}")
        return
    # registered even on an unchecked release, so that a launch fails in the validator with the
    # releases that work instead of "Unknown speculative algorithm"
    mode = read_settings()[0].mode
    announce(version_problem(version) or
             f"DDTREE plugin: registered DDTREE as a DFlash-family algorithm (sglang {version}, "
             f"{'shadow-linear' if mode == 'shadow' else 'tree serving'})")


def announce(line: str) -> None:
    """One line that reaches the journal whatever SGLang's logging state: plugins load before it
    configures logging, in the server process and again in each scheduler."""
    print(line, file=sys.stderr, flush=True)


def check(plugins: str | None = PLUGIN) -> dict[str, Any]:
    """What a server would see: sglang's own plugin loader, then DDTREE's family answers.
    For `ddtree-ops engine plugin-check` and the lab's stand-in."""
    doc: dict[str, Any] = {"algorithm": NAME}
    try:
        import sglang
        from sglang.srt.plugins import load_plugins
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    except Exception as exc:        # not installed, or a dependency of its import chain is missing
        doc["error"] = f"cannot import sglang: {exc}"
        return doc
    doc["sglang"] = getattr(sglang, "__version__", None)
    doc["supported_versions"] = list(SUPPORTED)
    unsupported = version_problem(doc["sglang"])
    if unsupported:
        doc["error"] = unsupported
        return doc
    if plugins is not None:
        os.environ.setdefault("SGLANG_PLUGINS", plugins)
    doc["SGLANG_PLUGINS"] = os.environ.get("SGLANG_PLUGINS")
    load_plugins()
    try:
        algo = SpeculativeAlgorithm.from_string(NAME)
    except ValueError as exc:
        doc["error"] = f"{exc} (the ddtree plugin did not register: is SGLANG_PLUGINS filtering it out?)"
        doc["is_dflash_family"] = False
        return doc
    # the backend's entry points (standard library); its module loads only where one is declared
    from ddtree_ops.engine.sglang_backend import tree_problem

    doc.update(spec_class=type(algo).__name__, is_dflash=algo.is_dflash(),
               is_dflash_family=algo.is_dflash_family(),
               supports_target_verify_for_draft=algo.supports_target_verify_for_draft(),
               settings=read_settings()[0].to_dict(), tree_mode=tree_problem(doc["sglang"]) or "ok")
    return doc
