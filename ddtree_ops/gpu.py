"""GPU facts from a host: NVML first (nvidia-ml-py), nvidia-smi's CSV when NVML cannot load.

The probe is one self-contained script (stdlib + optional pynvml) run by the host's own Python in
one round trip; it also names the systemd unit owning each process that holds GPU memory, so a
stray worker from an earlier run is told apart from the service about to be restarted.
`python -m ddtree_ops.gpu probe --json` runs the same probe locally.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

PROBE = r'''
import json, os, re, subprocess, sys
out = {"source": None, "gpus": [], "apps": [], "errors": []}
def unit_of(pid):
    try:
        text = open("/proc/%d/cgroup" % pid).read()
    except OSError:
        return None
    m = re.findall(r"/([^/\n]+\.service)", text)
    return m[-1] if m else None
def comm_of(pid):
    # NVML gives PIDs only; nvidia-smi names them, and a stray process must be named either way
    try:
        return open("/proc/%d/comm" % pid).read().strip()
    except OSError:
        return ""
try:
    import pynvml
    pynvml.nvmlInit()
    try:
        out["driver"] = pynvml.nvmlSystemGetDriverVersion()
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            name = pynvml.nvmlDeviceGetName(h)
            out["gpus"].append({"index": i, "uuid": uuid if isinstance(uuid, str) else uuid.decode(),
                "name": name if isinstance(name, str) else name.decode(),
                "memory_total_mib": mem.total // 1048576, "memory_used_mib": mem.used // 1048576,
                "memory_free_mib": mem.free // 1048576, "compute_cap": "%d.%d" % (major, minor)})
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                used = (p.usedGpuMemory or 0) // 1048576
                out["apps"].append({"gpu_uuid": out["gpus"][-1]["uuid"], "pid": p.pid, "used_mib": used})
        out["source"] = "nvml"
    finally:
        pynvml.nvmlShutdown()
except Exception as exc:
    out["errors"].append("nvml: %s: %s" % (type(exc).__name__, exc))
if out["source"] is None:
    def smi(args):
        return subprocess.run(["nvidia-smi"] + args, capture_output=True, text=True, timeout=20)
    try:
        g = smi(["--query-gpu=index,uuid,name,memory.total,memory.used,memory.free,compute_cap,driver_version",
                 "--format=csv,noheader,nounits"])
        a = smi(["--query-compute-apps=gpu_uuid,pid,process_name,used_memory", "--format=csv,noheader,nounits"])
        if g.returncode != 0:
            out["errors"].append("nvidia-smi: " + (g.stderr or g.stdout).strip().splitlines()[-1:][0])
        else:
            out["source"] = "nvidia-smi"
            out["smi_gpus"] = g.stdout
            out["smi_apps"] = a.stdout if a.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError) as exc:
        out["errors"].append("nvidia-smi: %s" % exc)
for app in out["apps"]:
    app["unit"] = unit_of(app["pid"])
    app["name"] = comm_of(app["pid"])
out["pid_units"] = {}
for line in out.get("smi_apps", "").splitlines():
    parts = [p.strip() for p in line.split(",")]
    if len(parts) >= 2 and parts[1].isdigit():
        out["pid_units"][parts[1]] = unit_of(int(parts[1]))
print(json.dumps(out))
'''


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_total_mib: int
    memory_used_mib: int
    memory_free_mib: int
    compute_cap: str

    @property
    def arch(self) -> str:
        return "sm_" + self.compute_cap.replace(".", "")


@dataclass(frozen=True)
class GpuApp:
    gpu_uuid: str
    pid: int
    used_mib: int
    name: str = ""
    unit: str | None = None


@dataclass(frozen=True)
class GpuSnapshot:
    source: str | None
    gpus: list[Gpu] = field(default_factory=list)
    apps: list[GpuApp] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    driver: str = ""

    def card(self, index: int) -> Gpu | None:
        return next((g for g in self.gpus if g.index == index), None)

    def apps_on(self, index: int) -> list[GpuApp]:
        g = self.card(index)
        return [] if g is None else [a for a in self.apps if a.gpu_uuid == g.uuid]

    def strays(self, unit: str, cards: list[int] | None = None) -> list[GpuApp]:
        """Processes holding GPU memory that do not belong to the service we manage; with `cards`,
        only those on the cards the service owns (another service's card is not ours to judge)."""
        if cards is None:
            return [a for a in self.apps if a.unit != unit]
        uuids = {g.uuid for g in self.gpus if g.index in cards}
        return [a for a in self.apps if a.unit != unit and a.gpu_uuid in uuids]

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "driver": self.driver, "errors": self.errors,
                "gpus": [g.__dict__ for g in self.gpus], "apps": [a.__dict__ for a in self.apps]}


def _int(text: str) -> int:
    try:
        return int(float(text))
    except ValueError:
        return 0


def parse_smi_gpus(text: str) -> tuple[list[Gpu], str]:
    gpus, driver = [], ""
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 7 or not parts[0].isdigit():
            continue
        gpus.append(Gpu(int(parts[0]), parts[1], parts[2], _int(parts[3]), _int(parts[4]), _int(parts[5]), parts[6]))
        if len(parts) > 7:
            driver = parts[7]
    return gpus, driver


def parse_smi_apps(text: str, pid_units: dict[str, str | None] | None = None) -> list[GpuApp]:
    apps = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4 or not parts[1].isdigit():
            continue
        apps.append(GpuApp(parts[0], int(parts[1]), _int(parts[3]), parts[2], (pid_units or {}).get(parts[1])))
    return apps


def parse_probe(text: str) -> GpuSnapshot:
    try:
        raw = json.loads(text.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return GpuSnapshot(None, errors=[f"probe printed no JSON: {text.strip()[:200]!r}"])
    if raw.get("source") == "nvidia-smi":
        gpus, driver = parse_smi_gpus(raw.get("smi_gpus", ""))
        apps = parse_smi_apps(raw.get("smi_apps", ""), raw.get("pid_units"))
    else:
        gpus = [Gpu(**g) for g in raw.get("gpus", [])]
        apps = [GpuApp(a["gpu_uuid"], a["pid"], a["used_mib"], a.get("name", ""), a.get("unit")) for a in raw.get("apps", [])]
        driver = raw.get("driver", "")
    return GpuSnapshot(raw.get("source"), gpus, apps, list(raw.get("errors", [])), driver)


def snapshot(host: Any, python: str) -> GpuSnapshot:
    # the service's interpreter has nvidia-ml-py (SGLang depends on it); plain python3 still reaches nvidia-smi
    res = host.run(["sh", "-c", '"$1" -c "$2" 2>/dev/null || python3 -c "$2"', "sh", python, PROBE], timeout=60)
    if not res.stdout.strip():
        return GpuSnapshot(None, errors=[f"GPU probe failed with {python}: {(res.stderr or '').strip()[-300:]}"])
    return parse_probe(res.stdout)


def main(argv: list[str]) -> int:
    import subprocess

    if not argv or argv[0] != "probe":
        sys.stderr.write("usage: python -m ddtree_ops.gpu probe [--json]\n")
        return 64
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    snap = parse_probe(res.stdout)
    if "--json" in argv:
        print(json.dumps(snap.to_json(), indent=2))
    else:
        for g in snap.gpus:
            print(f"{g.index} {g.name} {g.arch} {g.memory_free_mib}/{g.memory_total_mib} MiB free ({snap.source})")
        for e in snap.errors:
            print("error:", e)
    return 0 if snap.gpus else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
