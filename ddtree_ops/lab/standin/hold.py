"""ddtree-ops LAB: a stray process holding simulated GPU memory (the `stray-gpu-process` fault).

Stands for a worker left over from an earlier run: it registers the memory and then just lives.
`python -m sglang_standin.hold MIB [CARD]` (CARD: the physical index, 0 by default).
"""

import signal
import sys
import time

from sglang_standin import simgpu

if __name__ == "__main__":
    simgpu.register(int(sys.argv[1]), card=int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    signal.signal(signal.SIGTERM, lambda *_: (simgpu.unregister(), sys.exit(0)))
    while True:
        time.sleep(3600)
