"""ddtree-ops LAB: traffic for a lab host's service (`ddtree-ops lab load HOST`).

Runs inside the lab host as a transient unit (ddtree-lab-load.service), so it outlives the command that
started it and keeps sending through a restart of the service (a promote's switch): CLIENTS threads,
each posting one /generate of BATCH greedy prompts after another (SGLang runs a request's prompts as
one batch; the stand-in's plugin rounds are verified BATCH rows at a time), until SECONDS have passed.
A refused or failed request is counted and retried after half a second. The last line it prints (to
the journal) is the count. Standard library only: it runs on the host's system python.

The clients send as traffic behind a load balancer does: a balancer thread polls /health, and while
the service answers anything but 200 (SGLang answers 503 from its SIGTERM on, and while it starts) no
new request is sent. Real SGLang keeps accepting /generate while it drains (TokenizerManager's
sigterm_watchdog waits for every request in flight), so clients that never look would keep a stopping
server alive until systemd's TimeoutStopSec (2 minutes in the shipped profiles) kills it.

    PYTHONPATH=/usr/lib/ddtree-lab python3 -m sglang_standin.load PORT SECONDS CLIENTS BATCH MAX_NEW_TOKENS

(as a module: run as a file, its directory comes first on sys.path, and the stand-in's `http.py`
shadows the standard library's `http`.)
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request

SUMMARY = "ddtree-lab load: {ok} requests ({prompts} prompts) answered, {failed} failed, in {seconds:.0f} s"


HEALTH_EVERY_S = 0.25   # the balancer's pause between two health checks


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
            return resp.status == 200
    except OSError:  # 503 (HTTPError), refused, timed out
        return False


def balancer(port: int, serving: threading.Event, deadline: float) -> None:
    """Opens the gate while /health answers 200, closes it otherwise, until the deadline."""
    while time.monotonic() < deadline:
        if healthy(port):
            serving.set()
        else:
            serving.clear()
        time.sleep(HEALTH_EVERY_S)
    serving.set()  # let the clients see the deadline


def main(argv: list[str]) -> int:
    port, seconds, clients, batch, max_new = (int(float(a)) for a in argv[:5])
    deadline = time.monotonic() + seconds
    counts = {"ok": 0, "failed": 0}
    lock = threading.Lock()
    serving = threading.Event()
    serving.set()  # a request to a server that is not up fails and is counted, as before the first check

    def client(c: int) -> None:
        i = 0
        while time.monotonic() < deadline:
            if not serving.wait(timeout=1.0):
                continue
            body = {"text": [f"lab load client {c} request {i} prompt {k}: tell me about the tree" for k in range(batch)],
                    "sampling_params": {"temperature": 0, "max_new_tokens": max_new}}
            req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=120) as resp:
                    ok = resp.status == 200
                    resp.read()
            except OSError:
                ok = False
            with lock:
                counts["ok" if ok else "failed"] += 1
            if not ok:
                time.sleep(0.5)
            i += 1

    t0 = time.monotonic()
    threading.Thread(target=balancer, args=(port, serving, deadline), daemon=True).start()
    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(SUMMARY.format(ok=counts["ok"], prompts=counts["ok"] * batch, failed=counts["failed"],
                         seconds=time.monotonic() - t0), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
