"""Where `make test`'s time goes, from the files `.ci/run` leaves (bench/results/make_test/):

    python bench/make_test_timeline.py runs bench/results/make_test/*.log
        one row per `.ci/run` log: its wall time (printed by .ci/run), pytest's, the counts, and the CPU-s a
        fixed loop took at its start and end (the speed of the CPU the run got; logs before run 30 lack it)
    python bench/make_test_timeline.py workers bench/results/make_test/<run>.timeline.jsonl
        one row per pytest-xdist worker and one per lab file: when it started and ended (seconds from the
        first test), how long its tests held the worker (setup + call + teardown), and how much of that its
        lab tests spent waiting for the lab hosts they hold (timelines from run 37 on record it)

    python bench/make_test_timeline.py cpu bench/results/make_test/<run>.cpu.json.gz
        CPU seconds by kind of process over the run, from bench/make_test_cpu.py's samples
    python bench/make_test_timeline.py load bench/results/make_test/<run>.vm.txt.gz
        how many of the CPUs were busy, minute by minute, from bench/make_test_load.sh's samples

A timeline is what `make test PYTEST_ARGS=--timeline=PATH` writes (tests/conftest.py): one JSON line per
test phase, from the worker that ran it.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
import sys
from pathlib import Path
from typing import Any

WALL = re.compile(r"^ci: passed in (\d+) min (\d+) s")
SUMMARY = re.compile(r"=+ (.*) in ([0-9.]+)s \(")
LOOP = re.compile(r"fixed loop took ([0-9.]+) CPU-s")


def runs(logs: list[Path]) -> list[str]:
    out = ["| run | `.ci/run` wall | pytest | result | fixed loop, start / end (CPU-s) |", "|---|---|---|---|---|"]
    for log in logs:
        text = log.read_text(errors="replace").splitlines()
        wall = next((m for m in map(WALL.match, text) if m), None)
        summary = next((m for m in map(SUMMARY.search, reversed(text)) if m), None)
        pytest_s = float(summary.group(2)) if summary else None
        loops = [m.group(1) for line in text if line.startswith("ci: ") for m in LOOP.finditer(line)]
        out.append(f"| {log.stem} | {f'{int(wall.group(1))} min {int(wall.group(2))} s' if wall else 'failed'} | "
                   f"{f'{round(pytest_s) // 60} min {round(pytest_s) % 60} s' if pytest_s else '-'} | "
                   f"{summary.group(1) if summary else '-'} | {' / '.join(loops) or '-'} |")
    return out


def read(path: Path) -> str:
    """A result file's text, gzipped (as committed) or not (as a run leaves it)."""
    return gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()


def workers(timeline: Path) -> list[str]:
    text = read(timeline)
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    rows = [r for r in rows if r["w"]]  # a controller's copy of a report carries no worker
    t0 = min(r["start"] for r in rows)
    span: dict[tuple[str, str], list[float]] = {}
    busy: collections.Counter[tuple[str, str]] = collections.Counter()
    waited: collections.Counter[tuple[str, str]] = collections.Counter()
    tests: collections.Counter[tuple[str, str]] = collections.Counter()
    for r in rows:
        group = r["id"].rsplit("@", 1)[1] if "@lab-" in r["id"] else "beside the lab"
        for key in ((r["w"], group), (r["w"], r["id"].split("::", 1)[0]) if "@lab-" in r["id"] else None):
            if key is None:
                continue
            if r["when"] == "hostwait":  # a part of the test's setup, already counted in it
                waited[key] += r["stop"] - r["start"]
                continue
            s = span.setdefault(key, [r["start"], r["stop"]])
            s[0], s[1] = min(s[0], r["start"]), max(s[1], r["stop"])
            busy[key] += r["stop"] - r["start"]
            tests[key] += r["when"] == "call"
    out = ["| worker | group or lab file | from (s) | to (s) | busy (s) | of which waiting for hosts (s) | tests |",
           "|---|---|---|---|---|---|---|"]
    for key, (a, b) in sorted(span.items(), key=lambda kv: (kv[0][0], not kv[0][1].startswith(("lab-", "beside")),
                                                             kv[1][0])):
        out.append(f"| {key[0]} | {key[1]} | {a - t0:.0f} | {b - t0:.0f} | {busy[key]:.0f} | "
                   f"{f'{waited[key]:.0f}' if key in waited else '-'} | {tests[key]} |")
    out.append(f"\nfirst test to last: {max(r['stop'] for r in rows) - t0:.0f} s")
    return out


def kind(p: dict[str, Any]) -> str:
    """What a sampled process was, from its command line and cgroup (a lab host's are /ddtree-lab-HOST/...)."""
    cmd, cg = p["cmd"], p["cg"]
    python = "python" in p["comm"] or "python" in cmd.split(" ", 1)[0]
    if "/ddtree-lab-" in cg:
        if "sglang.launch_server" in cmd:
            return "lab host: the SGLang stand-in (its starts, and the processes they fork)"
        if "/sglang.service" in cg:
            return "lab host: the unit's readiness probe (ExecStartPost)"
        if "/ssh.service" in cg:
            return "lab host: python run over SSH (probes, the parser check)" if python else \
                "lab host: other commands run over SSH (sshd, sh, systemctl, journalctl)"
        return f"lab host: {p['comm']}"
    if " -m ddtree_ops" in cmd or "/bin/ddtree-ops" in cmd:
        return "control: ddtree-ops commands the tests start"
    if "exec(eval(sys.stdin.readline()))" in cmd:
        return "control: pytest-xdist workers (the tests themselves)"
    if " pip " in cmd or "/pip " in cmd:
        return "control: pip (make install, the lab tree's venv)"
    if python:
        return "control: other python (tests' subprocesses, the lab tree build)"
    if p["ppid"] in (0, 2):
        return f"machine: {p['comm'].split('/')[0]} (not started by the run)"
    return "control: other commands"


def cpu(path: Path) -> list[str]:
    procs = json.loads(read(path))
    seconds: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for p in procs:
        seconds[kind(p)] += p["cpu"]
        count[kind(p)] += 1
    total = sum(seconds.values())
    out = ["| kind of process | CPU (s) | share | processes |", "|---|---|---|---|"]
    for k, s in seconds.most_common():
        if s >= 0.5:
            out.append(f"| {k} | {s:.0f} | {s / total:.0%} | {count[k]} |")
    out.append(f"\nall sampled processes: {total:.0f} CPU-s")
    return out


TICK = 100  # /proc/stat and /proc/PID/stat count 1/100 s (getconf CLK_TCK)


def load(path: Path) -> list[str]:
    """bench/make_test_load.sh's samples: the CPUs busy, minute by minute, and what the VM's own processes took."""
    text = read(path)
    rows = [[float(x) for x in line.split()] for line in text.splitlines() if len(line.split()) == 5]
    if len(rows) < 2:
        return ["fewer than two samples"]
    t0 = rows[0][0]
    minutes: dict[int, list[float]] = {}
    for a, b in zip(rows, rows[1:]):
        minutes.setdefault(int((a[0] - t0) // 60), []).append((b[1] - a[1]) / TICK / (b[0] - a[0]))
    first, last = rows[0], rows[-1]
    span = last[0] - first[0]
    busy = (last[1] - first[1]) / TICK
    out = ["| minute | CPUs busy (mean of its 5 s samples) |", "|---|---|"]
    out += [f"| {m} | {sum(v) / len(v):.2f} |" for m, v in sorted(minutes.items())]
    out.append(f"\n{span:.0f} s sampled: {busy:.0f} CPU-s busy ({busy / span:.2f} CPUs on average); PID 1 (the VM's "
               f"process_api) {(last[2] - first[2]) / TICK:.1f} CPU-s, kdamond {(last[3] - first[3]) / TICK:.1f} CPU-s")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("runs", "workers", "cpu", "load"))
    ap.add_argument("files", nargs="+", type=Path)
    args = ap.parse_args(argv)
    if args.what == "runs":  # one table of every log
        print("\n".join(runs(args.files)))
    else:  # one table per file
        table = {"workers": workers, "cpu": cpu, "load": load}[args.what]
        for f in args.files:
            print(f"{f.name}\n" + "\n".join(table(f)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
