"""Deploy gate on the lab hosts: how fast a dead server is caught, and what the tool itself costs.

1. Crash line -> FAIL verdict. Fault `libcuda-missing` makes the (stand-in) server die a few
   seconds after the unit becomes active. ddtree-ops' gate is timed from the journal timestamp of
   the fatal line to its verdict. Side by side, in the same run, on the same host and fault:
   - "systemctl restart + is-active" (what Ansible's systemd module checks): its verdict time and
     whether it calls the dead service a success;
   - a Kamal-style poller (GET the health path until a 30 s deploy_timeout).
2. Control overhead: a no-change deploy end to end, and a full deploy minus the service's own
   start (restart -> ready) and minus the configured stay-healthy window; SSH round trips.

Needs the lab (`ddtree-ops lab up`) and root. Prints a markdown table.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path

from ddtree_ops.deploy import deploy, rollback
from ddtree_ops.host import HttpUnavailable
from ddtree_ops.profile import load_profile
from ddtree_ops.ssh import connect

ROOT = Path(__file__).resolve().parents[1]
RUNS = int(os.environ.get("BENCH_RUNS", "3"))
HOST = "ct129"


def ssh_config() -> str:
    from ddtree_ops.lab.paths import Paths

    return str(Paths.default().ssh_config)


def fault(name: str) -> None:
    from ddtree_ops.lab.api import fault as set_fault

    set_fault(HOST, name)


def profile(*extra: str):  # type: ignore[no-untyped-def]
    return load_profile(HOST, overrides=["gate.stay_healthy_s=3", *extra],
                        directory=ROOT / "profiles")


def gate_detection() -> list[float]:
    out = []
    for _ in range(RUNS):
        fault("libcuda-missing")
        p = profile()
        with connect(p, ssh_config=ssh_config()) as h:
            res = deploy(h, p, "dflash", assume_yes=True)
        fault("clear")
        line = res.gate.state.fatal_line if res.gate else None
        assert res.exit_code == 1 and line is not None and line.realtime_us, res.reason
        out.append(res.gate.verdict_wall - line.realtime_us / 1e6)
    return out


def naive_systemctl() -> tuple[float, str]:
    """Restart, then ask systemd whether the unit is active: the check Ansible's module makes."""
    fault("libcuda-missing")
    p = profile()
    try:
        with connect(p, ssh_config=ssh_config()) as h:
            t0 = time.monotonic()
            h.run(["systemctl", "restart", p.service.unit], timeout=120)
            state = h.run(["systemctl", "is-active", p.service.unit]).stdout.strip()
            took = time.monotonic() - t0
    finally:
        fault("clear")
        with connect(p, ssh_config=ssh_config()) as h:
            rollback(h, p)
    return took, state


def kamal_style(deploy_timeout: float = 30.0) -> tuple[float, bool]:
    fault("libcuda-missing")
    p = profile()
    try:
        with connect(p, ssh_config=ssh_config()) as h:
            h.run(["systemctl", "restart", "--no-block", p.service.unit], timeout=60)
            t0 = time.monotonic()
            attempt = 0
            while time.monotonic() - t0 < deploy_timeout:
                attempt += 1
                try:
                    if h.http("GET", p.service.port, "/health_generate", timeout=5).status == 200:
                        return time.monotonic() - t0, True
                except HttpUnavailable:
                    pass
                time.sleep(min(attempt, deploy_timeout - (time.monotonic() - t0), 5))
            return time.monotonic() - t0, False
    finally:
        fault("clear")
        with connect(p, ssh_config=ssh_config()) as h:
            rollback(h, p)


def overhead() -> dict[str, float]:
    p = profile()
    with connect(p, ssh_config=ssh_config()) as h:
        full = deploy(h, p, "dflash", assume_yes=True)
        assert full.exit_code == 0, full.reason
        t_full, rt_full, sess_full = full.timings["total"], full.round_trips, h.sessions
        ready = full.gate.state.ready_at or 0.0
        stop = full.timings.get("service_stop", 0.0)
    with connect(p, ssh_config=ssh_config()) as h:
        t0 = time.monotonic()
        same = deploy(h, p, "dflash", assume_yes=True)
        t_same = time.monotonic() - t0
        rt_same, sess_same = h.round_trips, h.sessions
        assert same.result == "no-change", same.reason
    with connect(p, ssh_config=ssh_config()) as h:
        rollback(h, p)
    return {"full_total": t_full, "service_start": ready, "service_stop": stop, "stay": p.gate.stay_healthy_s,
            "full_overhead": t_full - ready - stop - p.gate.stay_healthy_s, "full_round_trips": rt_full,
            "full_sessions": sess_full, "no_change_total": t_same, "no_change_round_trips": rt_same,
            "no_change_sessions": sess_same}


def main() -> None:
    det = gate_detection()
    naive_t, naive_state = naive_systemctl()
    kamal_t, kamal_ok = kamal_style()
    ov = overhead()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; lab host {HOST}; {RUNS} runs where repeated")
    print("| measurement | ddtree-ops | comparison |")
    print("|---|---|---|")
    print(f"| crash line -> FAIL verdict (median of {len(det)}) | {statistics.median(det):.2f} s "
          f"(max {max(det):.2f} s) | Kamal-style poll: FAIL after {kamal_t:.1f} s ({'passed' if kamal_ok else 'timeout'}); "
          f"`systemctl restart && is-active`: says `{naive_state}` after {naive_t:.2f} s |")
    print(f"| full deploy: total / old server stop / new server start / stay window | {ov['full_total']:.2f} s / "
          f"{ov['service_stop']:.2f} s / {ov['service_start']:.2f} s / {ov['stay']:.0f} s | |")
    print(f"| full deploy: control overhead beyond stop + start + window | {ov['full_overhead']:.2f} s; "
          f"{ov['full_round_trips']} SSH round trips, of which {ov['full_sessions']} sessions (the rest HTTP "
          "through the connection) | target <= 1.5 s |")
    print(f"| no-change deploy, end to end | {ov['no_change_total']:.2f} s; {ov['no_change_round_trips']} round "
          f"trips, {ov['no_change_sessions']} sessions | target <= 1.5 s |")


if __name__ == "__main__":
    os.chdir(ROOT)
    main()
