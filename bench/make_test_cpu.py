"""Where `make test`'s CPU goes: every process on the machine, sampled from /proc every 0.2 s while it runs.

    python bench/make_test_cpu.py --out FILE.json &      # before `.ci/run`; stop it with SIGTERM after
    python bench/make_test_timeline.py cpu FILE.json[.gz]  # the table: CPU seconds by kind of process

Each process is kept once (by pid and start time) with its command line, its cgroup (a lab host's
processes are under /ddtree-lab-HOST) and the user+system CPU it had used when last seen. A process that
lives under 0.2 s may be missed, or counted short: the table's figures are lower bounds, and the many tiny
processes a gate's watcher starts (systemctl, journalctl, sleep) show mostly in the lab host's cgroup total,
which `bench/make_test_timeline.py` does not read. The sampler itself costs a few percent of one CPU, and the
VM's own processes (process_api, kdamond) took about a sixth of the machine in the runs it sampled (25, 29)
against about 1% in runs sampled only by bench/make_test_load.sh (36 to 39): its /proc reads are the likely
cause. For how busy the machine is, use that one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")


def sample(seen: dict[tuple[str, str], dict[str, Any]], me: str) -> None:
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == me:
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            comm, rest = stat.split("(", 1)[1].rsplit(")", 1)
            fields = rest.split()
            cpu = (int(fields[11]) + int(fields[12])) / TICK
            entry = seen.get((pid, fields[19]))
            if entry is None or not entry["cmd"]:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:300]
                cgroup = Path(f"/proc/{pid}/cgroup").read_text().strip().splitlines()[-1].split(":", 2)[2]
                entry = seen.setdefault((pid, fields[19]), {"pid": int(pid), "ppid": int(fields[1]), "comm": comm,
                                                             "cg": cgroup[:200], "cpu": 0.0, "t0": time.time()})
                entry["cmd"] = cmd
            entry["cpu"] = max(entry["cpu"], cpu)
            entry["t1"] = time.time()
        except (OSError, IndexError, ValueError):
            continue  # gone between listing and reading


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--every", type=float, default=0.2)
    args = ap.parse_args(argv)
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    stop = False

    def done(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, done)
    signal.signal(signal.SIGINT, done)
    me = str(os.getpid())
    while not stop:
        sample(seen, me)
        time.sleep(args.every)
    tmp = args.out.with_suffix(args.out.suffix + ".partial")
    tmp.write_text(json.dumps(list(seen.values())))
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
