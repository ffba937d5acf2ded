"""Run the SGLang stand-in as a local process (this machine's venv has the real sglang 0.5.23 parser),
against a temporary simulated GPU, registry and fault file.

Each stand-in is its own process, in a session of its own (so a SIGTERM to its process group is what
systemd's KillMode=control-group sends). They are forked from one server that has imported sglang
once (multiprocessing's forkserver): importing sglang costs seconds of CPU, forking costs nothing.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import time
import traceback
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIX = Path(__file__).resolve().parents[2] / "ddtree_ops" / "lab" / "fixtures"
A6000 = {"index": 0, "name": "NVIDIA RTX A6000", "uuid": "GPU-test", "memory_mib": 49140, "compute_cap": "8.6",
         "driver_version": "570.172.08"}
# the card real SGLang 0.5.17 ran on (tests/data/real-sglang/0.5.17/*_summary.txt)
H200 = {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-test-h200", "memory_mib": 143771, "compute_cap": "9.0",
        "driver_version": "580.159.04", "cuda_version": "13.0"}
# what a lab host's shim runs, as a command line (start() runs the same entry point, forked)
LAUNCH = "import sys; from ddtree_ops.lab.standin.server import main; sys.exit(main(sys.argv[1:]))"
PRELOAD = ["sglang.srt.server_args", "sglang.srt.plugins", "sglang.srt.speculative.spec_info",
           "sglang.srt.speculative.spec_registry"]

# Throwaway SGLang plugins that register DDTREE. The worker factory names SGLang's DFlash worker (the
# stand-in never builds it); "family" answers as DFlash-family, "plain" is a bare CustomSpecAlgo.
PLUGIN = '''
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import CustomSpecAlgo


class DFlashFamily(CustomSpecAlgo):
    def is_dflash_family(self):
        return True

    def supports_target_verify_for_draft(self):
        return True


def _factory(server_args):
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    return DFlashWorkerV2


def register():
    kw = {"spec_class": DFlashFamily} if FAMILY else {}
    SpeculativeAlgorithm.register("DDTREE", supports_overlap=True, **kw)(_factory)
'''
# The negative controls of the real runs (2_summary.txt: SGLANG_PLUGINS=ddtree_nonfamily / ddtree_plain):
# DDTREE with the ddtree plugin's worker, validator and server-args hook, but a spec class that is not
# DFlash-family, or a plain CustomSpecAlgo.
NEGCTL = '''
import sys

from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import CustomSpecAlgo

from ddtree_ops.engine import sglang_plugin as ddtree


class NonFamily(CustomSpecAlgo):
    """Answers False to is_dflash_family(); resolves its server args as DFLASH does."""

    handle_server_args = ddtree._spec_class().handle_server_args


def register_nonfamily():
    SpeculativeAlgorithm.register("DDTREE", supports_overlap=True, validate_server_args=ddtree.validate_server_args,
                                  spec_class=NonFamily)(ddtree.worker_factory)
    print("negctl: DDTREE registered as a non-DFlash-family CustomSpecAlgo subclass", file=sys.stderr, flush=True)


def register_plain():
    SpeculativeAlgorithm.register("DDTREE", supports_overlap=True,
                                  validate_server_args=ddtree.validate_server_args)(ddtree.worker_factory)
    print("negctl: DDTREE registered as a plain CustomSpecAlgo", file=sys.stderr, flush=True)
'''


def plugin_source(family: bool) -> str:
    """A throwaway SGLang plugin that registers DDTREE, DFlash-family or not."""
    return f"FAMILY = {family}\n{PLUGIN}"


def install_plugin(pdir: Path, dist: str, source: str, entry_points: dict[str, str]) -> None:
    """A plugin importable from `pdir` (put it on PYTHONPATH), found by entry point like a wheel's."""
    info = pdir / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (pdir / f"{dist}.py").write_text(source)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[sglang.srt.plugins]\n" + "".join(
        f"{name} = {dist}:{func}\n" for name, func in entry_points.items()))


def install_tree_backend(pdir: Path) -> None:
    """The stand-in's simulated tree verify, declared as a lab host's payload declares it
    (ddtree_ops/lab/payload.py), for the stand-in run from this checkout: put `pdir` on PYTHONPATH."""
    info = pdir / "sglang_standin_local-0.0.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang-standin-local\nVersion: 0.0.0\n")
    (info / "entry_points.txt").write_text("[ddtree_ops.tree_verify]\n* = ddtree_ops.lab.standin.treesim:SimTreeVerify\n")


def nextn_argv(port: int) -> list[str]:
    return ["--model-path", str(FIX / "Qwen3-8B"), "--host", "127.0.0.1", "--port", str(port),
            "--mem-fraction-static", "0.81", "--context-length", "32768", "--max-running-requests", "4",
            "--attention-backend", "flashinfer", "--enable-metrics", "--served-model-name", "qwen3-8b",
            "--cuda-graph-max-bs-decode", "8", "--speculative-algorithm", "NEXTN",
            "--speculative-draft-model-path", str(FIX / "Qwen3-8B-NextN"), "--speculative-num-steps", "3",
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def ddtree_argv(port: int, draft: str | None = None) -> list[str]:
    return ["--model-path", str(FIX / "Qwen3-8B"), "--host", "127.0.0.1", "--port", str(port),
            "--mem-fraction-static", "0.85", "--context-length", "32768", "--max-running-requests", "4",
            "--enable-metrics", "--speculative-algorithm", "DDTREE",
            "--speculative-draft-model-path", draft or str(FIX / "Qwen3-8B-DFlash-b16"),
            "--speculative-num-draft-tokens", "16"]


# ---------------------------------------------------------------- the process


def _child(argv: list[str], env: dict[str, str], log: str) -> None:
    """In the forked process: a session of its own, the log as stdout and stderr, the environment
    of the run, then the stand-in's entry point (`python -m sglang.launch_server` on a lab host)."""
    os.setsid()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    os.environ.clear()
    os.environ.update(env)
    sys.path[:0] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    code: Any = 1
    try:
        from ddtree_ops.lab.standin.server import main

        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - what the interpreter prints for an uncaught exception
        traceback.print_exc()
        code = 1
    if not isinstance(code, int):
        if code is not None:
            print(code, file=sys.stderr)
        code = 0 if code is None else 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


_CTX: Any = None


def _context() -> Any:
    global _CTX
    if _CTX is None:
        _CTX = multiprocessing.get_context("forkserver")
        _CTX.set_forkserver_preload(PRELOAD)
    return _CTX


class Proc:
    """The part of Popen's interface the tests use, over a forked multiprocessing.Process."""

    def __init__(self, process: Any) -> None:
        self.process = process
        self.pid: int = process.pid

    def poll(self) -> int | None:
        return self.process.exitcode

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def send_signal(self, sig: int) -> None:
        """To the stand-in's main process only (Popen's send_signal)."""
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise TimeoutError(f"pid {self.pid} still running after {timeout} s")
        return int(self.process.exitcode)

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def terminate(self) -> None:
        """SIGTERM to the whole process group, as systemd's KillMode=control-group stops a unit."""
        self.signal_group(signal.SIGTERM)

    def kill(self) -> None:
        self.signal_group(signal.SIGKILL)


@dataclass
class Standin:
    proc: Proc
    port: int
    dir: Path

    def log(self) -> str:
        return (self.dir / "out.log").read_text(errors="replace")

    def get(self, path: str, timeout: float = 5) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def post(self, path: str, doc: Any, timeout: float = 10) -> tuple[int, Any]:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(doc).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())

    def wait_log(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log():
            if time.monotonic() > deadline or (self.proc.poll() is not None and text not in self.log()):
                raise AssertionError(f"{text!r} not in the log:\n{self.log()[-3000:]}")
            time.sleep(0.1)

    def wait_ready(self, timeout: float = 60) -> bool:
        """Poll /health_generate as the gate does: True once it answers 200, False if the server died."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if self.get("/health_generate", timeout=5)[0] == 200:
                    return True
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.25)
        raise AssertionError(f"neither ready nor dead after {timeout} s:\n{self.log()[-3000:]}")

    def wait_exit(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        """SIGTERM to the process group, as systemd stops a unit; SIGKILL if it outlives 10 s."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except TimeoutError:
                self.proc.kill()
                self.proc.wait(timeout=10)


def start(tmp: Path, argv: list[str], *, faults: tuple[str, ...] = (), plugin: str | None = None,
          env: dict[str, str] | None = None, port: int | None = None, card: dict[str, Any] | None = None) -> Standin:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "gpu.json").write_text(json.dumps(card or A6000))
    (tmp / "faults").write_text("".join(f + "\n" for f in faults))
    e = {**os.environ, "DDTREE_LAB_GPU_JSON": str(tmp / "gpu.json"), "DDTREE_LAB_GPU_REGISTRY": str(tmp / "reg"),
         "DDTREE_LAB_FAULTS": str(tmp / "faults"), "SGLANG_PLUGINS": "labtest-none", "PYTHONUNBUFFERED": "1"}
    if plugin is not None:
        pdir = tmp / "plugin"
        install_plugin(pdir, "labplug", plugin_source(plugin == "family"), {"labtest": "register"})
        e.update({"PYTHONPATH": str(pdir), "SGLANG_PLUGINS": "labtest"})
    e.update(env or {})
    (tmp / "out.log").write_text("")
    process = _context().Process(target=_child, args=(list(argv), e, str(tmp / "out.log")), daemon=True)
    process.start()
    return Standin(Proc(process), port or 0, tmp)
