"""Fleet deploy to six lab hosts against six single-host deploys one after the other, same run.

What a user would otherwise do is a loop: `for h in ...; do ddtree-ops deploy $h --yes; done`. The
fleet deploy is `ddtree-ops deploy lab --canary 1 --batch 3`: the canary alone, then two waves of
three and two hosts in parallel. Both are the real CLI (process start, SSH, preflight, install,
gate with a 3 s stay window), both deploy a fresh release to every host (a new env value per run),
repetitions interleaved (fleet, loop, fleet, ...) so drift hits both alike.

The tool's own overhead per host, from the fleet run's JSON: a host's transaction minus the old
server's stop, the new server's start (restart -> ready) and the stay window; and the fleet's own
time beyond its waves (the preflight of every host, planning, the table), per host.

    ddtree-ops lab up --hosts 6
    python bench/fleet_deploy.py [--reps 3]        # writes bench/results/fleet.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DDTREE_OPS = str(Path(sys.executable).parent / "ddtree-ops")
HOSTS = ["ct129", "ct200", "ct130", "ct201", "ct131", "ct202"]
STAY = 3.0


def env() -> dict[str, str]:
    from ddtree_ops.lab.paths import Paths

    paths = Paths.default()
    return {**os.environ, "DDTREE_OPS_SSH_CONFIG": str(paths.ssh_config), "DDTREE_OPS_INVENTORY": str(paths.inventory),
            "DDTREE_OPS_PROFILES": str(ROOT / "profiles"), "NO_COLOR": "1"}


def args_for(tag: str) -> list[str]:
    return ["--mode", "nextn", "--yes", "--json", "--set", f"gate.stay_healthy_s={STAY:g}",
            "--set", f"service.env.DDTREE_BENCH={tag}"]


def fleet(tag: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    proc = subprocess.run([DDTREE_OPS, "deploy", "lab", "--canary", "1", "--batch", "3", *args_for(tag)],
                          capture_output=True, text=True, env=env(), timeout=900)
    took = time.perf_counter() - t0
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0, (doc.get("stopped"), proc.stderr[-2000:])
    assert doc["waves"] == [["ct129"], ["ct200", "ct130", "ct201"], ["ct131", "ct202"]], doc["waves"]
    return took, doc


def loop(tag: str) -> tuple[float, list[dict]]:
    t0 = time.perf_counter()
    docs = []
    for h in HOSTS:
        proc = subprocess.run([DDTREE_OPS, "deploy", h, *args_for(tag)], capture_output=True, text=True, env=env(),
                              timeout=900)
        doc = json.loads(proc.stdout)
        assert proc.returncode == 0, (h, doc.get("reason"))
        docs.append(doc)
    return time.perf_counter() - t0, docs


def overhead(d: dict) -> float:
    """One host's transaction beyond the service's own stop + start and the stay window."""
    return d["timings_s"]["total"] - d["timings_s"].get("service_stop", 0) - (d["gate"]["ready_after_s"] or 0) - STAY


def machine() -> str:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor() or "?")
    return f"{cpu}, {os.cpu_count()} cores, Linux {platform.release()}, Python {platform.python_version()}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "fleet.md"))
    a = ap.parse_args()
    run = time.strftime("%H%M%S")
    f_times, l_times, host_over, fleet_over, starts, waves_wall, loop_over = [], [], [], [], [], [], []
    for i in range(a.reps):
        took, doc = fleet(f"f{run}{i}")
        f_times.append(took)
        hosts = {h["host"]: h for h in doc["hosts"]}
        per = [overhead(h["deploy"]) for h in hosts.values()]
        host_over += per
        starts += [h["deploy"]["gate"]["ready_after_s"] for h in hosts.values()]
        wall_of_waves = sum(max(hosts[h]["seconds"] for h in w) for w in doc["waves"] if w)
        waves_wall.append(wall_of_waves)
        fleet_over.append((took - wall_of_waves) / len(hosts))
        took, docs = loop(f"l{run}{i}")
        l_times.append(took)
        host_over_loop = [overhead(d) for d in docs]
        loop_over += host_over_loop
        print(f"rep {i}: fleet {f_times[-1]:.1f}s, loop {took:.1f}s; per-host overhead fleet "
              f"{statistics.median(per):.2f}s, loop {statistics.median(host_over_loop):.2f}s", file=sys.stderr)
    fm, lm = statistics.median(f_times), statistics.median(l_times)
    lines = [
        "# Fleet deploy vs a loop of single-host deploys (`bench/fleet_deploy.py`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {machine()}; six lab hosts "
        "(systemd-nspawn containers on the same machine, reached over SSH), NEXTN stand-in, stay window "
        f"{STAY:g} s, a fresh release per host per run, {a.reps} interleaved repetitions.",
        "",
        "| what | median | runs |",
        "|---|---|---|",
        f"| `deploy lab --canary 1 --batch 3` (canary, then waves of 3 and 2 in parallel) | **{fm:.1f} s** | "
        f"{', '.join(f'{x:.1f}' for x in f_times)} |",
        f"| `for h in <6 hosts>; do ddtree-ops deploy $h; done` | {lm:.1f} s | {', '.join(f'{x:.1f}' for x in l_times)} |",
        f"| ratio loop / fleet | **{lm / fm:.2f}x** | |",
        f"| service start (restart -> ready) per host, fleet runs | {statistics.median(starts):.2f} s | "
        f"min {min(starts):.2f}, max {max(starts):.2f} |",
        f"| tool's overhead per host inside its transaction (beyond stop + start + stay) | "
        f"**{statistics.median(host_over):.2f} s** | max {max(host_over):.2f} |",
        f"| the same, single-host deploys of the loop | {statistics.median(loop_over):.2f} s | max {max(loop_over):.2f} |",
        f"| fleet's own time beyond its waves (preflight of all, plan, table), per host | "
        f"**{statistics.median(fleet_over):.2f} s** | {', '.join(f'{x:.2f}' for x in fleet_over)} |",
        "",
        "Both sides pay the same per-host work (preflight under the lock, install, gate); the fleet adds "
        "one read-only preflight of every host before the canary and saves the time the loop spends "
        "waiting for one host at a time. On this 2-core machine the hosts of a wave share two CPUs, so a "
        "wave's stand-ins start slower than one alone; on real hosts each server starts on its own machine.",
    ]
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
