"""GPU facts from a host: NVML first (nvidia-ml-py), nvidia-smi's CSV when NVML cannot load.

The probe is one self-contained script (stdlib + optional pynvml) run by the host's own Python in
one round trip; it also names the systemd unit owning each process that holds GPU memory, so a
stray worker from an earlier run is told apart from the service about to be restarted, and reads
each card's bus id, MIG and compute modes, the driver's CUDA version and the CUDA the interpreter's
torch was built for (from torch/version.py, without importing torch). The verdicts at the end say
whether a card that is present can be used.
`python -m ddtree_ops.gpu probe --json` runs the same probe locally.
"""

from __future__ import annotations

import json
import re
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
def text(v):
    return v if isinstance(v, str) else v.decode()
def nvml_modes(pynvml, h):
    # each on its own: a card without MIG answers NotSupported, an old binding lacks a call
    modes = {}
    try:
        modes["bus_id"] = text(pynvml.nvmlDeviceGetPciInfo(h).busId)
    except Exception:
        pass
    try:
        cur, pend = pynvml.nvmlDeviceGetMigMode(h)
        modes["mig_mode"] = "Enabled" if cur else "Disabled"
        modes["mig_pending"] = "Enabled" if pend else "Disabled"
    except Exception:
        pass
    try:
        modes["compute_mode"] = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited",
                                 3: "Exclusive_Process"}.get(pynvml.nvmlDeviceGetComputeMode(h), "")
    except Exception:
        pass
    return modes
def torch_cuda():
    # the CUDA version this interpreter's torch was built for, read from torch/version.py without
    # importing torch (seconds, and a CUDA context on some builds)
    import importlib.util
    try:
        spec = importlib.util.find_spec("torch")
        path = os.path.join(os.path.dirname(spec.origin), "version.py")
        src = open(path).read()
    except Exception:
        return {}
    found = {}
    for key in ("__version__", "cuda"):
        m = re.search(r"^%s\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]" % key, src, re.M)
        if m:
            found["torch_version" if key == "__version__" else "torch_cuda"] = m.group(1)
    return found
out.update(torch_cuda())
try:
    import pynvml
    pynvml.nvmlInit()
    try:
        out["driver"] = pynvml.nvmlSystemGetDriverVersion()
        try:
            v = pynvml.nvmlSystemGetCudaDriverVersion()
            out["driver_cuda"] = "%d.%d" % (v // 1000, v % 1000 // 10)
        except Exception:
            pass
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
            out["gpus"][-1].update(nvml_modes(pynvml, h))
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
            # asked apart: an nvidia-smi that lacks one of these fields refuses the whole query
            m = smi(["--query-gpu=index,pci.bus_id,mig.mode.current,mig.mode.pending,compute_mode",
                     "--format=csv,noheader,nounits"])
            out["smi_modes"] = m.stdout if m.returncode == 0 else ""
            v = smi(["--version"])
            out["smi_version"] = v.stdout if v.returncode == 0 else ""
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
    bus_id: str = ""
    mig_mode: str | None = None  # Enabled | Disabled | None (not supported or not reported)
    mig_pending: str | None = None
    compute_mode: str | None = None  # Default | Exclusive_Process | Exclusive_Thread | Prohibited

    @property
    def arch(self) -> str:
        return "sm_" + self.compute_cap.replace(".", "")

    @property
    def label(self) -> str:
        """How an operator finds the card: `card 1 (NVIDIA H200, 00000000:19:00.0)`."""
        return f"card {self.index} ({self.name}" + (f", {self.bus_id})" if self.bus_id else ")")


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
    driver_cuda: str = ""  # the newest CUDA the driver supports ("13.0")
    torch_cuda: str = ""  # the CUDA the service interpreter's torch was built for ("" for a CPU build)
    torch_version: str = ""

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
        return {"source": self.source, "driver": self.driver, "driver_cuda": self.driver_cuda,
                "torch_cuda": self.torch_cuda, "torch_version": self.torch_version, "errors": self.errors,
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


def _mode(value: str) -> str | None:
    # nvidia-smi prints "[N/A]" (or "N/A") for a card without MIG
    value = value.strip()
    return None if not value or "N/A" in value else value


def parse_smi_modes(text: str, gpus: list[Gpu]) -> list[Gpu]:
    """`--query-gpu=index,pci.bus_id,mig.mode.current,mig.mode.pending,compute_mode` merged into
    the cards parsed before (a card the query does not list keeps what it had)."""
    from dataclasses import replace

    rows: dict[int, list[str]] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 5 and parts[0].isdigit():
            rows[int(parts[0])] = parts
    out = []
    for g in gpus:
        r = rows.get(g.index)
        out.append(g if r is None else replace(g, bus_id=r[1], mig_mode=_mode(r[2]), mig_pending=_mode(r[3]),
                                               compute_mode=_mode(r[4])))
    return out


def parse_smi_cuda(text: str) -> str:
    """The driver's CUDA version from `nvidia-smi --version` ("CUDA Version : 13.0")."""
    m = re.search(r"CUDA Version\s*:\s*([\d.]+)", text, re.I)
    return m.group(1) if m else ""


def parse_probe(text: str) -> GpuSnapshot:
    try:
        raw = json.loads(text.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return GpuSnapshot(None, errors=[f"probe printed no JSON: {text.strip()[:200]!r}"])
    if raw.get("source") == "nvidia-smi":
        gpus, driver = parse_smi_gpus(raw.get("smi_gpus", ""))
        gpus = parse_smi_modes(raw.get("smi_modes", ""), gpus)
        apps = parse_smi_apps(raw.get("smi_apps", ""), raw.get("pid_units"))
        driver_cuda = parse_smi_cuda(raw.get("smi_version", ""))
    else:
        known = set(Gpu.__dataclass_fields__)
        gpus = [Gpu(**{k: v for k, v in g.items() if k in known}) for g in raw.get("gpus", [])]
        apps = [GpuApp(a["gpu_uuid"], a["pid"], a["used_mib"], a.get("name", ""), a.get("unit")) for a in raw.get("apps", [])]
        driver = raw.get("driver", "")
        driver_cuda = raw.get("driver_cuda", "")
    return GpuSnapshot(raw.get("source"), gpus, apps, list(raw.get("errors", [])), driver, driver_cuda,
                       raw.get("torch_cuda", ""), raw.get("torch_version", ""))


# ------------------------------------------------------------------ verdicts: is a present card usable?

# The oldest driver a CUDA major release runs on through minor-version compatibility (NVIDIA,
# "CUDA Compatibility", Minor Version Compatibility, Table 1, and the CUDA Toolkit release notes'
# driver table: 11.x >= 450.80.02, 12.x >= 525.60.13, 13.x >= 580). Older drivers cannot run a
# torch built for that release at all ("The NVIDIA driver on your system is too old").
MIN_DRIVER: dict[int, tuple[int, ...]] = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580,)}


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text))


def driver_verdict(snap: GpuSnapshot, python_key: str = "service.python") -> tuple[str, str] | None:
    """(status, detail) for the host's driver against the CUDA its torch was built for, or None
    when there is nothing to judge (no driver read, a CPU torch, a CUDA release not in the table)."""
    if not snap.driver or not snap.torch_cuda:
        return None
    cuda = _version_tuple(snap.torch_cuda)
    minimum = MIN_DRIVER.get(cuda[0]) if cuda else None
    if minimum is None:
        return None
    torch = f"torch {snap.torch_version or '?'} ({python_key}) is built for CUDA {snap.torch_cuda}"
    need = ".".join(map(str, minimum))
    if _version_tuple(snap.driver) < minimum:
        return "fail", (f"driver {snap.driver} is too old: {torch}, which needs a driver >= {need} (NVIDIA's minimum "
                        f"for CUDA {cuda[0]}.x); torch finds no usable GPU and SGLang stops at its first CUDA call. "
                        f"Upgrade the driver, or install a torch built for the CUDA the driver supports"
                        + (f" ({snap.driver_cuda})" if snap.driver_cuda else ""))
    if snap.driver_cuda and _version_tuple(snap.driver_cuda)[:2] < cuda[:2]:
        return "warn", (f"driver {snap.driver} supports CUDA {snap.driver_cuda}, {torch}: it runs through CUDA's "
                        "minor-version compatibility, where kernels compiled at run time from newer PTX fail "
                        "('the provided PTX was compiled with an unsupported toolchain')")
    return "ok", f"driver {snap.driver} (CUDA {snap.driver_cuda or '?'}) runs {torch}"


def card_verdicts(snap: GpuSnapshot, cards: list[int], unit: str) -> list[tuple[str, str]]:
    """(status, detail) for every reason one of the service's cards, present, cannot be used: MIG
    mode, a compute mode that shuts the service out. Each names the card and what to change; the
    tool never changes card settings itself, the commands are for the operator."""
    out: list[tuple[str, str]] = []
    for index in cards:
        g = snap.card(index)
        if g is None:
            continue
        if g.mig_mode == "Enabled":
            pending = " (a change to Disabled is pending a GPU reset)" if g.mig_pending == "Disabled" else ""
            out.append(("fail", f"{g.label} has MIG mode enabled{pending}: CUDA sees its MIG instances, not the card, "
                                f"and SGLang sizes its pool and splits ranks by whole cards. Choose another card in "
                                f"gpus, or the operator runs `nvidia-smi -i {index} -mig 0` (then a GPU reset)"))
        elif g.mig_pending == "Enabled":
            out.append(("warn", f"{g.label} has MIG mode enabled pending a GPU reset: the next reset or reboot takes "
                                f"the whole card away from the service (`nvidia-smi -i {index} -mig 0` cancels it)"))
        others = [a for a in snap.apps_on(index) if a.unit != unit]
        who = ", ".join(f"pid {a.pid} {a.name or '?'} ({a.unit or 'no unit'})" for a in others)
        if g.compute_mode == "Prohibited":
            out.append(("fail", f"{g.label} is in compute mode Prohibited: no process may create a CUDA context "
                                "on it. Choose another card in gpus, or the operator runs "
                                f"`nvidia-smi -i {index} -c DEFAULT`"))
        elif g.compute_mode in ("Exclusive_Process", "Exclusive_Thread") and others:
            out.append(("fail", f"{g.label} is in compute mode {g.compute_mode} and {who} holds its one context: the "
                                "server fails with 'CUDA-capable device(s) is/are busy or unavailable'. Stop "
                                f"{'it' if len(others) == 1 else 'them'}, choose another card in gpus, or the operator "
                                f"runs `nvidia-smi -i {index} -c DEFAULT`"))
        elif g.compute_mode in ("Exclusive_Process", "Exclusive_Thread"):
            out.append(("warn", f"{g.label} is in compute mode {g.compute_mode}: the service's one process per card "
                                "fits, but any other CUDA process on it (a second server, a stray worker) then fails "
                                "or shuts the service out"))
    return out


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
