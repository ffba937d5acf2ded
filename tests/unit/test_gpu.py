"""The GPU probe names every process holding GPU memory, whichever path (NVML or nvidia-smi) saw it.

The probe script is the one preflight and diagnose run on a host. NVML cannot load here, so a
stand-in `pynvml` module (same function names as nvidia-ml-py) reports one card and one process:
a real `sleep` started by the test, so the name comes from the real /proc, as on a host.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ddtree_ops import gpu

FAKE_NVML = '''
"""Stand-in for nvidia-ml-py's pynvml: one RTX A6000 with one compute process (pid from the test)."""
import os
from types import SimpleNamespace

class NVMLError(Exception):
    pass

def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlSystemGetDriverVersion(): return "580.95.05"
def nvmlDeviceGetCount(): return 1
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetMemoryInfo(h):
    return SimpleNamespace(total=49140 * 1048576, used=30120 * 1048576, free=19020 * 1048576)
def nvmlDeviceGetCudaComputeCapability(h): return (8, 6)
def nvmlDeviceGetUUID(h): return "GPU-1"
def nvmlDeviceGetName(h): return b"NVIDIA RTX A6000"
def nvmlDeviceGetComputeRunningProcesses(h):
    return [SimpleNamespace(pid=int(os.environ["FAKE_NVML_PID"]), usedGpuMemory=30000 * 1048576)]
'''


def _probe(tmp_path: Path, pid: int) -> gpu.GpuSnapshot:
    (tmp_path / "pynvml.py").write_text(textwrap.dedent(FAKE_NVML))
    res = subprocess.run([sys.executable, "-c", gpu.PROBE], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(tmp_path), "FAKE_NVML_PID": str(pid), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    return gpu.parse_probe(res.stdout)


@pytest.fixture
def sleeper() -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_nvml_processes_are_named_from_proc_comm(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    snap = _probe(tmp_path, sleeper.pid)
    assert snap.source == "nvml" and snap.errors == []
    (app,) = snap.apps
    assert (app.pid, app.name, app.used_mib, app.gpu_uuid) == (sleeper.pid, "sleep", 30000, "GPU-1")
    # a stray is told apart from the service by its unit, and now reads with its name
    assert snap.strays("sglang.service") == [app]


def test_a_process_gone_before_the_probe_has_an_empty_name(tmp_path: Path) -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    (app,) = _probe(tmp_path, proc.pid).apps
    assert app.name == "" and app.unit is None


def test_nvml_and_nvidia_smi_paths_agree(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    nvml = _probe(tmp_path, sleeper.pid)
    gpus, driver = gpu.parse_smi_gpus("0, GPU-1, NVIDIA RTX A6000, 49140, 30120, 19020, 8.6, 580.95.05\n")
    apps = gpu.parse_smi_apps(f"GPU-1, {sleeper.pid}, sleep, 30000\n")
    assert nvml.gpus == gpus and nvml.driver == driver
    assert [(a.pid, a.name, a.used_mib) for a in nvml.apps] == [(a.pid, a.name, a.used_mib) for a in apps]
