"""ddtree-ops LAB STAND-IN: SGLang's scheduler processes and the launcher's hold on them.

One `Scheduler` is the state of one start (the server args, the plan, the pool, the cards and the
ranks) and what SGLang's launcher does with its scheduler processes: real child processes in their
place (`SchedulerChild`), the log lines each rank prints with its prefix, the GPU memory nvidia-smi
shows for each, the SIGQUIT handlers of the launch and running phases, the subprocess watchdog, and a
crash. The start-up phases are `startup.py`, the HTTP side `serving.py`, the other nodes `nodes.py`,
the injected faults `faults.py`; `server.py` runs them in SGLang's order.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Optional

from . import behaviour, lines, memory, ranks, sglog, simgpu
from .http import State

GB = memory.GIB  # SGLang's "GB" in log lines is GiB (bytes / 2**30)
# SGLang's waits while it stops (a 1 s subprocess watchdog, 5 s drain ticks, a 5 s settle before crash
# diagnostics), scaled down: the stand-in stops in about a second
STOP_SCALE = 0.2


class SchedulerChild:
    """A real child process in the place of SGLang's `scheduler_0`: it prints what a scheduler prints
    (the plugins' load lines, torch's exit warning), dies of the process group's SIGTERM or outlives
    it as the real one did, and exits on a ShutdownReq (SIGUSR1 here)."""

    def __init__(self, plugin_output: str, *, outlives_sigterm: bool) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = getattr(libc, "prctl", None)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: signal handlers and writes only
            try:
                os.close(r)
                if prctl is not None:
                    prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: never outlive the launcher
                for sig in (signal.SIGQUIT, signal.SIGINT, signal.SIGHUP):
                    signal.signal(sig, signal.SIG_DFL)
                # some real 0.5.17 schedulers outlived the process group's SIGTERM and left after
                # ShutdownReq, others died of it (see Scheduler.start_processes)
                signal.signal(signal.SIGTERM, signal.SIG_IGN if outlives_sigterm else signal.SIG_DFL)
                signal.signal(signal.SIGUSR1, lambda *_: SchedulerChild._exit_clean())
                if plugin_output:
                    os.write(2, plugin_output.encode())
                os.write(w, b"1")
                os.close(w)
                while True:
                    signal.pause()
            finally:
                os._exit(0)
        os.close(w)
        os.read(r, 1)  # the child's own lines come before the scheduler's first line
        os.close(r)
        self.pid = pid
        self.outlives_sigterm = outlives_sigterm
        self.status: Optional[int] = None

    @staticmethod
    def _exit_clean() -> None:
        time.sleep(1 * STOP_SCALE)  # a scheduler takes about a second to wind down and leave
        now = time.time()
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1e9):09d}"
        os.write(2, (lines.NCCL_NOT_DESTROYED.format(stamp=stamp) + "\n").encode())
        os._exit(0)

    def poll(self) -> Optional[int]:
        """multiprocessing's exitcode: the exit status, or -N when killed by signal N."""
        if self.status is None:
            try:
                pid, raw = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return self.status
            if pid:
                self.status = -os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else os.WEXITSTATUS(raw)
        return self.status

    def alive(self) -> bool:
        return self.poll() is None

    def shutdown(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGUSR1)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


class Scheduler:
    """SGLang's launcher and scheduler processes for one start, compressed to seconds."""

    def __init__(self, sa: Any, algo: Any, x: behaviour.Inputs, p: behaviour.Plan, card: simgpu.Card,
                 plugin_output: str, *, topo: ranks.Topology | None = None,
                 local: list[simgpu.Card] | None = None) -> None:
        self.sa, self.algo, self.x, self.p, self.card = sa, algo, x, p, card
        self.topo = topo or ranks.Topology()
        self.local = local or [card]
        self.rank_children: list[SchedulerChild] = []  # the other local ranks' processes (TP1, ...)
        self.rdzv: Optional[ranks.Rendezvous] = None
        self.rank0_gone = threading.Event()  # another node's view: rank 0's connection closed
        self.plugin_output = plugin_output
        self.pool = p.pool
        self.t = memory.Shape.from_config(x.target_cfg)
        self.d = memory.Shape.from_config(x.draft_cfg) if x.draft_cfg else None
        self.state: Optional[State] = None
        self.child: Optional[SchedulerChild] = None
        self.watching = True
        self.child_crashed = False  # the watcher reported a scheduler's death (and sent SIGQUIT)
        self.gracefully_exit = False
        self.shadow: Any = None
        self.timings = dict.fromkeys(lines.GRAPH_TIMING_PHASES, 0.0)
        # the asyncio tasks of the watchdogs (kept: a task nobody holds may be collected)
        self.drain_task: Optional[asyncio.Task[None]] = None
        self.watchdog_task: Optional[asyncio.Task[None]] = None

    # ---- log lines: a scheduler's carry its rank (one line per local rank)
    def log(self, msg: str, level: int = logging.INFO, ranks_: Optional[list[int]] = None) -> None:
        for r in self.topo.local_ranks if ranks_ is None else ranks_:
            sglog.ranked(level, msg, self.topo.prefix(r))

    def warn(self, msg: str) -> None:
        self.log(msg, logging.WARNING)

    # ---- GPU memory as nvidia-smi sees it: each rank's process on its own card
    def hold(self, used_bytes: int) -> None:
        if self.topo.world == 1:
            simgpu.register(int(used_bytes // memory.MIB))
            return
        for proc, card in zip([self.child, *self.rank_children], self.local):
            if proc is not None:
                simgpu.register(int(used_bytes // memory.MIB), pid=proc.pid, card=card.index)

    def avail(self, used_bytes: int) -> float:
        return (self.pool.total - self.pool.others - used_bytes) / GB

    # ---- process handling, as SGLang's launcher does it
    def start_processes(self) -> None:
        """The scheduler processes (one per local rank) and the launch phase's SIGQUIT handler."""
        # which real schedulers outlived the process group's SIGTERM: the DFlash ones with prefill
        # graphs captured (2_dflash, 2_ddtree); with prefill graphs off (runs 4 and 5, which also
        # had --enable-metrics) and without a draft (1_base_*) it died of it
        outlives = self.p.worker == "dflash" and self.x.cuda_graph and bool(self.p.prefill_graph_tokens)
        self.child = SchedulerChild(self.plugin_output, outlives_sigterm=outlives)
        self.rank_children = [SchedulerChild("", outlives_sigterm=outlives) for _ in self.local[1:]]
        signal.signal(signal.SIGQUIT, lambda *_: self.launch_sigquit())
        atexit.register(simgpu.unregister)

    def kill_process_tree(self) -> None:
        pid = os.getpid()
        sglog.info(lines.KILL_TREE.format(pid=pid, include=True))
        if self.child is not None:
            self.child.kill()
        for c in self.rank_children:
            c.kill()
        for h in logging.getLogger().handlers:
            h.flush()
        sys.stderr.flush()
        sys.stdout.flush()
        simgpu.unregister()
        os.kill(pid, signal.SIGKILL)

    def launch_sigquit(self) -> None:
        sglog.error(lines.SIGQUIT_LAUNCH)
        self.kill_process_tree()

    def running_sigquit(self) -> None:
        sglog.error(lines.SIGQUIT_RUNNING)
        self.watching = False
        sglog.info(lines.SLEEPING)
        time.sleep(5 * STOP_SCALE)  # blocking, as SGLang's handler is: nothing else runs meanwhile
        if self.child is None or not self.child.alive():
            sglog.error(lines.NO_LIVE_SCHEDULER)
        self.kill_process_tree()

    async def watch_children(self) -> None:
        """SGLang's SubprocessWatchdog: a scheduler that dies is a crash, whatever killed it."""
        while self.watching:
            await asyncio.sleep(1 * STOP_SCALE)
            for i, child in enumerate([self.child, *self.rank_children]):
                code = child.poll() if child is not None else None
                if self.watching and code not in (None, 0):
                    break
            if self.watching and code == -signal.SIGTERM:
                # the stop's SIGTERM reached this process with the child's (systemd and killpg signal the
                # whole group at once) but its handler runs on a later turn of this loop. A real scheduler
                # takes seconds to die, so SGLang logs "SIGTERM received" first; this child dies at once,
                # and without the wait a poll that lands in between logged the crash first (a loaded CI
                # box, 2026-12-05), which `diagnose` rightly reads as a crash with no stop before it
                await asyncio.sleep(0.05)
            if self.watching and code not in (None, 0):
                sglog.error(lines.SUBPROCESS_CRASHED.format(name=f"scheduler_{i}", pid=child.pid, code=code))
                self.child_crashed, self.watching = True, False
                os.kill(os.getpid(), signal.SIGQUIT)
                return

    async def crash(self, tb: str, *, running: bool = False, rank: Optional[int] = None) -> None:
        """The scheduler's exception: its traceback, then SIGQUIT to the launcher, whose handler of
        the moment takes it from there (launch phase: kill at once; running: diagnostics first)."""
        self.log(f"Scheduler hit an exception: {tb}", logging.ERROR,
                 [self.topo.local_ranks[0] if rank is None else rank])
        for h in logging.getLogger().handlers:
            h.flush()
        if running and self.child is not None:
            self.watching = False
            self.child.shutdown()  # the scheduler process leaves after its SIGQUIT
        os.kill(os.getpid(), signal.SIGQUIT)
        await asyncio.Event().wait()
