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


# ------------------------------------------------------------------ card modes, driver, torch's CUDA

FAKE_NVML_MODES = FAKE_NVML + '''
def nvmlSystemGetCudaDriverVersion(): return 12020
def nvmlDeviceGetPciInfo(h): return SimpleNamespace(busId=b"00000000:17:00.0")
def nvmlDeviceGetMigMode(h): return (1, 1)
def nvmlDeviceGetComputeMode(h): return 3
'''
# torch/version.py as a cu128 wheel writes it (the format of this venv's own CPU build)
TORCH_VERSION_PY = """from typing import Optional

__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'rocm', 'xpu']
__version__ = '2.9.1+cu128'
debug = False
cuda: Optional[str] = '12.8'
git_version = 'd38164a545b4a4e4e0cf73ce67173f70574890b6'
hip: Optional[str] = None
"""


def _probe_with(tmp_path: Path, nvml: str, pid: int, torch: str | None = None) -> gpu.GpuSnapshot:
    (tmp_path / "pynvml.py").write_text(textwrap.dedent(nvml))
    if torch is not None:
        (tmp_path / "torch").mkdir()
        (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('the probe must not import torch')\n")
        (tmp_path / "torch" / "version.py").write_text(torch)
    res = subprocess.run([sys.executable, "-c", gpu.PROBE], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(tmp_path), "FAKE_NVML_PID": str(pid), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    return gpu.parse_probe(res.stdout)


def test_nvml_reports_bus_id_mig_compute_mode_and_the_drivers_cuda(tmp_path: Path,
                                                                  sleeper: subprocess.Popen[bytes]) -> None:
    snap = _probe_with(tmp_path, FAKE_NVML_MODES, sleeper.pid, TORCH_VERSION_PY)
    (card,) = snap.gpus
    assert (card.bus_id, card.mig_mode, card.mig_pending, card.compute_mode) == \
        ("00000000:17:00.0", "Enabled", "Enabled", "Exclusive_Process")
    assert (snap.driver_cuda, snap.torch_cuda, snap.torch_version) == ("12.2", "12.8", "2.9.1+cu128")
    # the nvidia-smi path gives the same card from its CSV
    gpus, _ = gpu.parse_smi_gpus("0, GPU-1, NVIDIA RTX A6000, 49140, 30120, 19020, 8.6, 580.95.05\n")
    assert gpu.parse_smi_modes("0, 00000000:17:00.0, Enabled, Enabled, Exclusive_Process\n", gpus) == [card]


def test_a_binding_or_card_without_those_calls_leaves_them_unknown(tmp_path: Path,
                                                                  sleeper: subprocess.Popen[bytes]) -> None:
    snap = _probe_with(tmp_path, FAKE_NVML, sleeper.pid)
    (card,) = snap.gpus
    assert (card.bus_id, card.mig_mode, card.compute_mode, snap.driver_cuda) == ("", None, None, "")


def test_nvidia_smi_na_and_version_outputs() -> None:
    gpus, _ = gpu.parse_smi_gpus("0, GPU-a, NVIDIA RTX A6000, 49140, 0, 49140, 8.6, 535.54.03\n"
                                 "1, GPU-b, NVIDIA H200, 143771, 0, 143771, 9.0, 535.54.03\n")
    modes = gpu.parse_smi_modes("0, 00000000:01:00.0, [N/A], [N/A], Default\n"
                                "1, 00000000:19:00.0, Disabled, Disabled, Prohibited\n", gpus)
    assert [(g.mig_mode, g.compute_mode) for g in modes] == [(None, "Default"), ("Disabled", "Prohibited")]
    version = ("NVIDIA-SMI version  : 535.54.03\nNVML version        : 535.54\n"
               "DRIVER version      : 535.54.03\nCUDA Version        : 12.2\n")
    assert gpu.parse_smi_cuda(version) == "12.2"


def test_the_lab_nvidia_smi_stand_in_speaks_the_same_formats() -> None:
    from ddtree_ops.lab.standin import nvidia_smi, simgpu

    card = simgpu.Card(0, "NVIDIA RTX A6000", "GPU-x", 49140, "8.6", "580.95.05", "13.0", "00000000:01:00.0", 300,
                       mig_mode="Disabled", mig_pending="Enabled", compute_mode="Exclusive_Process")
    text, _, rc = nvidia_smi.run(["--query-gpu=index,pci.bus_id,mig.mode.current,mig.mode.pending,compute_mode",
                                  "--format=csv,noheader,nounits"], card, [])
    assert rc == 0
    gpus, _ = gpu.parse_smi_gpus("0, GPU-x, NVIDIA RTX A6000, 49140, 0, 49140, 8.6, 580.95.05\n")
    (g,) = gpu.parse_smi_modes(text, gpus)
    assert (g.bus_id, g.mig_mode, g.mig_pending, g.compute_mode) == \
        ("00000000:01:00.0", "Disabled", "Enabled", "Exclusive_Process")
    assert gpu.parse_smi_cuda(nvidia_smi.run(["--version"], card, [])[0]) == "13.0"


def _snap(driver: str = "580.95.05", driver_cuda: str = "13.0", torch_cuda: str = "13.0") -> gpu.GpuSnapshot:
    return gpu.GpuSnapshot("nvml", [gpu.Gpu(0, "GPU-0", "NVIDIA H200", 143771, 0, 143771, "9.0")], [], [], driver,
                           driver_cuda, torch_cuda, f"2.11.0+cu{torch_cuda.replace('.', '')}")


@pytest.mark.parametrize("driver, driver_cuda, torch_cuda, status", [
    ("580.159.04", "13.0", "13.0", "ok"),      # the H200 the device lends
    ("570.86.15", "12.8", "13.0", "fail"),     # CUDA 13 needs >= 580
    ("535.54.03", "12.2", "12.8", "warn"),     # minor-version compatibility: runs, newer PTX does not JIT
    ("525.60.13", "12.0", "12.1", "warn"),     # the 12.x minimum itself
    ("470.82.01", "11.4", "12.1", "fail"),
    ("450.80.02", "11.0", "11.8", "warn"),
])
def test_driver_against_the_cuda_torch_was_built_for(driver: str, driver_cuda: str, torch_cuda: str,
                                                     status: str) -> None:
    verdict = gpu.driver_verdict(_snap(driver, driver_cuda, torch_cuda))
    assert verdict is not None and verdict[0] == status
    if status == "fail":
        assert f"driver {driver} is too old" in verdict[1] and f"CUDA {torch_cuda}" in verdict[1]


def test_nothing_to_judge_without_a_cuda_torch_or_a_driver() -> None:
    assert gpu.driver_verdict(_snap(torch_cuda="")) is None  # a CPU torch (the lab's hosts)
    assert gpu.driver_verdict(_snap(driver="")) is None
    assert gpu.driver_verdict(_snap(torch_cuda="10.2")) is None  # not in the table


def test_the_probe_reads_modes_through_nvidia_smi_when_nvml_is_missing(tmp_path: Path) -> None:
    """The probe's nvidia-smi path against the lab's nvidia-smi stand-in (its CSV is nvidia-smi's)."""
    import json
    import os

    (tmp_path / "pynvml.py").write_text("class NVMLError(Exception):\n    pass\n"
                                        "def nvmlInit():\n    raise NVMLError('NVML Shared Library Not Found')\n")
    (tmp_path / "gpu.json").write_text(json.dumps({
        "cards": [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-a", "memory_mib": 143771, "compute_cap": "9.0",
                   "driver_version": "580.159.04", "cuda_version": "13.0", "pci_bus_id": "00000000:19:00.0",
                   "mig_mode": "Enabled", "compute_mode": "Prohibited"}]}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    repo = Path(__file__).resolve().parents[2]
    tool = bin_dir / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\nPYTHONPATH={repo} exec {sys.executable} -m ddtree_ops.lab.standin.nvidia_smi \"$@\"\n")
    tool.chmod(0o755)
    env = {"PYTHONPATH": str(tmp_path), "PATH": f"{bin_dir}:/usr/bin:/bin",
           "DDTREE_LAB_GPU_JSON": str(tmp_path / "gpu.json"), "DDTREE_LAB_GPU_REGISTRY": str(tmp_path / "reg"),
           "HOME": os.environ.get("HOME", "/tmp")}
    res = subprocess.run([sys.executable, "-c", gpu.PROBE], capture_output=True, text=True, timeout=120, env=env)
    snap = gpu.parse_probe(res.stdout)
    assert snap.source == "nvidia-smi", (snap.errors, res.stderr)
    (card,) = snap.gpus
    assert (card.bus_id, card.mig_mode, card.compute_mode) == ("00000000:19:00.0", "Enabled", "Prohibited")
    assert (snap.driver, snap.driver_cuda) == ("580.159.04", "13.0")
