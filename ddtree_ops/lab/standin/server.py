"""ddtree-ops LAB STAND-IN: what `python -m sglang.launch_server` runs on a lab host.

The host's real sglang 0.5.23 parses the argv (`prepare_server_args`: unknown flags end in argparse's own
error and exit 2), loads plugins (`load_plugins`, filtered by SGLANG_PLUGINS) and resolves the algorithm
(`SpeculativeAlgorithm.from_string`: an unknown name raises SGLang's ValueError). Then, with no GPU to
load onto, the stand-in walks SGLang's startup with its log lines, sizes the KV pool with SGLang's
formula against the simulated card, serves SGLang's endpoints, and fails where SGLang would fail.
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import json
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Optional

from . import STANDIN_LABEL, SGLANG_VERSION, behaviour, memory, sglog, simgpu
from .http import State, serve

FAULTS_FILE = Path(os.environ.get("DDTREE_LAB_FAULTS", "/var/lib/ddtree-lab/faults"))
GB = memory.GIB  # SGLang's "GB" in log lines is GiB (bytes / 2**30)
WARMUP_PROMPT = "The capital city of France is"


def _launcher_warning() -> None:
    """The UserWarning `python -m sglang.launch_server` prints first (launch_server.py, line 71)."""
    path = Path(sys.modules["sglang"].__file__).parent / "launch_server.py" if "sglang" in sys.modules else "launch_server.py"
    sys.stderr.write(f"{path}:71: UserWarning: 'python -m sglang.launch_server' is still supported, but 'sglang serve' "
                     "is the recommended entrypoint.\n  Example: sglang serve --model-path <model> [options]\n"
                     "  warnings.warn(\n")


def main(argv: list[str]) -> int:
    import sglang  # noqa: F401  (so the warning names the real file)

    _launcher_warning()
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    load_plugins()
    server_args = prepare_server_args(argv)
    run_server(server_args)
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


EVERY_START = "@every-start"


def read_faults() -> frozenset[str]:
    """The faults for this start. Plain entries are used up here (they mean "the next start");
    entries marked @every-start stay in the file."""
    try:
        lines = [ln.strip() for ln in FAULTS_FILE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    except OSError:
        return frozenset()
    keep = [ln for ln in lines if ln.endswith(EVERY_START)]
    if len(keep) != len(lines):
        try:
            FAULTS_FILE.write_text("".join(ln + "\n" for ln in keep))
        except OSError:
            pass
    return frozenset(ln.removesuffix(EVERY_START) for ln in lines)


def _graph_disabled(sa: Any) -> bool:
    return bool(getattr(sa, "disable_cuda_graph", False) or getattr(sa, "disable_decode_cuda_graph", False)
                or str(getattr(sa, "cuda_graph_backend_decode", "") or "").lower() == "disabled")


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
        faults=read_faults())


def run_server(sa: Any) -> None:
    sglog.configure()
    sglog.info(f"{STANDIN_LABEL}: this host has no GPU; sglang {SGLANG_VERSION}'s own parser and plugin loader "
               "ran, the model is not loaded (see /etc/ddtree-lab/README)")
    sglog.info(f"server_args={sa!r}")
    algo = handle_speculative_decoding(sa)
    card = simgpu.load_card()
    if card is None:
        raise RuntimeError("Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
                           "installed a driver from http://www.nvidia.com/Download/index.aspx")
    others = simgpu.used_mib(exclude_pid=os.getpid())
    x = inputs_from(sa, algo, card, others)
    p = behaviour.plan(x)
    for w in p.warnings:
        sglog.warning(w)
    if p.failure == "context":
        raise ValueError(p.failure_message)
    asyncio.run(Scheduler(sa, x, p, card).run())


# --------------------------------------------------------------------------- the "scheduler"


class Scheduler:
    """SGLang's scheduler start-up and serving loop, compressed to seconds."""

    def __init__(self, sa: Any, x: behaviour.Inputs, p: behaviour.Plan, card: simgpu.Card) -> None:
        self.sa, self.x, self.p, self.card = sa, x, p, card
        self.pool = p.pool
        self.t = memory.Shape.from_config(x.target_cfg)
        self.http_up = False
        self.state: Optional[State] = None

    # ---- GPU memory as nvidia-smi sees it
    def hold(self, used_bytes: int) -> None:
        simgpu.register(int(used_bytes // memory.MIB))

    def avail(self, used_bytes: int) -> float:
        return (self.pool.total - self.pool.others - used_bytes) / GB

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._sigterm)
        atexit.register(simgpu.unregister)
        ctx = simgpu.CUDA_CONTEXT_MIB * memory.MIB
        p, pool = self.p, self.pool
        t0 = time.monotonic()
        sglog.info("Init torch distributed begin.")
        self.hold(ctx)
        await asyncio.sleep(0.15)
        sglog.info(f"Init torch distributed ends. elapsed={time.monotonic() - t0:.2f} s, mem usage={ctx / GB:.2f} GB")
        if p.failure == "libcuda":
            await asyncio.sleep(1.5)
            sglog.scheduler_crash(_libcuda_traceback())

        # ---- weights: target, then the draft worker's
        used = ctx
        tic = time.monotonic()
        sglog.info(f"Load weight begin. avail mem={self.avail(used):.2f} GB")
        await asyncio.sleep(0.5 + (16.0 if p.slow_start else 0.0))
        used += pool.target_weights
        self.hold(used)
        sglog.info(f"Load weight end. elapsed={time.monotonic() - tic:.2f} s, type={self.t.architecture}, "
                   f"avail mem={self.avail(used):.2f} GB, mem usage={pool.target_weights / GB:.2f} GB.")
        if pool.draft_weights:
            tic = time.monotonic()
            sglog.info(f"Load weight begin. avail mem={self.avail(used):.2f} GB")
            await asyncio.sleep(0.2)
            used += pool.draft_weights
            self.hold(used)
            arch = str(((self.x.draft_cfg or {}).get("architectures") or ["?"])[0])
            sglog.info(f"Load weight end. elapsed={time.monotonic() - tic:.2f} s, type={arch}, "
                       f"avail mem={self.avail(used):.2f} GB, mem usage={pool.draft_weights / GB:.2f} GB.")

        # ---- the KV pool
        if p.failure == "not-enough-memory":
            await asyncio.sleep(0.1)
            sglog.scheduler_crash(_memory_traceback(p.failure_message))
        dtype = memory.TORCH_DTYPE.get(memory.kv_bytes(self.x.kv_cache_dtype, self.t.dtype_bytes), "torch.bfloat16")
        half = pool.kv_target / 2 / GB
        sglog.info(f"KV Cache is allocated. dtype: {dtype}, #tokens: {pool.tokens}, K size: {half:.2f} GB, "
                   f"V size: {half:.2f} GB")
        if pool.kv_draft:
            dhalf = pool.kv_draft / 2 / GB
            sglog.info(f"KV Cache is allocated. dtype: {dtype}, #tokens: {pool.tokens}, K size: {dhalf:.2f} GB, "
                       f"V size: {dhalf:.2f} GB")
        used += pool.kv_total
        self.hold(used)
        sglog.info(f"Memory pool end. avail mem={self.avail(used):.2f} GB")
        if self.x.kind == "dflash":
            sglog.info(f"Initialized DFLASH draft runner. attention_backend={self.sa.speculative_draft_attention_backend or 'flashinfer'}, "
                       f"model={self.sa.speculative_draft_model_path}, block_size={p.draft_window}, "
                       "draft_window_size=None, compact_cache=False")
            mask_id = ((self.x.draft_cfg or {}).get("dflash_config") or {}).get("mask_token_id")
            sglog.info(f"DFLASH draft runner ready. mask_token=<|MASK|>, mask_token_id={mask_id}, "
                       "mask_token_id_override=None, noise_embed_scale=None")

        # ---- CUDA graphs, captured after the pool out of the (1 - mfs) headroom
        if self.x.cuda_graph:
            name = "target verify" if p.speculative else "target decode"
            sglog.info(f"Capture {name} CUDA graph begin. backend=full, num_tokens_per_req={p.tokens_per_req}, "
                       f"avail mem={self.avail(used):.2f} GB")
            tic = time.monotonic()
            await asyncio.sleep(0.4)
            if p.failure == "graph-oom":
                sglog.scheduler_crash(_graph_oom_traceback(pool, self.card))
            used += pool.graph
            self.hold(used)
            sglog.info(f"Capture {name} CUDA graph end. bs={p.graph_bs}, elapsed={time.monotonic() - tic:.2f} s, "
                       f"mem usage={pool.graph / GB:.2f} GB, avail mem={self.avail(used):.2f} GB.")
        sglog.info(f"max_total_num_tokens={pool.tokens}, chunked_prefill_size={p.chunked_prefill_size}, "
                   f"max_prefill_tokens={p.max_prefill_tokens}, max_running_requests={p.max_running_requests}, "
                   f"context_len={p.context_len}, available_gpu_mem={self.avail(used):.2f} GB")

        # ---- the HTTP server (uvicorn)
        self.state = self._state(used)
        sglog.uvicorn(logging.INFO, f"Started server process [{os.getpid()}]")
        sglog.uvicorn(logging.INFO, "Waiting for application startup.")
        sglog.uvicorn(logging.INFO, "Application startup complete.")
        host, port = self.sa.host, int(self.sa.port)
        try:
            await serve(self.state, host, port)
        except OSError as exc:  # uvicorn: logger.error(exc); lifespan shutdown; sys.exit(1)
            sglog.uvicorn(logging.ERROR, str(exc))
            sglog.uvicorn(logging.INFO, "Waiting for application shutdown.")
            sglog.uvicorn(logging.INFO, "Application shutdown complete.")
            sglog.info(f"kill_process_tree called: parent_pid={os.getpid()}, include_parent=False, pid={os.getpid()}")
            logging.shutdown()
            os._exit(1)
        self.http_up = True
        sglog.uvicorn(logging.INFO, f"Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)")

        # ---- the warmup request, through the server itself
        if p.hang:
            self.state.phase = "hung"
            await asyncio.Event().wait()
        if p.failure == "aux-hidden":
            await asyncio.sleep(0.3)
            sglog.info("Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, #running-req: 0, "
                       "#queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 0.00")
            sglog.scheduler_crash(_aux_hidden_traceback(p.failure_message))
        await _warmup(host, port)
        self.state.phase = "ready"
        sglog.info("The server is fired up and ready to roll!")
        if p.crash_after_ready:
            await asyncio.sleep(8.0)
            sglog.scheduler_crash(_illegal_memory_traceback())
        await asyncio.Event().wait()

    def _state(self, used: int) -> State:
        sa, p, x = self.sa, self.p, self.x
        import msgspec

        info = msgspec.to_builtins(sa)
        info.update({
            "max_total_num_tokens": p.pool.tokens, "max_req_input_len": p.context_len - 1,
            "max_running_requests": p.max_running_requests, "context_length": p.context_len,
            "mem_fraction_static": p.mem_fraction_static, "chunked_prefill_size": p.chunked_prefill_size,
            "version": SGLANG_VERSION,
            "ddtree_lab_standin": f"{STANDIN_LABEL}: sglang.launch_server is simulated on this host (no GPU)",
            "_kv_gb": p.pool.kv_total / GB, "_weight_gb": (p.pool.target_weights + p.pool.draft_weights) / GB})
        if p.speculative:
            info.update({"speculative_num_draft_tokens": p.draft_window})
        model_info = {"model_path": sa.model_path, "tokenizer_path": sa.tokenizer_path or sa.model_path,
                      "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
                      "has_image_understanding": False, "has_audio_understanding": False,
                      "model_type": x.target_cfg.get("model_type"), "architectures": x.target_cfg.get("architectures")}
        # decode step time: a bandwidth-bound 8B step on this card (A6000 ~ 22 ms, PRO 6000 ~ 12 ms)
        step = 0.022 if self.card.memory_mib < 60 * 1024 else 0.012
        return State(model_path=sa.model_path, served_model_name=sa.served_model_name or sa.model_path,
                     context_len=p.context_len, max_total_num_tokens=p.pool.tokens, speculative=p.speculative,
                     accept_mean=p.accept_mean, accept_spread=p.accept_spread, draft_window=p.draft_window,
                     step_s=step, server_info=info, model_info=model_info, enable_metrics=bool(sa.enable_metrics),
                     cuda_graph=bool(x.cuda_graph))

    def _sigterm(self) -> None:
        if self.http_up:
            sglog.uvicorn(logging.INFO, "Shutting down")
            sglog.uvicorn(logging.INFO, "Waiting for application shutdown.")
            sglog.uvicorn(logging.INFO, "Application shutdown complete.")
            sglog.uvicorn(logging.INFO, f"Finished server process [{os.getpid()}]")
        simgpu.unregister()
        logging.shutdown()
        os._exit(0)


async def _warmup(host: str, port: int) -> None:
    """SGLang's `_wait_and_warmup`: one real /generate against itself before declaring readiness."""
    body = json.dumps({"text": WARMUP_PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 8}}).encode()
    target = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    reader, writer = await asyncio.open_connection(target, port)
    writer.write(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    await writer.drain()
    await reader.read()
    writer.close()


# --------------------------------------------------------------------------- tracebacks


def _libcuda_traceback() -> str:
    """A real attempt: sgl_kernel's loader preloads the CUDA driver library with ctypes; this host has
    none, so ctypes raises the genuine OSError."""
    try:
        _preload_cuda_library("libcuda.so.1")
    except OSError:
        frames = [sglog.frame("srt/managers/scheduler.py", "run_scheduler_process",
                              "scheduler = Scheduler(server_args, port_args)")]
        real = traceback.format_exc().split("\n", 1)[1]
        return "Traceback (most recent call last):\n" + "".join(frames) + real
    return "Traceback (most recent call last):\nOSError: libcuda.so.1: cannot open shared object file\n"


def _preload_cuda_library(name: str) -> None:
    # the stand-in's copy of sgl_kernel/load_utils.py:_preload_cuda_library (sgl_kernel is not installed here)
    ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)


def _memory_traceback(message: str) -> str:
    f = sglog.frame
    frames = [
        f("srt/managers/scheduler.py", "run_scheduler_process", "scheduler = Scheduler(server_args, port_args)"),
        f("srt/mem_cache/kv_cache_configurator.py", "configure",
          "config = self._resolve_memory_pool_config(pre_model_load_memory)"),
        f("srt/mem_cache/kv_cache_configurator.py", "_resolve_memory_pool_config",
          "config = self.config_from_budget(available_bytes)"),
        f("srt/mem_cache/kv_cache_configurator.py", "config_from_budget", "config = configurator.calculate_pool_sizes("),
        f("srt/model_executor/pool_configurator.py", "calculate_pool_sizes",
          "return MemoryPoolConfig(max_total_num_tokens=max_total_num_tokens)"),
        '  File "<string>", line 13, in __init__\n',
        f("srt/model_executor/pool_configurator.py", "__post_init__", "raise RuntimeError(msg)"),
    ]
    return sglog.traceback_text(frames, f"RuntimeError: {message}\n")


def _aux_hidden_traceback(message: str) -> str:
    f = sglog.frame
    frames = [
        f("srt/managers/scheduler.py", "run_scheduler_process", "scheduler.run_event_loop()"),
        f("srt/speculative/dflash_worker_v2.py", "forward_batch_generation",
          "DFLASH requires target aux hidden capture for prefill", back_to="raise RuntimeError("),
    ]
    return sglog.traceback_text(frames, f"RuntimeError: {message}\n")


def _illegal_memory_traceback() -> str:
    frames = [sglog.frame("srt/managers/scheduler.py", "run_scheduler_process", "scheduler.run_event_loop()")]
    return sglog.traceback_text(frames, (
        "RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
        "might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"))


def _graph_oom_traceback(pool: memory.Pool, card: simgpu.Card) -> str:
    frames = [sglog.frame("srt/managers/scheduler.py", "run_scheduler_process",
                          "scheduler = Scheduler(server_args, port_args)")]
    free = max(pool.avail_after_pool, 0)
    oom = (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {pool.graph / GB:.2f} GiB. GPU 0 has a total "
           f"capacity of {pool.total / GB:.2f} GiB of which {free / memory.MIB:.2f} MiB is free. Including non-PyTorch "
           f"memory, this process has {(pool.total - pool.others - free) / GB:.2f} GiB memory in use.")
    from_msg = ("Possible solutions:\n1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
                "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
                "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. (Not recommended. Huge "
                "performance loss)\nOpen an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n")
    return sglog.traceback_text(frames, f"Exception: Capture cuda graph failed: {oom}\n{from_msg}")
