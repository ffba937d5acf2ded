"""Each injected fault, on a real systemd unit over SSH: the log lines SGLang would print, the exit
status systemd records, restarts. Every test leaves its host healthy on NEXTN again. The faults are
the same on either host; all but the stray run on ct200, whose worker has fewer tests than ct129's
(tests/labkit.py's `lab_group`), and the stray on ct129, whose 48 GB card it fills."""

from __future__ import annotations

import re
import time
from typing import Any, Iterator

import pytest

from ddtree_ops import gpu
from labkit import PORT, UNIT, generate, health, one_host, restart, show, unit_journal, wait_for, wait_journal

pytestmark = pytest.mark.lab
SIGKILL = ("2", "9")  # ExecMainCode=2 (killed), ExecMainStatus=9: SGLang's launcher SIGKILLs itself
DROPIN = "/etc/systemd/system/sglang.service.d/zz-lab-test.conf"


@pytest.fixture()
def host(lab: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    name = request.param
    with lab.connect(name) as h:
        try:
            yield h
        finally:
            h.run(["rm", "-f", DROPIN])
            h.run(["systemctl", "daemon-reload"])
            lab.restore(name)


def main_exit(h: Any) -> tuple[str, str]:
    p = show(h, "ExecMainCode", "ExecMainStatus")
    return p["ExecMainCode"], p["ExecMainStatus"]


@pytest.mark.parametrize("host", [one_host("ct200")], indirect=True)
def test_libcuda_missing(lab: Any, host: Any) -> None:
    lab.fault("ct200", "libcuda-missing")
    t0 = time.monotonic()
    inv = restart(host)
    log = wait_journal(host, inv, "Received sigquit from a child process. It usually means the child failed.")
    assert time.monotonic() - t0 > 2  # a few seconds after the start, as in the story
    assert "Scheduler hit an exception: Traceback (most recent call last):" in log
    assert "in __init__\n    self._handle = _dlopen(self._name, mode)" in log
    assert "OSError: libcuda.so.1: cannot open shared object file: No such file or directory" in log
    wait_for("the main process to be gone", lambda: main_exit(host) == SIGKILL)


@pytest.mark.parametrize("host", [one_host("ct200")], indirect=True)
def test_hang_is_never_ready(lab: Any, host: Any) -> None:
    lab.fault("ct200", "hang")
    inv = restart(host)
    wait_journal(host, inv, "Uvicorn running on http://127.0.0.1:30000")
    time.sleep(3)
    assert health(host, "/health") == 503 and health(host) == 503
    assert show(host, "ActiveState")["ActiveState"] == "activating"
    assert "fired up" not in unit_journal(host, lines=30)


@pytest.mark.parametrize("host", [one_host("ct200")], indirect=True)
def test_crash_after_ready_restarts(lab: Any, host: Any) -> None:
    # a short RestartSec (test-only drop-in) to watch systemd bring it back, and die again
    host.run(["mkdir", "-p", DROPIN.rsplit("/", 1)[0]]).check()
    host.put(DROPIN, b"[Service]\nRestartSec=1\n")
    host.run(["systemctl", "daemon-reload"]).check()
    lab.fault("ct200", "crash-after-ready", seconds=3)
    inv = restart(host)
    wait_journal(host, inv, "The server is fired up and ready to roll!")
    assert health(host) == 200
    # once serving, SGLang's running-phase SIGQUIT handler answers the scheduler's death
    log = wait_journal(host, inv, "SIGQUIT received. signum=None, frame=None. It usually means one child failed.",
                       timeout=30)
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in log
    wait_for("a restart", lambda: int(show(host, "NRestarts")["NRestarts"]) >= 1, timeout=30)
    assert "code=killed, status=9/KILL" in unit_journal(host, lines=200)


@pytest.mark.parametrize("host", [one_host("ct200")], indirect=True)
def test_slow_start(lab: Any, host: Any) -> None:
    assert lab.fault("ct200", "slow-start", seconds=6) == ["slow-start=6"]
    t0 = time.monotonic()
    inv = restart(host)
    wait_for("readiness", lambda: health(host) == 200, timeout=60, step=0.5)
    took = time.monotonic() - t0
    log = wait_journal(host, inv, "fired up")
    # the target's weights took the fault's length (SGLang's own line says how long), and nothing was ready before
    (elapsed,) = re.findall(r"Load weight end\. elapsed=([0-9.]+) s, type=Qwen3ForCausalLM", log)
    assert 6 <= float(elapsed) < 8 and took >= 6, (elapsed, took)
    assert "The server is fired up and ready to roll!" in log


@pytest.mark.parametrize("host", [one_host("ct200")], indirect=True)
def test_accept_collapse(lab: Any, host: Any) -> None:
    lab.fault("ct200", "accept-collapse")
    inv = restart(host)
    wait_for("readiness", lambda: show(host, "ActiveState")["ActiveState"] == "active", timeout=60)
    # long enough for a decode line: SGLang logs one every --decode-log-interval (40) forward steps
    meta = generate(host, "Explain speculative decoding", 128)["meta_info"]
    assert meta["spec_accept_length"] == 1.0 and meta["spec_verify_ct"] == meta["completion_tokens"]
    assert "accept len: 1.00" in wait_journal(host, inv, "accept len: 1.00")
    metrics = host.http("GET", PORT, "/metrics").text
    assert "sglang:spec_accept_length{" in metrics


@pytest.mark.parametrize("host", [one_host("ct200")], indirect=True)
def test_port_busy(lab: Any, host: Any) -> None:
    lab.fault("ct200", "port-busy")
    inv = restart(host)
    log = wait_journal(host, inv, "Application shutdown complete.")
    assert ("ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): "
            "address already in use") in log
    wait_for("exit status 1", lambda: main_exit(host) == ("1", "1"))


@pytest.mark.parametrize("host", [one_host("ct129")], indirect=True)
def test_stray_gpu_process(lab: Any, host: Any) -> None:
    lab.fault("ct129", "stray-gpu-process")
    def stray_seen() -> Any:
        snap = gpu.snapshot(host, "/opt/sglang/venv/bin/python")
        return snap if snap.strays(UNIT) else None

    snap = wait_for("the stray in nvidia-smi", stray_seen)
    (stray,) = snap.strays(UNIT)
    assert stray.unit == "ddtree-lab-stray-gpu.service" and stray.used_mib > 29_000
    inv = restart(host)
    log = wait_journal(host, inv, "Received sigquit from a child process")
    # 0.5.17's text beside a process holding the card (real: 3_ddtree_s025_shared_gpu)
    assert "\nValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=" in log
    wait_for("SIGKILL", lambda: main_exit(host) == SIGKILL)
