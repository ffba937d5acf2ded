"""Wall time of `ddtree-ops smoke --all`: hosts checked in parallel vs one after the other.

Same run, interleaved repetitions (parallel, serial, parallel, ...) so drift hits both alike; the
median of each goes to bench/results/smoke.md with the machine it ran on. Measures the real CLI
(process start, SSH connections, every probe) against the lab hosts:

    ddtree-ops lab up            # then, with the ssh_config the lab prints:
    python bench/smoke_parallel.py --ssh-config PATH [--reps 7]

`--jobs 0` is the default (all hosts at once); `--jobs 1` is the one-after-the-other baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DDTREE_OPS = str(Path(sys.executable).parent / "ddtree-ops")


def once(jobs: int, ssh_config: str, scratch: Path) -> tuple[float, dict]:
    t0 = time.perf_counter()
    proc = subprocess.run([DDTREE_OPS, "smoke", "--all", "--json", "--jobs", str(jobs), "--ssh-config", ssh_config,
                           "--lock-file", str(scratch / "smoke.lock"), "--state-dir", str(scratch / "state")],
                          capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"}, timeout=300)
    took = time.perf_counter() - t0
    doc = json.loads(proc.stdout)
    return took, doc


def machine() -> str:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor() or "?")
    return (f"{cpu}, {os.cpu_count()} cores, Linux {platform.release()}, Python {platform.python_version()}; "
            "lab hosts are systemd-nspawn containers on the same machine, reached over SSH (paramiko)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ssh-config", default=os.environ.get("DDTREE_OPS_SSH_CONFIG"), required=False)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "smoke.md"))
    args = ap.parse_args()
    if not args.ssh_config:
        ap.error("--ssh-config (or DDTREE_OPS_SSH_CONFIG) is needed: the lab's ssh_config")
    times: dict[int, list[float]] = {0: [], 1: []}
    per_host: dict[str, list[float]] = {}
    discarded = 0
    with tempfile.TemporaryDirectory() as d:
        once(0, args.ssh_config, Path(d))  # warm-up: page cache, known_hosts, first-connection costs
        while len(times[0]) < args.reps:
            # a pair counts only when both runs found every host OK: a host restarting under the
            # benchmark (the lab is shared) answers faster or slower than a serving one
            pair = [(jobs, *once(jobs, args.ssh_config, Path(d))) for jobs in (0, 1)]
            bad = [doc["summary"] for _, _, doc in pair if doc["result"] != "ok"]
            if bad:
                discarded += 1
                print(f"discarding a pair: {bad[0]}", file=sys.stderr)
                if discarded > 3 * args.reps:
                    sys.exit("too many runs found a host not OK; is the lab in use by another test run?")
                time.sleep(2)
                continue
            for jobs, took, doc in pair:
                times[jobs].append(took)
                for h in doc["hosts"]:
                    per_host.setdefault(h["host"], []).append(h["duration_ms"] / 1000)
    par, ser = statistics.median(times[0]), statistics.median(times[1])
    hosts = sorted(per_host)
    lines = [
        "# `ddtree-ops smoke --all`: parallel vs one host after the other",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with `python bench/smoke_parallel.py "
        f"--reps {args.reps}` on {machine()}.",
        "",
        f"Hosts: {', '.join(hosts)} (lab). Each figure is the wall time of the whole CLI process "
        "(start-up, one SSH connection per host, systemctl show, unit header, /health_generate, one /generate, "
        "/server_info, /metrics), median of the repetitions, runs interleaved; a pair in which any run found a "
        f"host not OK was discarded and repeated ({discarded} discarded).",
        "",
        "| mode | median | min | max |",
        "|---|---|---|---|",
        f"| parallel (`--jobs 0`, default) | {par:.3f} s | {min(times[0]):.3f} s | {max(times[0]):.3f} s |",
        f"| one after the other (`--jobs 1`) | {ser:.3f} s | {min(times[1]):.3f} s | {max(times[1]):.3f} s |",
        "",
        f"Speed-up: {ser / par:.2f}x ({ser - par:.3f} s saved per run). Reading: in parallel a run costs the CLI "
        "start-up plus the slowest host; one after the other, start-up plus every host in turn. The gain grows "
        "with the number of hosts and with real network round trips; here the lab hosts share this machine's "
        f"{os.cpu_count()} cores with the client's SSH handshakes.",
        "",
        "Per-host check time (median over all runs): "
        + ", ".join(f"{h} {statistics.median(per_host[h]):.3f} s" for h in hosts) + ".",
        "",
    ]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
