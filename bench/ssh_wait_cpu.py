"""CPU the control process spends while one remote command runs: `ssh.SSHHost.run(["sleep", S])`.

Run against the lab (`ddtree-ops lab up`): `python bench/ssh_wait_cpu.py --ssh-config ~/.cache/ddtree-ops/lab/ssh_config`.
Prints one line per run: the CPU seconds of this process (all threads, paramiko's included) during the
command, and the same for S seconds of local sleep on the same open connection (the floor: paramiko's
own transport thread). Which code is measured is whichever `ddtree_ops` this interpreter imports, so
two checkouts run in turns compare two versions of `ssh.py`.
"""

from __future__ import annotations

import argparse
import time

from ddtree_ops.profile import load_profile
from ddtree_ops.ssh import connect


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ssh-config", required=True)
    ap.add_argument("--host", default="ct129")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    with connect(load_profile(args.host), ssh_config=args.ssh_config) as h:
        h.run(["true"])
        c0 = time.process_time()
        time.sleep(args.seconds)
        idle = time.process_time() - c0
        c0 = time.process_time()
        h.run(["sleep", f"{args.seconds:g}"], timeout=args.seconds + 30)
        remote = time.process_time() - c0
    print(f"{args.label}\tremote sleep {args.seconds:g}s: {remote:.3f} CPU-s\tlocal sleep: {idle:.3f} CPU-s")


if __name__ == "__main__":
    main()
