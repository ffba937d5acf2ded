"""ddtree-ops LAB STAND-IN: the faults injected into a start, and the tracebacks they end in.

The lab writes fault names into /var/lib/ddtree-lab/faults (`ddtree-ops lab fault HOST NAME`); a
start reads them here (and uses plain entries up). Where a fault or a misconfiguration makes SGLang
raise, the traceback is built here: SGLang 0.5.17's frames (`lines.py`) under the host's own sglang
and torch directories, and, for a library that cannot load, a genuine OSError from ctypes.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import traceback
from pathlib import Path

from . import lines, memory, sglog
from .scheduler import GB, Scheduler
from .textgen import count_tokens

FAULTS_FILE = Path(os.environ.get("DDTREE_LAB_FAULTS", "/var/lib/ddtree-lab/faults"))
EVERY_START = "@every-start"


# how long a timed fault lasts when its entry gives no length (`slow-start`, not `slow-start=4`)
DEFAULT_SECONDS = {"slow-start": 16.0, "crash-after-ready": 8.0}
# the lengths this start's entries gave; set by read_faults (one start is one process: its forks inherit it)
_SECONDS: dict[str, float] = {}


def read_faults() -> frozenset[str]:
    """The faults for this start. Plain entries are used up here (they mean "the next start");
    entries marked @every-start stay in the file. An entry `NAME=SECONDS` gives a timed fault its
    length (`seconds`)."""
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
    names = set()
    for entry in (ln.removesuffix(EVERY_START) for ln in lines_):
        name, _, value = entry.partition("=")
        names.add(name)
        if value:
            try:
                _SECONDS[name] = float(value)
            except ValueError:
                pass  # the lab writes numbers; a hand-edited typo keeps the default length
    return frozenset(names)


def seconds(name: str) -> float:
    """How long the timed fault `name` lasts in this start."""
    return _SECONDS.get(name, DEFAULT_SECONDS[name])


# --------------------------------------------------------------------------- tracebacks


def traceback_text(parts: list[str], exc: str) -> str:
    """A scheduler traceback: SGLang's frame blocks under the host's sglang and torch, then `exc`."""
    return lines.traceback(parts, exc, sglang=str(_sglang_dir()), torch=str(_torch_dir()))


def libcuda_traceback() -> str:
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


def illegal_memory() -> str:
    return ("RuntimeError: CUDA error: an illegal memory access was encountered\n"
            "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
            "might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
            "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")


def graph_oom(pool: memory.Pool) -> str:
    """CUDA graph capture out of memory: the graphs' estimate did not fit in what the pools left."""
    free = max(pool.avail_after_pool, 0)
    oom = (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {pool.graph / GB:.2f} GiB. GPU 0 has a "
           f"total capacity of {pool.total / GB:.2f} GiB of which {free / memory.MIB:.2f} MiB is free. Including "
           f"non-PyTorch memory, this process has {(pool.total - pool.others - free) / GB:.2f} GiB memory in use.")
    return f"Exception: Capture cuda graph failed: {oom}\n{lines.CAPTURE_FAILED_HINT}"


def dim_traceback(s: Scheduler) -> str:
    """The first prefill of a draft whose hidden-state capture was not set up: a shape mismatch in
    DFlash's forward (through the plugin's mixin, when the shadow runs)."""
    p = s.p
    tokens = count_tokens(lines.WARMUP_PROMPT)
    exc = "ValueError: " + lines.DIM_MISMATCH.format(
        expected=p.hidden_expected, features=len(p.draft_layer_ids or []),
        hidden=(s.d or s.t).hidden, tokens=tokens, got=p.hidden_got) + "\n"
    parts = [lines.TB_EVENT_LOOP]
    if s.shadow is not None:
        parts.append(_plugin_frame())
    return traceback_text(parts + [lines.TB_DIM_MISMATCH], exc)


async def rank_oom(s: Scheduler, used: int) -> None:
    """The `rank-oom` lab fault: the last rank of this node runs out of memory loading its share."""
    rank = s.topo.local_ranks[-1]
    card = s.local[-1]
    free_mib = max(int(s.avail(used) * 1024) - 200, 64)
    want = s.pool.target_weights / GB
    msg = (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {min(want, 1.45):.2f} GiB. GPU "
           f"{s.local.index(card)} has a total capacity of {card.memory_mib / 1024:.2f} GiB of which "
           f"{free_mib:.2f} MiB is free. Including non-PyTorch memory, this process has "
           f"{(card.memory_mib - free_mib) / 1024:.2f} GiB memory in use. Of the allocated memory "
           f"{want:.2f} GiB is allocated by PyTorch, and 21.04 MiB is reserved by PyTorch but unallocated.\n")
    await s.crash(traceback_text([lines.TB_SCHEDULER_INIT], msg), rank=rank)


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
        # the ddtree plugin where it is installed (a lab host has it only after a ddtree-shadow deploy)
        from ddtree_ops.engine import sglang_shadow
    except Exception:  # noqa: BLE001
        return ""
    return sglog.frame_in(Path(sglang_shadow.__file__), "forward_batch_generation",
                          "result = super().forward_batch_generation(")
