"""ddtree-ops LAB STAND-IN: what `python -m sglang.launch_server` runs on a lab host.

The host's real sglang 0.5.23 parses the argv (`prepare_server_args`: unknown flags end in argparse's own
error and exit 2), loads plugins (`load_plugins`, filtered by SGLANG_PLUGINS) and resolves the algorithm
(`SpeculativeAlgorithm.from_string`: an unknown name raises SGLang's ValueError; a plugin's spec class
answers the predicates that decide hidden capture and graph modes). Then, with no GPU to load onto, the
stand-in walks SGLang's startup printing what real SGLang 0.5.17 printed (`lines.py`), sizes the KV pool
with SGLang's formula against the simulated card, serves SGLang's endpoints, fails where SGLang fails
and stops the way SGLang stops. Waits are compressed: a start takes seconds, a stop about one.

This module is the launcher's side (the argv, the plugins, the algorithm, the inputs of the plan) and
the order of a start; what is simulated lives in its own module: the scheduler processes and their
signals (`scheduler.py`), the start-up phases (`startup.py`), the injected faults and their tracebacks
(`faults.py`), the other nodes of a multi-node service (`nodes.py`), and the HTTP side (`serving.py`).

Which scenarios are grounded in a real 0.5.17 log (tests/data/real-sglang/0.5.17, H200, tiny Qwen3 with
dummy weights), and which only in the 0.5.17 source or the stand-in's own reading:

  grounded in a real log                              log
  no speculation, CUDA graphs off / on                1_base_nograph, 1_base_graph
  DFLASH (draft layer ids captured), graphs on        2_dflash
  DDTREE through the ddtree plugin, graphs on         2_ddtree (older plugin; its new lines: its own code)
  draft layer id = the target's last layer            1_dflash_layers13, 1_ddtree_layers13
  DDTREE spec class not DFlash-family, graphs on      1_neg_nonfamily_graph_layers13
  the same, graphs off                                2_neg_nonfamily_nograph
  DDTREE as a plain CustomSpecAlgo, graphs on         2_neg_plain_graph
  stop by SIGTERM to the process group                every healthy log above (both sequences)

  not grounded in a real log (line formats aligned with the real ones where the logs show that kind)
  NEXTN / EAGLE (graph names from the 0.5.17 source), a plain CustomSpecAlgo with graphs off (taken to
  fail like the non-family one at the first prefill), libcuda-missing, hang, slow-start,
  crash-after-ready, accept-collapse, port busy, not enough memory (text and frames from the 0.5.17
  source), graph capture out of memory, context longer than the model's.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import json
import os
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Optional

from . import STANDIN_LABEL, SGLANG_VERSION, behaviour, lines, memory, nodes, ranks, serving, sglog, simgpu, startup
from .faults import read_faults
from .scheduler import Scheduler


def _launcher_warning() -> None:
    """The UserWarning `python -m sglang.launch_server` prints first (0.5.17: launch_server.py, line 56)."""
    path = Path(sys.modules["sglang"].__file__).parent / "launch_server.py" if "sglang" in sys.modules else "launch_server.py"
    sys.stderr.write(f"{path}:{lines.LAUNCH_SERVER_WARNING_LINE}: UserWarning: 'python -m sglang.launch_server' is "
                     "still supported, but 'sglang serve' is the recommended entrypoint.\n"
                     "  Example: sglang serve --model-path <model> [options]\n  warnings.warn(\n")


class _Tee(io.TextIOBase):
    """Passes writes through and keeps a copy."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.copy = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


@contextlib.contextmanager
def _kept_output() -> Iterator[io.StringIO]:
    """What plugins print while they load: SGLang loads them again in each scheduler process, which
    prints the same (the ddtree plugin's registration line appears twice in a real log)."""
    out, err = _Tee(sys.stdout), _Tee(sys.stderr)
    kept = io.StringIO()
    sys.stdout, sys.stderr = out, err  # type: ignore[assignment]
    try:
        yield kept
    finally:
        sys.stdout, sys.stderr = out.stream, err.stream
        kept.write(out.copy.getvalue() + err.copy.getvalue())


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while SGLang (and torch with it) is imported and the argv
    parsed, then on again for the server's life.

    The import makes a great many objects, none of them garbage, and the collector walked
    them over and over: a sixth of the import's CPU (bench/gc_pause_cpu.py, `lab`). On a lab host
    the import begins before this module runs (`python -m sglang.launch_server` imports the sglang
    package first), so the lab venv turns the collector off at interpreter start for that command line
    (the payload's GC_PTH), and this turns it on. Nothing is frozen: frozen objects outlive the
    interpreter's last collection, and a nanobind extension then prints "leaked" lines at exit, into
    the journal of a start that failed."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def main(argv: list[str]) -> int:
    with collector_paused():
        import sglang  # noqa: F401  (so the warning names the real file)

        _launcher_warning()
        from sglang.srt.plugins import load_plugins
        from sglang.srt.server_args import prepare_server_args

        with _kept_output() as plugin_output:
            load_plugins()
        server_args = prepare_server_args(argv)
    run_server(server_args, plugin_output.getvalue())
    return 0


# --------------------------------------------------------------------------- launcher-side resolution


def handle_speculative_decoding(server_args: Any) -> Any:
    """`arg_groups/speculative_hook.py`: resolve the algorithm name, run a plugin's own validator."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    algo = SpeculativeAlgorithm.from_string(server_args.speculative_algorithm)
    if isinstance(algo, CustomSpecAlgo) and algo.validate_server_args is not None:
        algo.validate_server_args(server_args)
    if algo.is_dflash() and server_args.speculative_draft_model_path is None:
        raise ValueError("DFLASH speculative decoding requires setting --speculative-draft-model-path.")
    if (algo.is_dflash() and server_args.speculative_dflash_block_size is not None
            and server_args.speculative_num_draft_tokens is not None
            and int(server_args.speculative_num_draft_tokens) != int(server_args.speculative_dflash_block_size)):
        raise ValueError(
            "Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set but they differ. "
            "For DFLASH they must match. "
            f"speculative_num_draft_tokens={server_args.speculative_num_draft_tokens}, "
            f"speculative_dflash_block_size={server_args.speculative_dflash_block_size}.")
    return algo


def draft_kind(algo: Any) -> memory.DraftKind:
    if algo.is_none():
        return "none"
    if algo.is_dflash_family():
        return "dflash"
    if algo.is_eagle():
        return "eagle"
    return "custom"


def dflash_hook(algo: Any) -> bool:
    """Whether the algorithm's server-args hook resolves DFLASH's defaults (block size from the
    draft, max running requests 48, the draft attention backend): DFLASH's own, or a plugin spec
    class that overrides `handle_server_args` (the ddtree plugin runs DFLASH's there)."""
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    if not isinstance(algo, CustomSpecAlgo):
        return bool(algo.is_dflash_family() or algo.is_eagle())
    return type(algo).handle_server_args is not CustomSpecAlgo.handle_server_args


def load_model_config(path: Optional[str]) -> tuple[dict[str, Any], Optional[dict[str, Any]]]:
    """config.json (+ the safetensors index) the way transformers finds them in a local folder."""
    d = Path(path or "")
    if not path or not (d / "config.json").is_file():
        raise OSError(f"Incorrect path_or_model_id: '{path}'. Please provide either the path to a local folder "
                      "or the repo_id of a model on the Hub.")
    cfg = json.loads((d / "config.json").read_text())
    index_path = d / "model.safetensors.index.json"
    index = json.loads(index_path.read_text()) if index_path.is_file() else None
    return cfg, index


def _disabled(value: Any) -> bool:
    return str(value or "").lower() == "disabled"


def _graph_disabled(sa: Any) -> bool:
    return bool(getattr(sa, "disable_cuda_graph", False) or getattr(sa, "disable_decode_cuda_graph", False)
                or _disabled(getattr(sa, "cuda_graph_backend_decode", None)))


def _prefill_graph_disabled(sa: Any) -> bool:
    return bool(getattr(sa, "disable_cuda_graph", False) or getattr(sa, "disable_prefill_cuda_graph", False)
                or _disabled(getattr(sa, "cuda_graph_backend_prefill", None)))


def inputs_from(sa: Any, algo: Any, card: simgpu.Card, others_mib: int) -> behaviour.Inputs:
    target_cfg, target_index = load_model_config(sa.model_path)
    kind = draft_kind(algo)
    draft_cfg = None
    if kind != "none" and sa.speculative_draft_model_path:
        draft_cfg, _ = load_model_config(sa.speculative_draft_model_path)
    return behaviour.Inputs(
        algorithm=sa.speculative_algorithm, kind=kind, target_cfg=target_cfg, target_index=target_index,
        draft_cfg=draft_cfg, total_mib=card.memory_mib, others_mib=others_mib,
        mem_fraction_static=sa.mem_fraction_static, kv_cache_dtype=str(sa.kv_cache_dtype or "auto"),
        page_size=int(sa.page_size or 1), max_total_tokens=sa.max_total_tokens, context_length=sa.context_length,
        max_running_requests=sa.max_running_requests, chunked_prefill_size=sa.chunked_prefill_size,
        max_prefill_tokens=int(getattr(sa, "max_prefill_tokens", None) or 16384),
        cuda_graph=not _graph_disabled(sa), cuda_graph_max_bs=getattr(sa, "cuda_graph_max_bs_decode", None),
        num_steps=sa.speculative_num_steps, eagle_topk=sa.speculative_eagle_topk,
        num_draft_tokens=sa.speculative_num_draft_tokens, dflash_block_size=sa.speculative_dflash_block_size,
        tp=int(getattr(sa, "tp_size", 1) or 1),
        allow_longer_context=os.environ.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "").lower() in ("1", "true"),
        faults=read_faults(), verify_for_draft=bool(algo.supports_target_verify_for_draft()) if kind != "none" else None,
        dflash_hook=dflash_hook(algo) if kind != "none" else None, prefill_graph=not _prefill_graph_disabled(sa),
        cuda_graph_max_bs_prefill=getattr(sa, "cuda_graph_max_bs_prefill", None),
        simulate_acc_len=_simulated_acceptance())


def _simulated_acceptance() -> Optional[float]:
    raw = os.environ.get("SGLANG_SIMULATE_ACC_LEN", "").strip()
    try:
        return float(raw) if raw else None
    except ValueError:
        return None


def _set_ulimit() -> None:
    """`utils.common.set_ulimit`, for real: raise the open-file soft limit, say so when it cannot."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 65535:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (65535, hard))
        except ValueError as exc:
            sglog.warning(f"Fail to set RLIMIT_NOFILE: {exc}")


def run_server(sa: Any, plugin_output: str = "") -> None:
    sglog.configure()
    sglog.info(f"{STANDIN_LABEL}: this host has no GPU; sglang {SGLANG_VERSION}'s own parser and plugin loader "
               f"ran, the model is not loaded; the log is SGLang {lines.SGLANG_RELEASE}'s (see /etc/ddtree-lab/README)")
    algo = handle_speculative_decoding(sa)
    topo = ranks.topology(sa)
    if not simgpu.load_cards():
        raise RuntimeError("Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
                           "installed a driver from http://www.nvidia.com/Download/index.aspx")
    cards = simgpu.visible_cards(simgpu.load_cards())
    if len(cards) < topo.per_node:
        raise RuntimeError(f"CUDA error: invalid device ordinal (this node runs {topo.per_node} ranks; "
                           f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')!r} shows {len(cards)} "
                           "card(s))")
    local = cards[:topo.per_node]
    # every rank's pool is sized from the least free card (SGLang's all-reduce MIN)
    card, others = max(((c, simgpu.used_mib(exclude_pid=os.getpid(), card=c.index)) for c in local),
                       key=lambda co: co[1] - co[0].memory_mib)
    x = inputs_from(sa, algo, card, others)
    p = behaviour.plan(x)
    for w in p.warnings:
        sglog.warning(w)
    if p.failure == "context":
        raise ValueError(p.failure_message)
    if (getattr(sa, "mm_feature_transport", None) in (None, "auto")) and int(getattr(sa, "nnodes", 1) or 1) == 1:
        for line in lines.MULTIMODAL_TRANSPORT:
            sglog.info(line)
    _set_ulimit()
    sglog.info(f"server_args={sa!r}")
    sglog.info(lines.CHAT_TEMPLATE)
    start(Scheduler(sa, algo, x, p, card, plugin_output, topo=topo, local=local))


# --------------------------------------------------------------------------- the start, in SGLang's order


def start(s: Scheduler) -> None:
    """The scheduler processes and the launcher's signal handlers, then the start-up and serving."""
    t0 = time.monotonic()
    s.start_processes()
    if s.topo.node_rank > 0:
        signal.signal(signal.SIGTERM, lambda *_: nodes.other_node_sigterm(s))
    asyncio.run(run(s, t0))


async def run(s: Scheduler, t0: float) -> None:
    s.watchdog_task = asyncio.get_running_loop().create_task(s.watch_children())
    used = await startup.distributed(s)
    used, load_weight = await startup.weights(s, used)
    used, kv_time = await startup.kv_pools(s, used)
    used = await startup.graphs(s, used)
    startup.ready_lines(s, used, t0, load_weight, kv_time)
    if s.topo.node_rank > 0:
        await nodes.serve_other_node(s)
    await serving.serve_api(s, used)
