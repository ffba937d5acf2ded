"""The simulated GPU of a lab host (stdlib only: nvidia-smi's stand-in imports it too).

`/etc/ddtree-lab/gpu.json` holds the card (from the host's profile); processes that "hold" GPU memory
register in `/run/ddtree-lab/gpu/<pid>.json` and count only while that pid is alive, so a killed server
frees its memory the way a real one does.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

GPU_JSON = Path(os.environ.get("DDTREE_LAB_GPU_JSON", "/etc/ddtree-lab/gpu.json"))
REGISTRY = Path(os.environ.get("DDTREE_LAB_GPU_REGISTRY", "/run/ddtree-lab/gpu"))
MIB = 1 << 20
GIB = 1 << 30
# what creating a CUDA context takes on these cards before SGLang measures free memory
CUDA_CONTEXT_MIB = 512


@dataclass(frozen=True)
class Card:
    index: int
    name: str
    uuid: str
    memory_mib: int
    compute_cap: str  # "8.6"
    driver_version: str
    cuda_version: str
    pci_bus_id: str
    power_limit_w: int

    @property
    def arch(self) -> str:
        return "sm_" + self.compute_cap.replace(".", "")


@dataclass(frozen=True)
class Holder:
    pid: int
    used_mib: int
    process_name: str


def load_card(path: Path = GPU_JSON) -> Card | None:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return Card(index=int(raw.get("index", 0)), name=raw["name"], uuid=raw["uuid"], memory_mib=int(raw["memory_mib"]),
                compute_cap=str(raw["compute_cap"]), driver_version=str(raw["driver_version"]),
                cuda_version=str(raw.get("cuda_version", "12.8")), pci_bus_id=raw.get("pci_bus_id", "00000000:01:00.0"),
                power_limit_w=int(raw.get("power_limit_w", 300)))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie holds no GPU memory
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def holders(registry: Path = REGISTRY) -> list[Holder]:
    out = []
    try:
        entries = sorted(registry.glob("*.json"))
    except OSError:
        return []
    for entry in entries:
        try:
            raw = json.loads(entry.read_text())
            pid = int(raw["pid"])
        except (OSError, ValueError, KeyError):
            continue
        if pid_alive(pid):
            out.append(Holder(pid, int(raw.get("used_mib", 0)), str(raw.get("process_name", "python"))))
        else:
            try:  # the process is gone: so is its memory
                entry.unlink()
            except OSError:
                pass
    return out


def used_mib(registry: Path = REGISTRY, *, exclude_pid: int | None = None) -> int:
    return sum(h.used_mib for h in holders(registry) if h.pid != exclude_pid)


def register(used: int, *, pid: int | None = None, process_name: str | None = None,
             registry: Path = REGISTRY) -> None:
    """Record (or update) what this process holds, in MiB. Written beside and renamed: nvidia-smi
    never reads half a file."""
    pid = pid or os.getpid()
    registry.mkdir(parents=True, exist_ok=True)
    name = process_name or _process_name(pid)
    tmp = registry / f".{pid}.tmp"
    tmp.write_text(json.dumps({"pid": pid, "used_mib": int(used), "process_name": name, "since": time.time()}))
    os.replace(tmp, registry / f"{pid}.json")


def unregister(pid: int | None = None, registry: Path = REGISTRY) -> None:
    try:
        (registry / f"{pid or os.getpid()}.json").unlink()
    except OSError:
        pass


def _process_name(pid: int) -> str:
    # nvidia-smi shows the executable path (argv[0]) of the process holding the context
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().split(b"\0")[0].decode() or "python"
    except OSError:
        return "python"
