"""ddtree-ops LAB STAND-IN: rank 0's HTTP side once the scheduler is up.

The HTTP server (`http.py` answers SGLang's endpoints) with uvicorn's lines, the warmup request the
launcher sends itself, the running phase's signal handlers, the drain on SIGTERM, and the faults that
show only once the server runs (a hang, the hidden-state mismatch at the first prefill, a crash after
ready).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from typing import Any

from . import SGLANG_VERSION, STANDIN_LABEL, lines, sglog
from .faults import dim_traceback, illegal_memory, traceback_text
from .faults import seconds as fault_seconds
from .http import State, serve
from .scheduler import GB, STOP_SCALE, Scheduler


async def serve_api(s: Scheduler, used: int) -> None:
    """uvicorn, then the warmup request through the server itself (SGLang's warmup thread), then
    serving until a signal ends the process."""
    p = s.p
    s.state = state_of(s, used)
    sglog.uvicorn(logging.INFO, f"Started server process [{os.getpid()}]")
    sglog.uvicorn(logging.INFO, "Waiting for application startup.")
    sglog.uvicorn(logging.INFO, "Application startup complete.")
    host, port = s.sa.host, int(s.sa.port)
    try:
        await serve(s.state, host, port)
    except OSError as exc:  # uvicorn: logger.error(exc); lifespan shutdown; sys.exit(1)
        sglog.uvicorn(logging.ERROR, str(exc))
        sglog.uvicorn(logging.INFO, "Waiting for application shutdown.")
        sglog.uvicorn(logging.INFO, "Application shutdown complete.")
        sglog.info(f"kill_process_tree called: parent_pid={os.getpid()}, include_parent=False, pid={os.getpid()}")
        if s.child is not None:
            s.child.kill()
        logging.shutdown()
        os._exit(1)
    sglog.uvicorn(logging.INFO, f"Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)")

    target = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    await request(target, port, "GET", "/model_info")
    running_phase(s)
    if p.hang:
        s.state.phase = "hung"
        await asyncio.Event().wait()
    if p.failure == "hidden-dim":
        if s.shadow is not None:
            s.shadow.prefill()
        await asyncio.sleep(0.3)
        await s.crash(dim_traceback(s), running=True)
    await request(target, port, "POST", "/generate", {"text": lines.WARMUP_PROMPT,
                                                      "sampling_params": {"temperature": 0, "max_new_tokens": 8}})
    s.state.phase = "ready"
    sglog.info(lines.READY)
    if p.crash_after_ready:
        await asyncio.sleep(fault_seconds("crash-after-ready"))
        await s.crash(traceback_text([lines.TB_EVENT_LOOP], illegal_memory()), running=True)
    await asyncio.Event().wait()


def running_phase(s: Scheduler) -> None:
    """The tokenizer manager's handle loop: created by the first generate request; it replaces
    the launch-phase SIGQUIT handler and takes SIGTERM."""
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: sigterm(s))
    loop.add_signal_handler(signal.SIGQUIT, s.running_sigquit)
    s.drain_task = loop.create_task(sigterm_watchdog(s))


def sigterm(s: Scheduler) -> None:
    sglog.warning(lines.SIGTERM_RECEIVED)
    if s.rdzv is not None:
        s.rdzv.broadcast_shutdown()  # rank 0's ShutdownReq: every node's schedulers leave
    s.gracefully_exit = True
    if s.state is not None:
        s.state.shutting_down = True


async def sigterm_watchdog(s: Scheduler) -> None:
    """TokenizerManager.sigterm_watchdog: drain, then ask the scheduler to leave, then the tree."""
    while not s.gracefully_exit:
        await asyncio.sleep(5 * STOP_SCALE)
    if s.child is not None and not s.child.outlives_sigterm:
        # the scheduler dies of the same SIGTERM: the real SubprocessWatchdog reports that crash long
        # before this 5 s loop wakes; here both loops are scaled down, so wait for the watcher (on a
        # loaded machine the dying child may not even have run yet) instead of racing it
        deadline = time.monotonic() + 10 * STOP_SCALE
        while s.watching and not s.child_crashed and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if s.child_crashed:
            return  # the watcher took it: crash line, SIGQUIT, the launcher's diagnostics
    while True:
        rids = list(s.state.inflight) if s.state is not None else []
        sglog.info(lines.GRACEFUL.format(n=len(rids), rids=rids))
        if not rids:
            break
        await asyncio.sleep(5 * STOP_SCALE)
    s.watching = False
    if s.child is not None:
        s.child.shutdown()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and s.child.alive():
            await asyncio.sleep(0.02)
    s.kill_process_tree()


def state_of(s: Scheduler, used: int) -> State:
    """What the endpoints answer: /server_info, /model_info, the pace of a decode step, the shadow."""
    import msgspec  # sglang's dependency, present in the lab's venv: turns the server args into JSON

    sa, p, x = s.sa, s.p, s.x
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
    step = 0.022 if s.card.memory_mib < 60 * 1024 else 0.012
    return State(model_path=sa.model_path, served_model_name=sa.served_model_name or sa.model_path,
                 context_len=p.context_len, max_total_num_tokens=p.pool.tokens, speculative=p.speculative,
                 accept_mean=p.accept_mean, accept_spread=p.accept_spread, draft_window=p.draft_window,
                 step_s=step, server_info=info, model_info=model_info, enable_metrics=bool(sa.enable_metrics),
                 cuda_graph=bool(x.cuda_graph), decode_log_interval=int(getattr(sa, "decode_log_interval", 40) or 40),
                 shadow=s.shadow)


async def request(host: str, port: int, method: str, path: str, doc: Any = None) -> None:
    body = json.dumps(doc).encode() if doc is not None else b""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
                 + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    await writer.drain()
    await reader.read()
    writer.close()
