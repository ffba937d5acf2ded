"""ddtree-ops LAB STAND-IN: what `python -m sglang.launch_server` runs on a lab host.

The host's real sglang 0.5.23 parses the argv (`prepare_server_args`: unknown flags end in argparse's own
error and exit 2), loads plugins (`load_plugins`, filtered by SGLANG_PLUGINS) and resolves the algorithm
(`SpeculativeAlgorithm.from_string`: an unknown name raises SGLang's ValueError; a plugin's spec class
answers the predicates that decide hidden capture and graph modes). Then, with no GPU to load onto, the
stand-in walks SGLang's startup printing what real SGLang 0.5.17 printed (`lines.py`), sizes the KV pool
with SGLang's formula against the simulated card, serves SGLang's endpoints, fails where SGLang fails
and stops the way SGLang stops. Waits are compressed: a start takes seconds, a stop about one.

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
import atexit
import contextlib
import ctypes
import dataclasses
import importlib.util
import io
import json
import logging
import os
import resource
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Iterator, Optional

from . import STANDIN_LABEL, SGLANG_VERSION, behaviour, lines, memory, ranks, sglog, simgpu
from .http import State, serve

FAULTS_FILE = Path(os.environ.get("DDTREE_LAB_FAULTS", "/var/lib/ddtree-lab/faults"))
GB = memory.GIB  # SGLang's "GB" in log lines is GiB (bytes / 2**30)
WARMUP_PROMPT = "The capital city of France is"
# SGLang's waits while it stops (a 1 s subprocess watchdog, 5 s drain ticks, a 5 s settle before crash
# diagnostics), scaled down: the stand-in stops in about a second
STOP_SCALE = 0.2


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


def main(argv: list[str]) -> int:
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


EVERY_START = "@every-start"


def read_faults() -> frozenset[str]:
    """The faults for this start. Plain entries are used up here (they mean "the next start");
    entries marked @every-start stay in the file."""
    try:
        lines_ = [ln.strip() for ln in FAULTS_FILE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    except OSError:
        return frozenset()
    keep = [ln for ln in lines_ if ln.endswith(EVERY_START)]
    if len(keep) != len(lines_):
        try:
            FAULTS_FILE.write_text("".join(ln + "\n" for ln in keep))
        except OSError:
            pass
    return frozenset(ln.removesuffix(EVERY_START) for ln in lines_)


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
        cuda_graph_max_bs_prefill=getattr(sa, "cuda_graph_max_bs_prefill", None))


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
    Scheduler(sa, algo, x, p, card, plugin_output, topo=topo, local=local).start()


# --------------------------------------------------------------------------- the scheduler process


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
                # ShutdownReq, others died of it (see start())
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
    """SGLang's launcher, scheduler start-up and serving loop, compressed to seconds."""

    def __init__(self, sa: Any, algo: Any, x: behaviour.Inputs, p: behaviour.Plan, card: simgpu.Card,
                 plugin_output: str, *, topo: ranks.Topology | None = None,
                 local: list[simgpu.Card] | None = None) -> None:
        self.sa, self.algo, self.x, self.p, self.card = sa, algo, x, p, card
        self.topo = topo or ranks.Topology()
        self.local = local or [card]
        self.rank_children: list[SchedulerChild] = []  # the other local ranks' processes (TP1, ...)
        self.rdzv: Optional[ranks.Rendezvous] = None
        self._rank0_gone = threading.Event()
        self.plugin_output = plugin_output
        self.pool = p.pool
        self.t = memory.Shape.from_config(x.target_cfg)
        self.d = memory.Shape.from_config(x.draft_cfg) if x.draft_cfg else None
        self.state: Optional[State] = None
        self.child: Optional[SchedulerChild] = None
        self.watching = True
        self.gracefully_exit = False
        self.shadow: Any = None
        self.timings = dict.fromkeys(lines.GRAPH_TIMING_PHASES, 0.0)
        self._drain_task: Optional[asyncio.Task[None]] = None
        self._watchdog: Optional[asyncio.Task[None]] = None

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
    def start(self) -> None:
        t0 = time.monotonic()
        # which real schedulers outlived the process group's SIGTERM: the DFlash ones with prefill
        # graphs captured (2_dflash, 2_ddtree); with prefill graphs off (runs 4 and 5, which also
        # had --enable-metrics) and without a draft (1_base_*) it died of it
        outlives = self.p.worker == "dflash" and self.x.cuda_graph and bool(self.p.prefill_graph_tokens)
        self.child = SchedulerChild(self.plugin_output, outlives_sigterm=outlives)
        self.rank_children = [SchedulerChild("", outlives_sigterm=outlives) for _ in self.local[1:]]
        signal.signal(signal.SIGQUIT, lambda *_: self._launch_sigquit())
        if self.topo.node_rank > 0:
            signal.signal(signal.SIGTERM, self._other_node_sigterm)
        atexit.register(simgpu.unregister)
        asyncio.run(self.run(t0))

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

    def _launch_sigquit(self) -> None:
        sglog.error(lines.SIGQUIT_LAUNCH)
        self.kill_process_tree()

    def _running_sigquit(self) -> None:
        sglog.error(lines.SIGQUIT_RUNNING)
        self.watching = False
        sglog.info(lines.SLEEPING)
        time.sleep(5 * STOP_SCALE)  # blocking, as SGLang's handler is: nothing else runs meanwhile
        if self.child is None or not self.child.alive():
            sglog.error(lines.NO_LIVE_SCHEDULER)
        self.kill_process_tree()

    def _sigterm(self) -> None:
        sglog.warning(lines.SIGTERM_RECEIVED)
        if self.rdzv is not None:
            self.rdzv.broadcast_shutdown()  # rank 0's ShutdownReq: every node's schedulers leave
        self.gracefully_exit = True
        if self.state is not None:
            self.state.shutting_down = True

    async def _watch_child(self) -> None:
        """SGLang's SubprocessWatchdog: a scheduler that dies is a crash, whatever killed it."""
        while self.watching:
            await asyncio.sleep(1 * STOP_SCALE)
            for i, child in enumerate([self.child, *self.rank_children]):
                code = child.poll() if child is not None else None
                if self.watching and code not in (None, 0):
                    break
            if self.watching and code not in (None, 0):
                sglog.error(lines.SUBPROCESS_CRASHED.format(name=f"scheduler_{i}", pid=child.pid, code=code))
                self.watching = False
                os.kill(os.getpid(), signal.SIGQUIT)
                return

    async def _sigterm_watchdog(self) -> None:
        """TokenizerManager.sigterm_watchdog: drain, then ask the scheduler to leave, then the tree."""
        while not self.gracefully_exit:
            await asyncio.sleep(5 * STOP_SCALE)
        while True:
            rids = list(self.state.inflight) if self.state is not None else []
            sglog.info(lines.GRACEFUL.format(n=len(rids), rids=rids))
            if not rids:
                break
            await asyncio.sleep(5 * STOP_SCALE)
        self.watching = False
        if self.child is not None:
            self.child.shutdown()
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and self.child.alive():
                await asyncio.sleep(0.02)
        self.kill_process_tree()

    def _running_phase(self) -> None:
        """The tokenizer manager's handle loop: created by the first generate request; it replaces
        the launch-phase SIGQUIT handler and takes SIGTERM."""
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._sigterm)
        loop.add_signal_handler(signal.SIGQUIT, self._running_sigquit)
        self._drain_task = loop.create_task(self._sigterm_watchdog())

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

    def tb(self, parts: list[str], exc: str) -> str:
        return lines.traceback(parts, exc, sglang=str(_sglang_dir()), torch=str(_torch_dir()))

    # ---- the start-up
    async def run(self, t0: float) -> None:
        self._watchdog = asyncio.get_running_loop().create_task(self._watch_child())
        ctx = simgpu.CUDA_CONTEXT_MIB * memory.MIB
        p, pool = self.p, self.pool
        tic = time.monotonic()
        self.log("Init torch distributed begin.")
        self.hold(ctx)
        await asyncio.sleep(0.15)
        if self.topo.nnodes > 1:
            await self._rendezvous()
            p, pool = self.p, self.pool
        self.log(f"Init torch distributed ends. elapsed={time.monotonic() - tic:.2f} s, mem usage={ctx / GB:.2f} GB")
        if p.failure == "libcuda":
            await asyncio.sleep(1.5)
            await self.crash(_libcuda_traceback())

        # ---- weights: target, then the draft worker's
        used = ctx
        tic = time.monotonic()
        self.log(f"Load weight begin. avail mem={self.avail(used):.2f} GB")
        await asyncio.sleep(0.5 + (16.0 if p.slow_start else 0.0))
        if "rank-oom" in self.x.faults:
            await self._rank_oom(used)
        used += pool.target_weights
        self.hold(used)
        load_weight = time.monotonic() - tic
        self.log(f"Load weight end. elapsed={load_weight:.2f} s, type={self.t.architecture}, "
                   f"avail mem={self.avail(used):.2f} GB, mem usage={pool.target_weights / GB:.2f} GB.")
        if p.worker != "none" and self.x.draft_cfg:
            self.log("Init torch distributed begin.")  # the draft worker's own TpModelWorker
            self.log("Init torch distributed ends. elapsed=0.00 s, mem usage=0.00 GB")
            tic = time.monotonic()
            self.log(f"Load weight begin. avail mem={self.avail(used):.2f} GB")
            await asyncio.sleep(0.2)
            used += pool.draft_weights
            self.hold(used)
            arch = str(((self.x.draft_cfg or {}).get("architectures") or ["?"])[0])
            self.log(f"Load weight end. elapsed={time.monotonic() - tic:.2f} s, type={arch}, "
                       f"avail mem={self.avail(used):.2f} GB, mem usage={pool.draft_weights / GB:.2f} GB.")
        if p.worker == "dflash":
            self._dflash_setup()

        # ---- the KV pools: the target's, then the draft's (DFlash: a pool of its own)
        tic = time.monotonic()
        if p.failure == "not-enough-memory":
            await asyncio.sleep(0.1)
            await self.crash(self.tb([lines.TB_SCHEDULER_INIT, lines.TB_NOT_ENOUGH_MEMORY],
                                     f"RuntimeError: {p.failure_message}\n"))
        if p.failure == "weights-leave-no-kv":
            await asyncio.sleep(0.1)
            await self.crash(self.tb([lines.TB_SCHEDULER_INIT, lines.TB_WEIGHTS_LEAVE_NO_KV],
                                     f"ValueError: {p.failure_message}\n"))
        dtype = memory.TORCH_DTYPE.get(memory.kv_bytes(self.x.kv_cache_dtype, self.t.dtype_bytes), "torch.bfloat16")
        half = pool.kv_target / 2 / GB
        self.log(f"KV Cache is allocated. dtype: {dtype}, #tokens: {pool.tokens}, K size: {half:.2f} GB, "
                   f"V size: {half:.2f} GB")
        used += pool.kv_target
        self.hold(used)
        self.log(f"Memory pool end. avail mem={self.avail(used):.2f} GB")
        draft_pool = pool.kv_draft or pool.tokens * p.side_draft_cell
        if draft_pool:
            dhalf = draft_pool / 2 / GB
            self.log(f"KV Cache is allocated. dtype: {dtype}, #tokens: {pool.tokens}, K size: {dhalf:.2f} GB, "
                       f"V size: {dhalf:.2f} GB")
            used += draft_pool
            self.hold(used)
            self.log(f"Memory pool end. avail mem={self.avail(used):.2f} GB")
        kv_time = time.monotonic() - tic
        if p.worker == "dflash":
            backend = self.sa.speculative_draft_attention_backend or self.sa.attention_backend or "flashinfer"
            self.warn(f"Overriding draft attention backend to {backend}.")

        # ---- CUDA graphs, captured after the pools out of the (1 - mfs) headroom
        used = await self._graphs(used)
        self.log(f"max_total_num_tokens={pool.tokens}, chunked_prefill_size={p.chunked_prefill_size}, "
                   f"max_prefill_tokens={p.max_prefill_tokens}, max_running_requests={p.max_running_requests}, "
                   f"context_len={p.context_len}, available_gpu_mem={self.avail(used):.2f} GB")
        self.log(lines.TREE_CACHE)
        graphs = ", ".join(f"{k}={v:.2f}" for k, v in self.timings.items())
        e2e = time.monotonic() - t0
        self.log(f"Engine startup timings (s): load_weight={load_weight:.2f}, kv_cache_allocation={kv_time:.2f}, "
                   f"scheduler_e2e={e2e:.2f}, cuda_graph={{{graphs}}}, tokenizer_e2e={e2e + 0.05:.2f}")

        if self.topo.node_rank > 0:
            await self._serve_other_node()
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
            if self.child is not None:
                self.child.kill()
            logging.shutdown()
            os._exit(1)
        sglog.uvicorn(logging.INFO, f"Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)")

        # ---- the warmup request, through the server itself (SGLang's warmup thread)
        target = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        await _request(target, port, "GET", "/model_info")
        self._running_phase()
        if p.hang:
            self.state.phase = "hung"
            await asyncio.Event().wait()
        if p.failure == "hidden-dim":
            if self.shadow is not None:
                self.shadow.prefill()
            await asyncio.sleep(0.3)
            await self.crash(self._dim_traceback(), running=True)
        await _request(target, port, "POST", "/generate", {"text": WARMUP_PROMPT,
                                                           "sampling_params": {"temperature": 0, "max_new_tokens": 8}})
        self.state.phase = "ready"
        sglog.info(lines.READY)
        if p.crash_after_ready:
            await asyncio.sleep(8.0)
            await self.crash(self.tb([lines.TB_EVENT_LOOP], _illegal_memory()), running=True)
        await asyncio.Event().wait()

    # ---- several nodes: the rendezvous, a dead peer, the nodes other than rank 0
    async def _rendezvous(self) -> None:
        """torch's init_process_group over --dist-init-addr (ranks.py); the pool is then sized
        from the least free card of every node."""
        first = self.topo.local_ranks[0]
        self.rdzv = ranks.Rendezvous(self.topo, lambda m: sglog.ranked(logging.WARNING, m, self.topo.prefix(first)))
        free = self.x.total_mib - self.x.others_mib
        try:
            least = await asyncio.to_thread(self.rdzv.join, free)
        except ranks.RendezvousError as exc:
            await self.crash(self.tb([lines.TB_SCHEDULER_INIT], f"{exc}\n"))
            return
        if least < free:
            self.x = dataclasses.replace(self.x, others_mib=self.x.total_mib - least)
            self.p = behaviour.plan(self.x)
            self.pool = self.p.pool
        self.rdzv.watch(self._peer_lost)

    def _peer_lost(self, node: int, clean: bool) -> None:
        """A thread of the rendezvous: a peer's connection closed. After rank 0's shutdown this
        node's schedulers leave cleanly; otherwise their next collective waits for the dead peer
        until the timeout, NCCL's watchdog prints its lines and aborts the scheduler process."""
        self._rank0_gone.set()
        if clean:
            self.watching = False
            for c in [self.child, *self.rank_children]:
                if c is not None:
                    c.kill()
            simgpu.unregister()
            sys.stderr.flush()
            os._exit(0)
        time.sleep(self.topo.dist_timeout_s)
        for r in self.topo.local_ranks:
            for line in ranks.watchdog_lines(self.topo, r):
                sys.stderr.write(line + "\n")
        sys.stderr.flush()
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child.pid, signal.SIGABRT)  # the launcher's watchdog sees scheduler_0 die

    async def _rank_oom(self, used: int) -> None:
        """The `rank-oom` lab fault: the last rank of this node runs out of memory loading its share."""
        rank = self.topo.local_ranks[-1]
        card = self.local[-1]
        free_mib = max(int(self.avail(used) * 1024) - 200, 64)
        want = self.pool.target_weights / GB
        msg = (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {min(want, 1.45):.2f} GiB. GPU "
               f"{self.local.index(card)} has a total capacity of {card.memory_mib / 1024:.2f} GiB of which "
               f"{free_mib:.2f} MiB is free. Including non-PyTorch memory, this process has "
               f"{(card.memory_mib - free_mib) / 1024:.2f} GiB memory in use. Of the allocated memory "
               f"{want:.2f} GiB is allocated by PyTorch, and 21.04 MiB is reserved by PyTorch but unallocated.\n")
        await self.crash(self.tb([lines.TB_SCHEDULER_INIT], msg), rank=rank)

    async def _serve_other_node(self) -> None:
        """A node other than rank 0 serves no API: its schedulers run and SGLang's dummy health
        check server answers /health and /health_generate on the same port (engine.py,
        launch_dummy_health_check_server)."""
        host, port = self.sa.host, int(self.sa.port)

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
            self.kill_process_tree()
        sglog.uvicorn(logging.INFO, f"Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)")
        if self.p.crash_after_ready:
            await asyncio.sleep(8.0)
            await self.crash(self.tb([lines.TB_EVENT_LOOP], _illegal_memory()), running=True)
        await asyncio.Event().wait()

    def _other_node_sigterm(self, *_: Any) -> None:
        """0.5.23's node_rank >= 1 SIGTERM handler: wait for rank 0's ShutdownReq (here: rank 0's
        connection closing), the orchestrator's kill timeout being the backstop."""
        sglog.warning(f"SIGTERM received on node_rank {self.topo.node_rank}; waiting for the rank-0 ShutdownReq "
                      "broadcast to stop the schedulers.")

        def leave() -> None:
            self._rank0_gone.wait(30)
            self.watching = False
            self.kill_process_tree()

        threading.Thread(target=leave, daemon=True).start()

    def _dflash_setup(self) -> None:
        """DFlashWorkerV2's constructor lines (2_dflash)."""
        d = self.d or self.t
        dc = (self.x.draft_cfg or {}).get("dflash_config") or {}
        backend = self.sa.speculative_draft_attention_backend or self.sa.attention_backend or "flashinfer"
        self.log(f"Initialized DFLASH draft runner. attention_backend={backend}, model={d.architecture}, "
                   f"block_size={self.p.draft_window}, draft_window_size=None, compact_cache=False")
        override = dc.get("mask_token_id")
        self.log(f"DFLASH draft runner ready. mask_token={dc.get('mask_token') or '<|MASK|>'}, "
                   f"mask_token_id={override}, mask_token_id_override={override}")
        kv_heads = max(1, -(-d.kv_heads // self.x.tp))
        self.log(f"DFLASH fused KV materialization enabled. n_layers={d.layers}, num_kv_heads={kv_heads}, "
                   f"head_dim={d.head_dim}")

    async def _graphs(self, used: int) -> int:
        p, x = self.p, self.x
        spec = p.worker != "none"
        if not x.cuda_graph or not p.prefill_graph_tokens:
            # one line per model runner: the target's here; the DFlash draft's here too without
            # graphs (2_neg_nonfamily_nograph), else where its runner sets up its graphs, after the
            # target's capture (4_layers_last, 5_ddtree_s025)
            for _ in range(2 if p.worker == "dflash" and not x.cuda_graph else 1):
                self.warn(lines.PREFILL_GRAPH_DISABLED)
        if p.worker == "dflash" and not x.cuda_graph:
            self._start_shadow(graphs=False)
        if not x.cuda_graph:
            return used
        if p.failure == "graph-shape":
            await self.crash(self.tb([lines.TB_SCHEDULER_INIT, lines.TB_GRAPH_TYPE_ERROR],
                                     f"TypeError: {p.failure_message}\n"))
        parts = _graph_parts(p)
        if p.prefill_graph_tokens:
            used = await self._capture("target prefill", "prefill", used, parts["prefill"],
                                       f"backend=breakable, num_tokens={p.prefill_graph_tokens}",
                                       "Capturing num tokens (num_tokens={n} avail_mem={m:.2f} GB)",
                                       list(reversed(p.prefill_graph_tokens)))
        name, phase = ("target verify", "target_verify") if spec else ("target decode", "decode")
        if p.failure == "graph-oom":
            self.log(f"Capture {name} CUDA graph begin. backend=full, num_tokens_per_req={p.tokens_per_req}, "
                       f"bs={p.graph_bs}, avail mem={self.avail(used):.2f} GB")
            await asyncio.sleep(0.4)
            await self.crash(self.tb([lines.TB_SCHEDULER_INIT, lines.TB_GRAPH_OOM], self._graph_oom()))
        used = await self._capture(name, phase, used, parts["target"],
                                   f"backend=full, num_tokens_per_req={p.tokens_per_req}, bs={p.graph_bs}",
                                   "Capturing batches (bs={n} avail_mem={m:.2f} GB)", list(reversed(p.graph_bs)))
        if p.worker == "dflash":
            self._start_shadow(graphs=True)
            if not p.prefill_graph_tokens:
                self.warn(lines.PREFILL_GRAPH_DISABLED)
            head = f"backend=full, num_tokens_per_req={p.tokens_per_req}, bs={p.graph_bs}"
            if p.failure == "draft-graph":
                self.log(f"Capture draft verify CUDA graph begin. {head}, avail mem={self.avail(used):.2f} GB")
                await self.crash(self.tb([lines.TB_SCHEDULER_INIT, lines.TB_DRAFT_GRAPH],
                                         f"RuntimeError: {p.failure_message}\n"))
            used = await self._capture("draft verify", "draft_decode", used, parts["draft"], head,
                                       "Capturing batches (bs={n} avail_mem={m:.2f} GB)", list(reversed(p.graph_bs)))
        elif p.worker == "eagle":  # source: eagle_worker_v2.py (no real 0.5.17 log)
            steps = x.num_steps or 3
            if steps > 1:
                used = await self._capture("draft decode", "draft_decode", used, parts["draft"] // 2,
                                           f"backend=full, num_tokens_per_req={x.eagle_topk or 1}, bs={p.graph_bs}",
                                           "Capturing batches (bs={n} avail_mem={m:.2f} GB)",
                                           list(reversed(p.graph_bs)))
            used = await self._capture("draft extend", "draft_extend", used, parts["draft"] - parts["draft"] // 2,
                                       f"backend=full, num_tokens_per_req={p.tokens_per_req}, bs={p.graph_bs}",
                                       "Capturing batches (bs={n} avail_mem={m:.2f} GB)", list(reversed(p.graph_bs)))
        return used

    async def _capture(self, name: str, phase: str, used: int, nbytes: int, head: str, bar: str,
                       sizes: list[int]) -> int:
        tic = time.monotonic()
        before = self.avail(used)
        self.log(f"Capture {name} CUDA graph begin. {head}, avail mem={before:.2f} GB")
        _progress(bar, sizes, before, nbytes / GB)
        await asyncio.sleep(0.15)
        used += nbytes
        self.hold(used)
        took = time.monotonic() - tic
        self.timings[phase] += took
        self.log(f"Capture {name} CUDA graph end. elapsed={took:.2f} s, mem usage={nbytes / GB:.2f} GB, "
                   f"avail mem={self.avail(used):.2f} GB.")
        return used

    def _start_shadow(self, *, graphs: bool) -> None:
        """The DFlash worker's draft sampler, built before its graph capture: the ddtree plugin's
        mixin decides here whether the head stays eager (and says so), else DFlash folds it in."""
        from . import shadow

        if shadow.is_plugin_worker(self.algo):
            mixin, why = shadow.plugin_mixin()
            if mixin is None:
                sglog.info(f"{STANDIN_LABEL}: the ddtree plugin's shadow accounting cannot run here ({why}); "
                           "serving as SGLang's DFlash worker alone")
            else:
                self.shadow = shadow.ShadowRun(mixin, self.p.draft_window, self.p.capture_layers)
                if graphs:
                    self.shadow.init_cuda_graphs()
                return
        if graphs:
            sglog.info(lines.DRAFT_HEAD_FOLDED)

    def _dim_traceback(self) -> str:
        p = self.p
        tokens = _prompt_tokens(WARMUP_PROMPT)
        exc = "ValueError: " + lines.DIM_MISMATCH.format(
            expected=p.hidden_expected, features=len(p.draft_layer_ids or []),
            hidden=(self.d or self.t).hidden, tokens=tokens, got=p.hidden_got) + "\n"
        parts = [lines.TB_EVENT_LOOP]
        if self.shadow is not None:
            parts.append(_plugin_frame())
        return self.tb(parts + [lines.TB_DIM_MISMATCH], exc)

    def _graph_oom(self) -> str:
        pool = self.pool
        free = max(pool.avail_after_pool, 0)
        oom = (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {pool.graph / GB:.2f} GiB. GPU 0 has a "
               f"total capacity of {pool.total / GB:.2f} GiB of which {free / memory.MIB:.2f} MiB is free. Including "
               f"non-PyTorch memory, this process has {(pool.total - pool.others - free) / GB:.2f} GiB memory in use.")
        return f"Exception: Capture cuda graph failed: {oom}\n{lines.CAPTURE_FAILED_HINT}"

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
                     cuda_graph=bool(x.cuda_graph), decode_log_interval=int(getattr(sa, "decode_log_interval", 40) or 40),
                     shadow=self.shadow)


def _graph_parts(p: behaviour.Plan) -> dict[str, int]:
    """How the graphs' memory splits between the captures (the total is the pool's estimate)."""
    total = p.pool.graph
    prefill = total // 8 if p.prefill_graph_tokens else 0
    draft = (total - prefill) // 3 if p.worker in ("dflash", "eagle") else 0
    return {"prefill": prefill, "target": total - prefill - draft, "draft": draft}


def _progress(bar: str, sizes: list[int], avail: float, mem: float) -> None:
    """The capture's tqdm bar on stderr, as SGLang draws it (one line of carriage returns in a log)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return
    with tqdm(total=len(sizes), file=sys.stderr, mininterval=0, ascii=False, dynamic_ncols=False,
              ncols=None) as t:
        for i, n in enumerate(sizes):
            t.set_description(bar.format(n=n, m=avail - mem * i / max(len(sizes), 1)))
            t.update(1)


def _prompt_tokens(text: str) -> int:
    from .textgen import count_tokens

    return count_tokens(text)


def _sglang_dir() -> Path:
    return sglog.sglang_dir() or Path("sglang")


def _torch_dir() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return _sglang_dir().parent / "torch"


def _plugin_frame() -> str:
    """The plugin mixin's frame between SGLang's scheduler and DFlash's forward, at its real line."""
    try:
        from ddtree_ops.engine import sglang_shadow
    except Exception:  # noqa: BLE001
        return ""
    return sglog.frame_in(Path(sglang_shadow.__file__), "forward_batch_generation",
                          "result = super().forward_batch_generation(")


async def _request(host: str, port: int, method: str, path: str, doc: Any = None) -> None:
    body = json.dumps(doc).encode() if doc is not None else b""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
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
        real = traceback.format_exc().split("\n", 1)[1]
        return lines.traceback([lines.TB_SCHEDULER_INIT], real, sglang=str(_sglang_dir()), torch=str(_torch_dir()))
    return "Traceback (most recent call last):\nOSError: libcuda.so.1: cannot open shared object file\n"


def _preload_cuda_library(name: str) -> None:
    # the stand-in's copy of sgl_kernel/load_utils.py:_preload_cuda_library (sgl_kernel is not installed here)
    ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)


def _illegal_memory() -> str:
    return ("RuntimeError: CUDA error: an illegal memory access was encountered\n"
            "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
            "might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
            "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")
