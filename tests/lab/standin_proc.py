"""Run the SGLang stand-in as a local subprocess (this machine's venv has the real sglang 0.5.23
parser), against a temporary simulated GPU, registry and fault file."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIX = Path(__file__).resolve().parents[2] / "ddtree_ops" / "lab" / "fixtures"
A6000 = {"index": 0, "name": "NVIDIA RTX A6000", "uuid": "GPU-test", "memory_mib": 49140, "compute_cap": "8.6",
         "driver_version": "570.172.08"}
LAUNCH = "import sys; from ddtree_ops.lab.standin.server import main; sys.exit(main(sys.argv[1:]))"
PLUGIN = '''
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import CustomSpecAlgo


class DFlashFamily(CustomSpecAlgo):
    def is_dflash_family(self):
        return True


def register():
    kw = {"spec_class": DFlashFamily} if FAMILY else {}

    @SpeculativeAlgorithm.register("DDTREE", **kw)
    def _factory(server_args):
        return object
'''


def plugin_source(family: bool) -> str:
    """A throwaway SGLang plugin that registers DDTREE, DFlash-family or not."""
    return f"FAMILY = {family}\n{PLUGIN}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


@dataclass
class Standin:
    proc: subprocess.Popen[str]
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

    def wait_exit(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def start(tmp: Path, argv: list[str], *, faults: tuple[str, ...] = (), plugin: str | None = None,
          env: dict[str, str] | None = None, port: int | None = None) -> Standin:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "gpu.json").write_text(json.dumps(A6000))
    (tmp / "faults").write_text("".join(f + "\n" for f in faults))
    e = {**os.environ, "DDTREE_LAB_GPU_JSON": str(tmp / "gpu.json"), "DDTREE_LAB_GPU_REGISTRY": str(tmp / "reg"),
         "DDTREE_LAB_FAULTS": str(tmp / "faults"), "SGLANG_PLUGINS": "labtest-none", "PYTHONUNBUFFERED": "1"}
    if plugin is not None:
        pdir = tmp / "plugin"
        (pdir / "labplug-0.1.dist-info").mkdir(parents=True, exist_ok=True)
        (pdir / "labplug.py").write_text(plugin_source(plugin == "family"))
        (pdir / "labplug-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: labplug\nVersion: 0.1\n")
        (pdir / "labplug-0.1.dist-info" / "entry_points.txt").write_text("[sglang.srt.plugins]\nlabtest = labplug:register\n")
        e.update({"PYTHONPATH": str(pdir), "SGLANG_PLUGINS": "labtest"})
    e.update(env or {})
    out = open(tmp / "out.log", "w")
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, *argv], stdout=out, stderr=subprocess.STDOUT, env=e,
                            text=True, start_new_session=True)
    return Standin(proc, port or 0, tmp)
