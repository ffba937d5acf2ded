"""The gate's verdicts from scripted observations (pure: no host, no clock)."""

from __future__ import annotations

import pytest

from ddtree_ops.gate import GateConfig, GateState, Observation, SmokeResult, Status
from ddtree_ops.observe import JournalLine, UnitState

classify = pytest.importorskip("ddtree_ops.diagnose.classify")

CFG = GateConfig(deadline_s=60, stay_s=5, poll_s=0.5, http_timeout_s=5, speculative=True)
ACTIVATING = UnitState(active="activating", sub="start", result="success", main_pid=100, restarts=0,
                       invocation="inv1", load="loaded")
ACTIVE = UnitState(active="active", sub="running", result="success", main_pid=100, restarts=0, invocation="inv1",
                   load="loaded")
GOOD_SMOKE = SmokeResult(True, "0.31s, accept length 3.20", 0.31, " Paris.", 5, 3.2)


def obs(t: float, unit: UnitState = ACTIVE, lines: tuple[str, ...] = (), health: int | None = None,
        smoke: SmokeResult | None = None, err: str = "") -> Observation:
    return Observation(t, unit, [JournalLine(m) for m in lines], health, err, smoke)


def gate() -> GateState:
    return GateState(CFG, classify.Scanner())


def test_pass_needs_health_smoke_and_the_whole_window() -> None:
    g = gate()
    assert g.step(obs(0.5, ACTIVATING, ("Load weight begin. avail mem=46.9 GB",))) is Status.WAIT
    assert g.step(obs(3.0, ACTIVE, ("The server is fired up and ready to roll!",), 200, GOOD_SMOKE)) is Status.WAIT
    assert g.phase.value == "stay"
    assert g.step(obs(6.0, health=200)) is Status.WAIT
    assert g.step(obs(8.1, health=200)) is Status.PASS
    assert "ready after 3.0s" in g.reason


def test_fatal_line_fails_at_once_even_while_the_unit_is_active() -> None:
    g = gate()
    g.step(obs(1.0, ACTIVE))
    status = g.step(obs(2.0, ACTIVE, (
        "Traceback (most recent call last):",
        '  File "/opt/sglang/venv/lib/python3.11/site-packages/sgl_kernel/load_utils.py", line 42, in _load',
        "    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)",
        "OSError: libcuda.so.1: cannot open shared object file: No such file or directory",
    )))
    assert status is Status.FAIL
    assert g.fatal.label == "cuda_lib_load"
    assert "fatal log line (cuda_lib_load)" in g.reason


@pytest.mark.parametrize("later,why", [
    (UnitState(active="active", sub="running", result="success", main_pid=100, restarts=1, invocation="inv1",
               load="loaded"), "NRestarts 0 -> 1"),
    (UnitState(active="active", sub="running", result="success", main_pid=200, restarts=0, invocation="inv1",
               load="loaded"), "main process changed"),
    (UnitState(active="activating", sub="auto-restart", result="exit-code", main_pid=0, restarts=0,
               invocation="inv1", load="loaded"), "the unit failed"),
    (UnitState(active="active", sub="running", result="success", main_pid=100, restarts=0, invocation="inv2",
               load="loaded"), "new invocation"),
])
def test_restarts_and_failures_fail_at_once(later: UnitState, why: str) -> None:
    g = gate()
    g.step(obs(1.0, ACTIVE))
    assert g.step(obs(1.5, later)) is Status.FAIL
    assert why in g.reason


def test_deadline_without_readiness() -> None:
    g = gate()
    assert g.step(obs(30, ACTIVATING, err="nothing answers")) is Status.WAIT
    assert g.step(obs(60.2, ACTIVATING, err="nothing answers on 127.0.0.1:30000")) is Status.FAIL
    assert g.reason.startswith("not ready after 60s (nothing answers")


def test_collapsed_acceptance_fails_the_smoke() -> None:
    g = gate()
    bad = SmokeResult(False, "acceptance length 1.0 is not above 1.00: the draft path is broken", 0.2, "x", 16, 1.0)
    assert g.step(obs(3, ACTIVE, health=200, smoke=bad)) is Status.FAIL
    assert "draft path is broken" in g.reason


def test_health_lost_inside_the_window() -> None:
    g = gate()
    g.step(obs(3, ACTIVE, health=200, smoke=GOOD_SMOKE))
    assert g.step(obs(4, ACTIVE, health=503)) is Status.FAIL
    assert "from 200 to 503" in g.reason


def test_benign_scary_lines_do_not_fail() -> None:
    g = gate()
    g.step(obs(1, ACTIVATING, (
        "Silent incorrectness is only a *potential* risk, not something we have observed",
        "Decode batch. #running-req: 40, #token: 9100, token usage: 0.05, cuda graph: False, gen throughput (token/s): 900",
    )))
    assert g.status is Status.WAIT
