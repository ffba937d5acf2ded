"""`ddtree-ops lab up` cold (tree built) and warm (tree cached), `lab down`, and memory per host.

    python bench/lab_up.py [--cold] [--runs N]

--cold removes the cached tree and wheelhouse first (debootstrap from the Debian mirror, wheels from the
local package index), so run it on purpose. Each timing is the wall time of the real CLI as a
subprocess; memory is the PSS (and RSS) of everything running in one host, read from
`ddtree-ops lab status --json` with the NEXTN service up and idle. Prints a Markdown table to stdout.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ddtree_ops.lab.paths import Paths

CLI = str(Path(sys.executable).parent / "ddtree-ops")


def timed(*args: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([CLI, "lab", *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cold", action="store_true", help="rebuild the tree and wheelhouse first (minutes)")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    paths = Paths.default()
    subprocess.run([CLI, "lab", "down"], check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows: list[tuple[str, str]] = []
    if a.cold:
        for p in (paths.tree, paths.wheelhouse):
            shutil.rmtree(p, ignore_errors=True)
        rows.append(("`lab up`, cold (debootstrap + wheels + venv + boot + seed)", f"{timed('up'):.1f} s"))
        rows.append(("`lab down`", f"{timed('down'):.2f} s"))
    ups, downs = [], []
    for _ in range(a.runs):
        ups.append(timed("up"))
        downs.append(timed("down"))
    rows.append((f"`lab up`, warm (tree cached; median of {a.runs})", f"{statistics.median(ups):.1f} s"))
    rows.append((f"`lab down` (median of {a.runs})", f"{statistics.median(downs):.2f} s"))
    timed("up")
    time.sleep(2)
    status = json.loads(subprocess.run([CLI, "lab", "status", "--json"], capture_output=True, text=True,
                                       timeout=60).stdout)
    for h in status["hosts"]:
        rows.append((f"memory of {h['name']} (NEXTN stand-in up, idle)", f"PSS {h['pss_mib']:.0f} MiB, RSS {h['rss_mib']:.0f} MiB"))
    du = subprocess.run(["du", "-sh", str(paths.tree)], capture_output=True, text=True).stdout.split()[0]
    rows.append(("cached tree on disk", du))
    print(f"machine: {platform.node()}, {platform.machine()}, python {platform.python_version()}\n")
    print("| what | result |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
