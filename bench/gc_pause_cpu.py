"""CPU that Python's cyclic garbage collector costs while a big import runs, with it on and paused.

Two places where the suite and the lab import a lot and free nothing:
  lab      on a lab host, over SSH: the lab venv's python imports SGLang (torch with it), loads the
           plugins and parses the argv of the host's NEXTN unit as rendered, as every start of the stand-in
           does (and as the preflight's parser check does), with the collector on and with it paused from
           the interpreter's start (what the lab venv's .pth does for `python -m sglang.launch_server`).
  collect  on this machine: `pytest --collect-only` of the whole suite, with tests/conftest.py as it is
           (the collector paused until collection ends) and with it on throughout (a plugin turns it on
           again as soon as conftest has loaded).

Each turn runs the arms in order "on", "paused", "on again": the two "on" runs are the A/A pair, the
noise a difference must exceed. The figure is the process's own CPU (user + system).

    python bench/gc_pause_cpu.py lab --ssh-config ~/.cache/ddtree-ops/lab/ssh_config --turns 5 > lab.txt
    python bench/gc_pause_cpu.py collect --turns 3 > collect.txt
    python bench/gc_pause_cpu.py table lab.txt collect.txt
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ARMS = ("on", "paused", "on again")
REPO = Path(__file__).resolve().parents[1]
# what a stand-in start does before it serves (sglang_standin.server.main), timed by the process itself
IMPORT_AND_PARSE = r'''
import gc, json, resource, sys
if sys.argv[1] == "paused":
    gc.disable()
from sglang.srt.plugins import load_plugins
from sglang.srt.server_args import prepare_server_args
load_plugins()
prepare_server_args(json.loads(sys.argv[2]))
gc.enable()
r = resource.getrusage(resource.RUSAGE_SELF)
print("cpu", r.ru_utime + r.ru_stime)
'''
# the "on" arm of `collect`: the collector on again as soon as tests/conftest.py has paused it
KEEP_ON = '''
import gc

def pytest_plugin_registered(plugin, manager):
    if getattr(plugin, "__file__", "").endswith("tests/conftest.py"):
        gc.enable()
'''


def lab(args: argparse.Namespace) -> None:
    from ddtree_ops.profile import load_profile
    from ddtree_ops.render import render
    from ddtree_ops.ssh import connect

    p = load_profile(args.host)
    argv = list(render(p, "nextn").argv[3:])  # the host's NEXTN unit, after `python -m sglang.launch_server`
    with connect(p, ssh_config=args.ssh_config) as h:
        for turn in range(args.turns):
            for arm in ARMS:
                res = h.run(["/opt/sglang/venv/bin/python", "-c", IMPORT_AND_PARSE,
                             "paused" if arm == "paused" else "on", json.dumps(argv)], timeout=300)
                cpu = next(float(x.split()[1]) for x in res.stdout.splitlines() if x.startswith("cpu "))
                print(f"lab\t{args.host}\t{turn}\t{arm}\t{cpu:.3f}", flush=True)


def collect(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as d:
        Path(d, "keep_gc_on.py").write_text(KEEP_ON)
        for turn in range(args.turns):
            for arm in ARMS:
                extra = [] if arm == "paused" else ["-p", "keep_gc_on"]
                env = {**os.environ, "PYTHONPATH": os.pathsep.join([d, os.environ.get("PYTHONPATH", "")])}
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                *extra], cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL, timeout=600)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                print(f"collect\tlocal\t{turn}\t{arm}\t{cpu:.3f}", flush=True)


def table(args: argparse.Namespace) -> None:
    rows: dict[tuple[str, str], dict[str, list[float]]] = {}
    for f in args.files:
        for line in Path(f).read_text().splitlines():
            what, where, _turn, arm, cpu = line.split("\t")
            rows.setdefault((what, where), {a: [] for a in ARMS})[arm].append(float(cpu))
    print("| what | where | turns | on (CPU-s) | paused (CPU-s) | on again, A/A (CPU-s) | paused / on |")
    print("|---|---|---|---|---|---|---|")
    for (what, where), arms in rows.items():
        def span(xs: list[float]) -> str:
            return f"{min(xs):.2f}-{max(xs):.2f} (median {statistics.median(xs):.2f})"
        on = statistics.median(arms["on"] + arms["on again"])
        print(f"| {what} | {where} | {len(arms['on'])} | {span(arms['on'])} | {span(arms['paused'])} | "
              f"{span(arms['on again'])} | {statistics.median(arms['paused']) / on:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("lab")
    p.add_argument("--ssh-config", required=True)
    p.add_argument("--host", default="ct129")
    p.add_argument("--turns", type=int, default=5)
    p = sub.add_parser("collect")
    p.add_argument("--turns", type=int, default=3)
    p = sub.add_parser("table")
    p.add_argument("files", nargs="+")
    args = ap.parse_args()
    {"lab": lab, "collect": collect, "table": table}[args.what](args)


if __name__ == "__main__":
    main()
