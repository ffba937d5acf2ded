"""diagnose's three-valued verdict does not touch the readiness checks of the deploy gate or of smoke
(issue 31): the gate passes on its own probes (/health_generate, the smoke request, the stay window,
the unit's counters) and fails on the first fatal journal line; smoke judges what it asked the host.
A journal that diagnose calls healthy never passes a gate by itself, and one it calls inconclusive
never fails one by itself."""

from __future__ import annotations

import ast
from pathlib import Path

from ddtree_ops.diagnose.classify import Scanner
from ddtree_ops.gate import GateConfig, GateState, Observation, SmokeResult, Status
from ddtree_ops.observe import JournalLine, UnitState
from diagnose_helpers import REPO

CFG = GateConfig(deadline_s=60, stay_s=5, poll_s=0.5, http_timeout_s=5, speculative=True)
ACTIVE = UnitState(active="active", sub="running", result="success", main_pid=100, restarts=0, invocation="inv1",
                   load="loaded")
SMOKE = SmokeResult(True, "0.31s, accept length 3.20", 0.31, " Paris.", 5, 3.2)
SERVING = ("[2026-01-10 09:00:19] The server is fired up and ready to roll!",
           "[2026-01-10 09:00:20 TP0] Decode batch, #running-req: 1, #token: 310, token usage: 0.00, accept len: 3.10, "
           "cuda graph: True, gen throughput (token/s): 31.02, #queue-req: 0, ",
           '[2026-01-10 09:00:20] INFO:     127.0.0.1:38000 - "POST /generate HTTP/1.1" 200 OK')


def _obs(t: float, lines: tuple[str, ...] = (), health: int | None = None, smoke: SmokeResult | None = None,
         err: str = "") -> Observation:
    return Observation(t, ACTIVE, [JournalLine(m) for m in lines], health, err, smoke)


def test_a_journal_diagnose_calls_healthy_does_not_pass_a_gate_whose_probe_never_answers() -> None:
    g = GateState(CFG, Scanner())
    assert g.step(_obs(1.0, SERVING, err="nothing answers on 127.0.0.1:30000")) is Status.WAIT
    assert g.scanner.report().verdict == "healthy"  # what diagnose --log would say of these lines
    assert g.step(_obs(60.5, err="nothing answers on 127.0.0.1:30000")) is Status.FAIL
    assert g.reason.startswith("not ready after 60s")


def test_a_journal_diagnose_calls_inconclusive_does_not_fail_a_gate_whose_probes_pass() -> None:
    g = GateState(CFG, Scanner())
    start = ("[2026-01-10 09:00:02 TP0] Load weight begin. avail mem=47.10 GB",)
    assert g.step(_obs(1.0, start, health=200, smoke=SMOKE)) is Status.WAIT
    assert g.scanner.report().verdict == "inconclusive"
    assert g.step(_obs(6.5, health=200)) is Status.PASS


def test_a_fatal_line_still_fails_the_gate_at_once_after_serving_lines() -> None:
    g = GateState(CFG, Scanner())
    assert g.step(_obs(1.0, SERVING, health=200, smoke=SMOKE)) is Status.WAIT
    assert g.step(_obs(2.0, ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",),
                       health=200)) is Status.FAIL
    assert g.fatal.label == "cuda_oom"


def test_smoke_judges_what_it_asks_the_host_and_reads_no_diagnosis() -> None:
    """smoke's readiness is its own probes (unit, /health_generate, a generation); no module of it
    imports diagnose, so no verdict of diagnose can weaken it."""
    for path in sorted((REPO / "ddtree_ops" / "smoke").glob("*.py")):
        tree = ast.parse(path.read_text("utf-8"))
        names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in names if "diagnose" in m], (path.name, names)
    from ddtree_ops.profile import load_profile
    from ddtree_ops.smoke import HttpProbe, Observation as SmokeObs, judge
    from ddtree_ops.status import NagiosExit

    cfg = load_profile("ct129", directory=Path(REPO / "profiles")).smoke
    down = SmokeObs("ct129", unit_name="sglang.service", unit=ACTIVE,
                    health=HttpProbe(error="connection refused"), generate=HttpProbe(error="connection refused"))
    assert judge(down, cfg).state is NagiosExit.CRITICAL


def test_a_service_is_healthy_only_when_rank_0_shows_it_serves() -> None:
    """A multi-node service: rank 0 serves HTTP and prints the serving lines; the other nodes'
    journals hold none, so their inconclusive is not the service's, and rank 0's is."""
    from ddtree_ops.diagnose.report import service_verdict

    assert service_verdict(["healthy", "inconclusive"]) == "healthy"
    assert service_verdict(["healthy", "degraded"]) == "degraded"
    assert service_verdict(["inconclusive", "healthy"]) == "inconclusive"  # never healthy without rank 0's evidence
    assert service_verdict(["degraded", "inconclusive"]) == "degraded"
    assert service_verdict(["healthy", "failed"]) == service_verdict(["inconclusive", "failed"]) == "failed"
    assert service_verdict(["healthy", None]) == service_verdict(["healthy", "unreadable"]) == "unreadable"
    assert service_verdict([None, "failed"]) == "failed"
