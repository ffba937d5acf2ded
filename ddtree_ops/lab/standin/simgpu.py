"""The simulated GPU of a lab host (stdlib only: nvidia-smi's stand-in imports it too).

`/etc/ddtree-lab/gpu.json` holds the cards (from the host's profile: `gpu.count` of them, card 0's
facts also at the top level); processes that "hold" GPU memory register in
`/run/ddtree-lab/gpu/<pid>.json` (with the card they hold it on; one registration per process and card)
and count only while that pid is alive, so a killed server frees its memory the way a real one does.
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
    # what nvidia-smi reports for the card's modes (lab faults: a MIG-enabled or exclusive card)
    mig_mode: str = "[N/A]"  # Enabled | Disabled | [N/A] (a card without MIG)
    mig_pending: str = "[N/A]"
    compute_mode: str = "Default"  # Default | Exclusive_Process | Prohibited

    @property
    def arch(self) -> str:
        return "sm_" + self.compute_cap.replace(".", "")


@dataclass(frozen=True)
class Holder:
    pid: int
    used_mib: int
    process_name: str
    card: int = 0  # the physical index (nvidia-smi's), whatever CUDA_VISIBLE_DEVICES the process had


def load_cards(path: Path = GPU_JSON) -> list[Card]:
    """Every card of the host, index order ([] without a driver)."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [_card(c) for c in raw.get("cards") or [raw]]


def visible_cards(cards: list[Card], env: str | None = None) -> list[Card]:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: the listed physical indexes, renumbered 0..n-1 in that
    order (unset: every card). An index the host lacks ends the list there, as CUDA does."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES") if env is None else env
    if env is None or env == "":
        return list(cards) if env is None else []
    by_index = {c.index: c for c in cards}
    out = []
    for part in env.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) not in by_index:
            break
        out.append(by_index[int(part)])
    return out


def _card(raw: dict) -> Card:
    return Card(index=int(raw.get("index", 0)), name=raw["name"], uuid=raw["uuid"], memory_mib=int(raw["memory_mib"]),
                compute_cap=str(raw["compute_cap"]), driver_version=str(raw["driver_version"]),
                cuda_version=str(raw.get("cuda_version", "12.8")), pci_bus_id=raw.get("pci_bus_id", "00000000:01:00.0"),
                power_limit_w=int(raw.get("power_limit_w", 300)), mig_mode=str(raw.get("mig_mode", "[N/A]")),
                mig_pending=str(raw.get("mig_pending", raw.get("mig_mode", "[N/A]"))),
                compute_mode=str(raw.get("compute_mode", "Default")))


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
            out.append(Holder(pid, int(raw.get("used_mib", 0)), str(raw.get("process_name", "python")),
                              int(raw.get("card", 0))))
        else:
            try:  # the process is gone: so is its memory
                entry.unlink()
            except OSError:
                pass
    return out


def used_mib(registry: Path = REGISTRY, *, exclude_pid: int | None = None, card: int | None = None) -> int:
    return sum(h.used_mib for h in holders(registry) if h.pid != exclude_pid and (card is None or h.card == card))


def _entry(pid: int, card: int) -> str:
    return f"{pid}.json" if card == 0 else f"{pid}.card{card}.json"


def register(used: int, *, pid: int | None = None, process_name: str | None = None,
             registry: Path = REGISTRY, card: int = 0) -> None:
    """Record (or update) what this process holds on `card` (physical index), in MiB. Written
    beside and renamed: nvidia-smi never reads half a file."""
    pid = pid or os.getpid()
    registry.mkdir(parents=True, exist_ok=True)
    name = process_name or _process_name(pid)
    tmp = registry / f".{pid}.{card}.tmp"
    tmp.write_text(json.dumps({"pid": pid, "used_mib": int(used), "process_name": name, "since": time.time(),
                               "card": int(card)}))
    os.replace(tmp, registry / _entry(pid, card))


def unregister(pid: int | None = None, registry: Path = REGISTRY) -> None:
    pid = pid or os.getpid()
    for entry in [registry / f"{pid}.json", *registry.glob(f"{pid}.card*.json")]:
        try:
            entry.unlink()
        except OSError:
            pass


def _process_name(pid: int) -> str:
    # nvidia-smi shows the executable path (argv[0]) of the process holding the context
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().split(b"\0")[0].decode() or "python"
    except OSError:
        return "python"
