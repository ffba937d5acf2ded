"""ddtree-ops LAB: traffic for a lab host's service (`ddtree-ops lab load HOST`).

Runs inside the lab host as a transient unit (ddtree-lab-load.service), so it outlives the command that
started it and keeps sending through a restart of the service (a promote's switch): CLIENTS threads,
each posting one /generate of BATCH greedy prompts after another (SGLang runs a request's prompts as
one batch; the stand-in's plugin rounds are verified BATCH rows at a time), until SECONDS have passed.
A refused or failed request is counted and retried after half a second. The last line it prints (to
the journal) is the count. Standard library only: it runs on the host's system python.

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


def main(argv: list[str]) -> int:
    port, seconds, clients, batch, max_new = (int(float(a)) for a in argv[:5])
    deadline = time.monotonic() + seconds
    counts = {"ok": 0, "failed": 0}
    lock = threading.Lock()

    def client(c: int) -> None:
        i = 0
        while time.monotonic() < deadline:
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
