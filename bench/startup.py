"""CLI start-up: `ddtree-ops --help` (and a subcommand's) against `pyinfra --help`, same run.

pyinfra is what an operator would otherwise reach for; it is installed into its own venv under
~/.cache/ddtree-ops/bench (once). Reports the median of N runs of each, and the ratio.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

N = int(os.environ.get("BENCH_RUNS", "21"))
ROOT = Path(__file__).resolve().parents[1]
CACHE = Path.home() / ".cache" / "ddtree-ops" / "bench"


def pyinfra() -> Path:
    venv = CACHE / "pyinfra-venv"
    exe = venv / "bin" / "pyinfra"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
                        "pyinfra==3.10.0"], check=True)
    return exe


def median_s(argv: list[str]) -> float:
    times = []
    for _ in range(N + 1):
        t0 = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])  # the first run warms the page cache


def main() -> None:
    ours = str(Path(sys.executable).with_name("ddtree-ops"))
    cases = {
        "ddtree-ops --help": [ours, "--help"],
        "ddtree-ops deploy --help": [ours, "deploy", "--help"],
        "ddtree-ops render ct129 (loads + validates a profile)": [ours, "render", "ct129"],
        "pyinfra --help": [str(pyinfra()), "--help"],
    }
    results = {name: median_s(argv) for name, argv in cases.items()}
    base = results["pyinfra --help"]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"median of {N} runs")
    print("| command | median | vs pyinfra --help |")
    print("|---|---|---|")
    for name, t in results.items():
        print(f"| `{name}` | {t * 1000:.0f} ms | {t / base:.2f}x |")


if __name__ == "__main__":
    os.chdir(ROOT)
    main()
