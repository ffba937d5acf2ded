"""ddtree-ops LAB STAND-IN: a service over several nodes, as each node's launcher sees it.

torch's rendezvous at --dist-init-addr (`ranks.py` holds the store), the pool sized from the least
free card of every node, what the survivors do when a peer dies (NCCL's watchdog after the
timeout), and a node other than rank 0: no API, SGLang's dummy health server on the same port, and
its SIGTERM handler that waits for rank 0's ShutdownReq.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from . import behaviour, lines, ranks, sglog, simgpu
from .faults import illegal_memory, traceback_text
from .faults import seconds as fault_seconds
from .scheduler import Scheduler


async def rendezvous(s: Scheduler) -> None:
    """torch's init_process_group over --dist-init-addr (ranks.py); the pool is then sized
    from the least free card of every node."""
    first = s.topo.local_ranks[0]
    s.rdzv = ranks.Rendezvous(s.topo, lambda m: sglog.ranked(logging.WARNING, m, s.topo.prefix(first)))
    free = s.x.total_mib - s.x.others_mib
    try:
        least = await asyncio.to_thread(s.rdzv.join, free)
    except ranks.RendezvousError as exc:
        await s.crash(traceback_text([lines.TB_SCHEDULER_INIT], f"{exc}\n"))
        return
    if least < free:
        s.x = dataclasses.replace(s.x, others_mib=s.x.total_mib - least)
        s.p = behaviour.plan(s.x)
        s.pool = s.p.pool
    s.rdzv.watch(lambda node, clean: peer_lost(s, node, clean))


def peer_lost(s: Scheduler, node: int, clean: bool) -> None:
    """A thread of the rendezvous: a peer's connection closed. After rank 0's shutdown this
    node's schedulers leave cleanly; otherwise their next collective waits for the dead peer
    until the timeout, NCCL's watchdog prints its lines and aborts the scheduler process."""
    s.rank0_gone.set()
    if clean:
        s.watching = False
        for c in [s.child, *s.rank_children]:
            if c is not None:
                c.kill()
        simgpu.unregister()
        sys.stderr.flush()
        os._exit(0)
    time.sleep(s.topo.dist_timeout_s)
    for r in s.topo.local_ranks:
        for line in ranks.watchdog_lines(s.topo, r):
            sys.stderr.write(line + "\n")
    sys.stderr.flush()
    if s.child is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(s.child.pid, signal.SIGABRT)  # the launcher's watchdog sees scheduler_0 die


async def serve_other_node(s: Scheduler) -> None:
    """A node other than rank 0 serves no API: its schedulers run and SGLang's dummy health
    check server answers /health and /health_generate on the same port (engine.py,
    launch_dummy_health_check_server)."""
    host, port = s.sa.host, int(s.sa.port)

    async def answer(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            head = (await r.readuntil(b"\r\n\r\n")).decode("latin-1")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            w.close()
            return
        path = head.split(" ", 2)[1] if head.count(" ") >= 2 else "/"
        ok = path.split("?")[0] in ("/health", "/health_generate")
        body = b"" if ok else b'{"detail":"Not Found"}'
        w.write((f"HTTP/1.1 {'200 OK' if ok else '404 Not Found'}\r\ncontent-length: {len(body)}\r\n"
                 "connection: close\r\n\r\n").encode() + body)
        with contextlib.suppress(ConnectionError):
            await w.drain()
        w.close()

    sglog.uvicorn(logging.INFO, f"Started server process [{os.getpid()}]")
    try:
        await asyncio.start_server(answer, host, port)
    except OSError as exc:
        sglog.uvicorn(logging.ERROR, str(exc))
        s.kill_process_tree()
    sglog.uvicorn(logging.INFO, f"Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)")
    if s.p.crash_after_ready:
        await asyncio.sleep(fault_seconds("crash-after-ready"))
        await s.crash(traceback_text([lines.TB_EVENT_LOOP], illegal_memory()), running=True)
    await asyncio.Event().wait()


def other_node_sigterm(s: Scheduler, *_: Any) -> None:
    """0.5.23's node_rank >= 1 SIGTERM handler: wait for rank 0's ShutdownReq (here: rank 0's
    connection closing), the orchestrator's kill timeout being the backstop."""
    sglog.warning(f"SIGTERM received on node_rank {s.topo.node_rank}; waiting for the rank-0 ShutdownReq "
                  "broadcast to stop the schedulers.")

    def leave() -> None:
        s.rank0_gone.wait(30)
        s.watching = False
        s.kill_process_tree()

    threading.Thread(target=leave, daemon=True).start()
