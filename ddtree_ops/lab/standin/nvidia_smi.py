"""ddtree-ops LAB STAND-IN for `nvidia-smi` (installed as /usr/bin/nvidia-smi on lab hosts only).

Prints the real nvidia-smi formats for the queries tools use (`--query-gpu=... --format=csv[,noheader]
[,nounits]`, `--query-compute-apps=...`, `-L`, the plain table) from the host's simulated card
(/etc/ddtree-lab/gpu.json) and the processes registered as holding its memory. NVML is not simulated:
pynvml on a lab host fails with NVMLError_LibraryNotFound as on a host without a driver.
"""

from __future__ import annotations

import sys
import time
import zlib
from typing import Callable

from . import simgpu

Field = tuple[str, str, Callable[["Ctx"], str]]  # (header, unit, value)


class Ctx:
    def __init__(self, card: simgpu.Card, holders: list[simgpu.Holder], count: int = 1) -> None:
        self.card = card
        self.holders = [h for h in holders if h.card == card.index]
        self.count = count
        self.used = sum(h.used_mib for h in self.holders)
        self.busy = bool(self.holders)

    @property
    def free(self) -> int:
        return max(self.card.memory_mib - self.used, 0)


def _serial(c: simgpu.Card) -> str:
    return str(1320000000000 + zlib.crc32(c.uuid.encode()) % 999999999)


GPU_FIELDS: dict[str, Field] = {
    "timestamp": ("timestamp", "", lambda x: time.strftime("%Y/%m/%d %H:%M:%S.") + f"{int(time.time() * 1000) % 1000:03d}"),
    "driver_version": ("driver_version", "", lambda x: x.card.driver_version),
    "count": ("count", "", lambda x: str(x.count)),
    "name": ("name", "", lambda x: x.card.name),
    "gpu_name": ("name", "", lambda x: x.card.name),
    "serial": ("serial", "", lambda x: _serial(x.card)),
    "gpu_serial": ("serial", "", lambda x: _serial(x.card)),
    "uuid": ("uuid", "", lambda x: x.card.uuid),
    "gpu_uuid": ("uuid", "", lambda x: x.card.uuid),
    "pci.bus_id": ("pci.bus_id", "", lambda x: x.card.pci_bus_id),
    "gpu_bus_id": ("pci.bus_id", "", lambda x: x.card.pci_bus_id),
    "index": ("index", "", lambda x: str(x.card.index)),
    "memory.total": ("memory.total", "MiB", lambda x: str(x.card.memory_mib)),
    "memory.used": ("memory.used", "MiB", lambda x: str(x.used)),
    "memory.free": ("memory.free", "MiB", lambda x: str(x.free)),
    "memory.reserved": ("memory.reserved", "MiB", lambda x: "0"),
    "compute_cap": ("compute_cap", "", lambda x: x.card.compute_cap),
    "utilization.gpu": ("utilization.gpu", "%", lambda x: "0"),
    "utilization.memory": ("utilization.memory", "%", lambda x: "0"),
    "temperature.gpu": ("temperature.gpu", "", lambda x: "41" if x.busy else "32"),
    "power.draw": ("power.draw", "W", lambda x: "71.52" if x.busy else "21.43"),
    "power.limit": ("power.limit", "W", lambda x: f"{x.card.power_limit_w:.2f}"),
    "pstate": ("pstate", "", lambda x: "P2" if x.busy else "P8"),
    "fan.speed": ("fan.speed", "%", lambda x: "30"),
    "clocks.sm": ("clocks.current.sm", "MHz", lambda x: "1800" if x.busy else "210"),
    "clocks.current.sm": ("clocks.current.sm", "MHz", lambda x: "1800" if x.busy else "210"),
    "clocks.mem": ("clocks.current.memory", "MHz", lambda x: "8000" if x.busy else "405"),
    "clocks.current.memory": ("clocks.current.memory", "MHz", lambda x: "8000" if x.busy else "405"),
    "persistence_mode": ("persistence_mode", "", lambda x: "Enabled"),
    "compute_mode": ("compute_mode", "", lambda x: x.card.compute_mode),
    "display_active": ("display_active", "", lambda x: "Disabled"),
    "mig.mode.current": ("mig.mode.current", "", lambda x: x.card.mig_mode),
    "mig.mode.pending": ("mig.mode.pending", "", lambda x: x.card.mig_pending),
    "ecc.mode.current": ("ecc.mode.current", "", lambda x: "Disabled"),
}

APP_FIELDS: dict[str, tuple[str, str, Callable[[Ctx, simgpu.Holder], str]]] = {
    "timestamp": ("timestamp", "", lambda x, h: time.strftime("%Y/%m/%d %H:%M:%S.000")),
    "gpu_name": ("gpu_name", "", lambda x, h: x.card.name),
    "gpu_bus_id": ("gpu_bus_id", "", lambda x, h: x.card.pci_bus_id),
    "gpu_serial": ("gpu_serial", "", lambda x, h: _serial(x.card)),
    "gpu_uuid": ("gpu_uuid", "", lambda x, h: x.card.uuid),
    "pid": ("pid", "", lambda x, h: str(h.pid)),
    "process_name": ("process_name", "", lambda x, h: h.process_name),
    "name": ("process_name", "", lambda x, h: h.process_name),
    "used_memory": ("used_gpu_memory", "MiB", lambda x, h: str(h.used_mib)),
    "used_gpu_memory": ("used_gpu_memory", "MiB", lambda x, h: str(h.used_mib)),
}


def csv(headers: list[tuple[str, str]], rows: list[list[tuple[str, str]]], fmt: set[str]) -> str:
    """nvidia-smi's CSV: ", " separators; units in the header always, in values unless nounits."""
    lines = []
    if "noheader" not in fmt:
        lines.append(", ".join(f"{h} [{u}]" if u else h for h, u in headers))
    for row in rows:
        lines.append(", ".join(v if (not u or "nounits" in fmt) else f"{v} {u}" for v, u in row))
    return "".join(line + "\n" for line in lines)


def query_gpu(fields: list[str], fmt: set[str], ctxs: list[Ctx]) -> tuple[str, int]:
    for f in fields:
        if f not in GPU_FIELDS:
            return f'Field "{f}" is not a valid field to query.\n\n', 2
    specs = [GPU_FIELDS[f] for f in fields]
    return csv([(h, u) for h, u, _ in specs], [[(fn(ctx), u) for _, u, fn in specs] for ctx in ctxs], fmt), 0


def query_apps(fields: list[str], fmt: set[str], ctxs: list[Ctx]) -> tuple[str, int]:
    for f in fields:
        if f not in APP_FIELDS:
            return f'Field "{f}" is not a valid field to query.\n\n', 2
    specs = [APP_FIELDS[f] for f in fields]
    rows = [[(fn(ctx, h), u) for _, u, fn in specs] for ctx in ctxs for h in ctx.holders]
    return csv([(h, u) for h, u, _ in specs], rows, fmt), 0


def listing(ctxs: list[Ctx]) -> str:
    return "".join(f"GPU {ctx.card.index}: {ctx.card.name} (UUID: {ctx.card.uuid})\n" for ctx in ctxs)


_WIDTHS = (41, 24, 22)  # the three columns between the bars of nvidia-smi's GPU table


def _row(a: str, b: str, c: str) -> str:
    return "|" + a.ljust(_WIDTHS[0])[:_WIDTHS[0]] + "|" + b.rjust(_WIDTHS[1])[:_WIDTHS[1]] + "|" + \
        c.rjust(_WIDTHS[2])[:_WIDTHS[2]] + "|"


_TABLE_MODE = {"Exclusive_Process": "E. Process", "Exclusive_Thread": "E. Thread"}  # the table's short forms


def _mig(mode: str) -> str:
    return "N/A" if "N/A" in mode else mode


def table(ctxs: list[Ctx]) -> str:
    ctx = ctxs[0]
    c = ctx.card
    bar = "+-----------------------------------------+------------------------+----------------------+"
    out = [time.strftime("%a %b %d %H:%M:%S %Y") + "       ",
           "+-----------------------------------------------------------------------------------------+",
           f"| NVIDIA-SMI {c.driver_version:<22} Driver Version: {c.driver_version:<14} CUDA Version: {c.cuda_version:<9}|",
           "|-----------------------------------------+------------------------+----------------------+",
           "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
           "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
           "|                                         |                        |               MIG M. |",
           "|=========================================+========================+======================|"]
    for x in ctxs:
        c = x.card
        name = c.name if len(c.name) <= 29 else c.name[:26] + "..."
        out += [_row(f"{c.index:>4}  {name:<29}  On  ", f"{c.pci_bus_id:>19} Off ", "Off "),
                _row(f" 30%   {GPU_FIELDS['temperature.gpu'][2](x)}C    {GPU_FIELDS['pstate'][2](x)}"
                     f"{int(float(GPU_FIELDS['power.draw'][2](x))):>15}W / {c.power_limit_w:>4}W ",
                     f"{x.used:>8}MiB / {c.memory_mib:>6}MiB ", f"   0%  {_TABLE_MODE.get(c.compute_mode, c.compute_mode):>11} "),
                f"|                                         |                        |{_mig(c.mig_mode):>21} |",
                bar]
    out += [" " * 89,
           "+-----------------------------------------------------------------------------------------+",
           "| Processes:                                                                              |",
           "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
           "|        ID   ID                                                               Usage      |",
           "|=========================================================================================|"]
    if not any(x.holders for x in ctxs):
        out.append("|  No running processes found                                                             |")
    for x in ctxs:
        for h in x.holders:
            pname = h.process_name if len(h.process_name) <= 34 else "..." + h.process_name[-31:]
            out.append(f"| {x.card.index:>4}   N/A  N/A  {h.pid:>15}      C   {pname:<34}{h.used_mib:>8}MiB |")
    out.append("+-----------------------------------------------------------------------------------------+")
    out.append("(ddtree-ops LAB STAND-IN: simulated GPU from /etc/ddtree-lab/gpu.json; no NVIDIA driver here)")
    return "\n".join(out) + "\n"


NO_DEVICE = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
             "Make sure that the latest NVIDIA driver is installed and running.\n\n")


def run(argv: list[str], card: simgpu.Card | list[simgpu.Card] | None,
        holders: list[simgpu.Holder]) -> tuple[str, str, int]:
    """(stdout, stderr, exit code) for one invocation: pure, for tests. `card`: the host's card, or
    every card of a host with several (one row each, as nvidia-smi prints them)."""
    cards = [] if card is None else card if isinstance(card, list) else [card]
    if not cards:
        return NO_DEVICE, "", 9
    card = cards[0]
    ctx = [Ctx(c, holders, len(cards)) for c in cards]
    opts: dict[str, str] = {}
    flags: set[str] = set()
    for arg in argv:
        if arg.startswith("--") and "=" in arg:
            key, _, value = arg.partition("=")
            opts[key] = value
        else:
            flags.add(arg)
    fmt = {f.strip() for f in opts.get("--format", "").split(",") if f.strip()}
    if "--version" in flags:
        return (f"NVIDIA-SMI version  : {card.driver_version}\nDriver Version      : {card.driver_version}\n"
                f"CUDA Version        : {card.cuda_version}\n(ddtree-ops LAB STAND-IN)\n"), "", 0
    if "-L" in flags or "--list-gpus" in flags:
        return listing(ctx), "", 0
    for key, fn in (("--query-gpu", query_gpu), ("--query-compute-apps", query_apps)):
        if key in opts:
            if "csv" not in fmt:
                return "", f'"--format" must be given with "{key}" (csv[,noheader][,nounits])\n', 2
            fields = [f.strip() for f in opts[key].split(",") if f.strip()]
            text, rc = fn(fields, fmt, ctx)
            return text, "", rc
    if not argv:
        return table(ctx), "", 0
    return "", "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n", 2


def main(argv: list[str] | None = None) -> int:
    out, err, rc = run(sys.argv[1:] if argv is None else argv, simgpu.load_cards(), simgpu.holders())
    sys.stdout.write(out)
    sys.stderr.write(err)
    return rc


if __name__ == "__main__":
    sys.exit(main())
