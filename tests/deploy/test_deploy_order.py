"""`deploy HOST --yes` prints in the order things happen: preflight, plan (diff), restart, gate, verdict.

The transaction's host steps are replaced by fakes that print what the real ones print at the
moment they run (the restart line, the gate's progress through deploy's own progress printer), so
the test sees the operator's stderr as one stream in time order. The lab tests run the real steps.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import pytest

from ddtree_ops import deploy as dep
from ddtree_ops import gate as gating
from ddtree_ops.observe import UnitState
from ddtree_ops.preflight import Preflight
from ddtree_ops.attempts import Attempt
from ddtree_ops.releases import State

INSTALLED_UNIT = "# ddtree-ops release=nextn-old\n[Service]\nExecStart=/bin/true\n"


class Host:
    name = "ct129"
    round_trips = 0


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Patch the host-touching steps; returns the log of steps taken, in order."""
    steps: list[str] = []

    def preflight(host: Any, p: Any, mode: str, rendered: Any, layout: Any, plugin_version: str) -> Preflight:
        steps.append("preflight")
        pf = Preflight(installed_unit=INSTALLED_UNIT, installed_env="")
        pf.add("gpu", "ok", "NVIDIA RTX A6000 sm_86, 48140 MiB free")
        pf.add("memory", "ok", "KV pool 131072 tokens fits")
        return pf

    @contextlib.contextmanager
    def held(*a: Any, **k: Any) -> Iterator[None]:
        steps.append("lock")
        yield

    def install(*a: Any, **k: Any) -> dep.Restarted:
        steps.append("restart")
        return dep.Restarted(cursor="s=1", previous_invocation="old", stop_s=0.1)

    def run_gate(host: Any, p: Any, mode: str, *, on_progress: Any = None, **k: Any) -> gating.GateResult:
        steps.append("gate")
        cfg = gating.GateConfig(deadline_s=900, stay_s=30, poll_s=0.25, http_timeout_s=10, speculative=True)
        state = gating.GateState(cfg, scanner=None)
        for t, phase in ((0.5, gating.Phase.STARTING), (12.0, gating.Phase.STAY)):
            state.phase = phase
            on_progress(state, gating.Observation(t, UnitState(active="activating", sub="start"), []))
        state.status, state.reason = gating.Status.PASS, "healthy for 30s after the smoke request"
        return gating.GateResult(True, state.reason, 42.0, state, 0.0)

    monkeypatch.setattr(dep, "run_preflight", preflight)
    monkeypatch.setattr(dep.lock, "held", held)
    # the host runs nextn-old, which passed its gate: the rollback target
    state = State("nextn-old", None, [Attempt("a0", "deploy", "nextn-old", "nextn", "t", "2026-12-01T00:00:00Z",
                                              outcome="passed")], {"nextn-old": {"release_id": "nextn-old",
                                                                                 "mode": "nextn"}})
    monkeypatch.setattr(dep.releases, "read_state", lambda *a: state)
    monkeypatch.setattr(dep.releases, "apply", lambda *a, **k: steps.append("record"))
    monkeypatch.setattr(dep.releases, "prune", lambda *a, **k: None)
    monkeypatch.setattr(dep, "install", install)
    monkeypatch.setattr(dep.gating, "run_gate", run_gate)

    import ddtree_ops.cli._common as common

    @contextlib.contextmanager
    def connect(p: Any, ssh_config: Any) -> Iterator[Host]:
        yield Host()

    monkeypatch.setattr(common, "connect", connect)
    return steps


def _deploy(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from ddtree_ops.cli.app import main

    with pytest.raises(SystemExit) as exc:
        main(["deploy", "ct129", "--mode", "nextn", *args])
    out = capsys.readouterr()
    return int(exc.value.code), out.out, out.err


def _order(err: str, *needles: str) -> list[int]:
    at = [err.find(n) for n in needles]
    assert all(i >= 0 for i in at), [n for n, i in zip(needles, at) if i < 0]
    return at


def test_yes_prints_preflight_and_plan_before_the_restart_and_the_gate(
        fakes: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    rc, out, err = _deploy(capsys, "--yes")
    assert rc == 0 and out == ""
    assert fakes == ["lock", "preflight", "restart", "gate", "record"]
    at = _order(err, "ct129: would change: deploy nextn-", "on failure: roll back to nextn-old (nextn)",
                "preflight for nextn-", "ok   gpu", "launch line:", "- /bin/true", "files:",
                "+++ /etc/systemd/system/",
                "installed nextn-", "[nextn]   0.5s of 900s: waiting for /health_generate",
                "[nextn]  12.0s of 900s: waiting for the service to stay healthy", "OK ct129 nextn")
    assert at == sorted(at), err
    assert err.count("preflight for") == 1 and err.count("launch line:") == 1   # printed once, not again at the end


def test_the_plan_comes_before_the_question(fakes: list[str], capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import ddtree_ops.cli._common as common

    seen: list[str] = []

    def confirm(question: str) -> bool:
        seen.append(capsys.readouterr().err)   # what the operator has read when asked
        return False

    monkeypatch.setattr(common, "interactive", lambda: True)
    monkeypatch.setattr(common, "confirm", confirm)
    rc, _, err = _deploy(capsys)
    assert rc == 3 and fakes == ["lock", "preflight"]                     # nothing changed
    assert "would change" in seen[0] and "preflight for" in seen[0] and "launch line:" in seen[0]
    assert "+++ " in seen[0]
    assert "not confirmed; nothing changed" in err


def test_a_refused_preflight_shows_the_table_and_no_diff(fakes: list[str], capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*a: Any) -> Preflight:
        pf = Preflight(installed_unit=INSTALLED_UNIT, installed_env="")
        pf.add("memory", "fail", "KV pool needs 52 GiB, the card has 48 [fits: no]")
        return pf

    monkeypatch.setattr(dep, "run_preflight", refuse)
    rc, _, err = _deploy(capsys, "--yes")
    assert rc == 3 and "restart" not in fakes
    assert "FAIL memory        KV pool needs 52 GiB, the card has 48 [fits: no]" in err   # printed as typed
    assert "launch line:" not in err and "+++ " not in err and err.count("preflight for") == 1


def test_json_keeps_stdout_one_document(fakes: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    import json

    rc, out, err = _deploy(capsys, "--yes", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["result"] == "ok" and [c["name"] for c in doc["preflight"]["checks"]] == ["gpu", "memory"]
    assert "preflight for" not in err


def test_journal_text_in_the_verdict_and_rollback_prints_as_typed(
        fakes: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from ddtree_ops.releases import StoredRelease

    def gate(host: Any, p: Any, mode: str, **k: Any) -> gating.GateResult:
        fakes.append("gate")
        cfg = gating.GateConfig(deadline_s=900, stay_s=30, poll_s=0.25, http_timeout_s=10, speculative=True)
        state = gating.GateState(cfg, scanner=None)
        first = fakes.count("gate") == 1
        state.status = gating.Status.FAIL if first else gating.Status.PASS
        state.reason = "fatal log line: OSError: [/usr/lib] [rank0] libcuda.so.1" if first else "healthy"
        return gating.GateResult(not first, state.reason, 3.0, state, 0.0)

    monkeypatch.setattr(dep.gating, "run_gate", gate)
    monkeypatch.setattr(dep, "explain_failure", lambda r: ({"root_cause": {
        "label": "cuda_library_missing", "line": 7, "evidence": "OSError: [/usr/lib] [rank0] libcuda.so.1",
        "remedy": "reinstall the driver [/x]"}}, []))
    monkeypatch.setattr(dep.releases, "load_release", lambda *a: StoredRelease(
        "nextn-old", INSTALLED_UNIT, "", {"mode": "nextn"}))
    rc, _, err = _deploy(capsys, "--yes")
    assert rc == 1 and fakes.count("restart") == 2 and "Traceback" not in err
    assert "rolling back to nextn-old (nextn): gate failed: fatal log line: OSError: [/usr/lib] [rank0]" in err
    assert "root cause: cuda_library_missing (line 7): OSError: [/usr/lib] [rank0] libcuda.so.1" in err
    assert "remedy: reinstall the driver [/x]" in err
    assert err.index("launch line:") < err.index("rolling back") < err.index("ROLLED-BACK ct129 nextn")
