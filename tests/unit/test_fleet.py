"""Fleet rollouts as data: sizes, waves, the exit code, and the orchestration (canary, budget,
refusals, Ctrl-C / SIGTERM) with each host's transaction scripted. The real transactions, against
real systemd and sshd, are in tests/fleet/test_fleet_lab.py."""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from ddtree_ops import deploy as deploy_mod
from ddtree_ops import fleet
from ddtree_ops.transaction import STOPPED, Outcome
from ddtree_ops.errors import UsageError
from ddtree_ops.fleet import Rollout, Size, exit_code, parse_batch, parse_budget, plan_waves
from ddtree_ops.lock import LockHeld
from ddtree_ops.profile import load_profile

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ sizes and plans


def test_sizes_parse_like_ansible_serial() -> None:
    assert parse_batch("3") == (Size(3),)
    assert parse_batch("25%") == (Size(percent=25.0),)
    assert parse_batch("1,5,25%") == (Size(1), Size(5), Size(percent=25.0))
    assert parse_budget("0") == Size(0) and parse_budget("34%") == Size(percent=34.0)
    for bad in ("", "0", "-1", "1.5", "x", "1,,2", "150%", "0%"):
        with pytest.raises(UsageError):
            parse_batch(bad)
    with pytest.raises(UsageError, match="--max-fail"):
        parse_budget("lots")


def test_shares_round_down_with_at_least_one_host_per_wave() -> None:
    assert Size(percent=25).of(6) == 1 and Size(percent=25).of(40) == 10 and Size(percent=1).of(6) == 1
    assert Rollout(max_fail=Size(percent=34)).allowed_failures(6) == 2
    assert Rollout(max_fail=Size(percent=34)).allowed_failures(2) == 0
    assert Rollout(max_fail=Size(percent=100 / 3)).allowed_failures(3) == 1  # no float rounding surprise


def test_waves_canary_first_then_a_ramp_whose_last_step_repeats() -> None:
    hosts = [f"h{i:02d}" for i in range(1, 21)]
    waves = plan_waves(hosts, Rollout(canary=1, batch=parse_batch("1,5,25%")))
    assert [len(w) for w in waves] == [1, 1, 5, 5, 5, 3]
    assert sum(waves, []) == hosts
    assert plan_waves(hosts[:3], Rollout(canary=0, batch=(Size(2),))) == [[], ["h01", "h02"], ["h03"]]
    assert plan_waves(hosts[:2], Rollout(canary=5)) == [["h01", "h02"]]


def test_canaries_are_taken_across_gpu_classes() -> None:
    hosts = ["a1", "a2", "a3", "b1", "b2"]
    classes = {"a1": "A6000", "a2": "A6000", "a3": "A6000", "b1": "PRO6000", "b2": "PRO6000"}
    waves = plan_waves(hosts, Rollout(canary=2, batch=(Size(2),)), classes)
    assert waves == [["a1", "b1"], ["a2", "a3"], ["b2"]]


def test_exit_code_of_a_fleet() -> None:
    assert exit_code(["ok", "no-change"]) == 0
    assert exit_code(["ok", "rolled-back", "skipped"]) == 1
    assert exit_code(["ok", "refused"]) == 1  # --skip-refused: not every host got the release
    assert exit_code(["ok", "degraded", "skipped"]) == 2
    assert exit_code(["refused", "skipped", "skipped"]) == 3
    assert exit_code(["dry-run", "dry-run"]) == 0


# ------------------------------------------------------------------ the orchestration, scripted


class Script:
    """Each host's transaction, scripted: what `deploy.deploy` returns (or raises) for it."""

    def __init__(self, results: dict[str, Any], delay: float = 0.05,
                 during: Callable[[str], None] | None = None) -> None:
        self.results, self.delay, self.during = results, delay, during
        self.started: list[str] = []
        self.lock = threading.Lock()

    def deploy(self, host: Any, p: Any, mode: str, *, stop: Callable[[], bool], abort: Callable[[], bool],
               **_: Any) -> Outcome:
        with self.lock:
            self.started.append(p.name)
        if stop():  # deploy checks this just before it changes the host
            return Outcome(p.name, mode, "r", 3, "refused", STOPPED)
        if self.during:  # the host is being changed and gated now
            self.during(p.name)
        time.sleep(self.delay)
        if abort():
            return Outcome(p.name, mode, "r", 1, "rolled-back", "interrupted (Ctrl-C); rolled back to kg",
                           known_good="kg")
        r = self.results.get(p.name, "ok")
        if isinstance(r, Exception):
            raise r
        code = {"ok": 0, "rolled-back": 1, "degraded": 2, "refused": 3}[r]
        o = Outcome(p.name, mode, f"{mode}-{p.name}", code, r, f"scripted {r}",
                    known_good=f"{mode}-{p.name}" if r == "ok" else "kg")
        if r in ("rolled-back", "degraded"):
            o.diagnosis = {"root_cause": {"label": "cuda_lib_load", "remedy": "fix LD_LIBRARY_PATH"}}
        return o


@contextmanager
def scripted(monkeypatch: pytest.MonkeyPatch, script: Script, refused: dict[str, str] | None = None) -> Iterator[None]:
    def check(t: fleet.Target, connect: Any) -> fleet.Checked:
        why = (refused or {}).get(t.name)
        return fleet.Checked(t.name, why is None, why or "", current="kg", known_good="kg", change="install")

    monkeypatch.setattr(fleet, "check_one", check)
    monkeypatch.setattr(deploy_mod, "deploy", script.deploy)
    yield


@contextmanager
def nowhere(_p: Any) -> Iterator[object]:
    yield object()


def targets(n: int = 6) -> list[fleet.Target]:
    base = load_profile("ct129", directory=REPO / "profiles")
    out = []
    for i in range(n):
        name = f"h{i + 1}"
        out.append(fleet.Target(name, base.model_copy(update={"name": name}), f"dflash-{name}", "A6000"))
    return out


def run(rollout: Rollout, **kw: Any) -> fleet.FleetOutcome:
    return fleet.deploy_fleet(targets(), nowhere, fleet.Options("dflash", rollout, assume_yes=True, **kw))


def results(out: fleet.FleetOutcome) -> dict[str, str]:
    return {h.host: h.result for h in out.hosts}


def test_a_failed_canary_touches_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Script({"h1": "rolled-back"})
    with scripted(monkeypatch, s):
        out = run(Rollout(canary=1, batch=(Size(2),), max_fail=Size(percent=100)))
    assert s.started == ["h1"]
    assert results(out) == {"h1": "rolled-back", **{f"h{i}": "skipped" for i in range(2, 7)}}
    assert out.stopped == "the canary failed: nothing else was touched" and out.exit_code == 1
    assert out.hosts[0].cause == "cuda_lib_load; rolled back"
    assert fleet.causes(out.hosts) == [("cuda_lib_load", ["h1"], "fix LD_LIBRARY_PATH")]


def test_budget_zero_finishes_the_wave_and_starts_no_other(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Script({"h2": "rolled-back"})
    with scripted(monkeypatch, s):
        out = run(Rollout(canary=1, batch=(Size(2),), max_fail=Size(0)))
    assert sorted(s.started) == ["h1", "h2", "h3"]
    assert results(out) == {"h1": "ok", "h2": "rolled-back", "h3": "ok", "h4": "skipped", "h5": "skipped",
                            "h6": "skipped"}
    assert out.stopped.startswith("failure budget spent: 1 failed, --max-fail 0 allows 0")
    assert [h.wave for h in out.hosts] == [0, 1, 1, 2, 2, 3]


def test_a_budget_of_34_percent_goes_past_one_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Script({"h2": "rolled-back"})
    with scripted(monkeypatch, s):
        out = run(Rollout(canary=1, batch=(Size(2),), max_fail=Size(percent=34)))
    assert len(s.started) == 6 and out.stopped is None and out.exit_code == 1
    assert list(results(out).values()).count("ok") == 5


def test_a_degraded_host_stops_the_rollout_whatever_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Script({"h2": "degraded"})
    with scripted(monkeypatch, s):
        out = run(Rollout(canary=1, batch=(Size(2),), max_fail=Size(percent=100)))
    assert out.stopped == "a host is degraded: no further host starts" and out.exit_code == 2
    assert results(out)["h4"] == "skipped"


def test_a_host_refused_at_its_turn_is_reported_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Script({"h3": LockHeld("h3: deploy lock held by ops@box (pid 7) since 2026-12-01T10:00:00Z for "
                               "`deploy lab --mode dflash`")})
    with scripted(monkeypatch, s):
        out = run(Rollout(canary=1, batch=(Size(2),), max_fail=Size(0)))
    assert len(s.started) == 6 and out.stopped is None
    h3 = next(h for h in out.hosts if h.host == "h3")
    assert (h3.result, h3.release) == ("refused", "kg") and h3.cause.startswith("deploy lock held by ops@box")
    assert out.exit_code == 1


def test_preflight_refusal_stops_before_any_change_unless_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Script({})
    with scripted(monkeypatch, s, refused={"h4": "preflight: memory: KV pool would hold 0 tokens"}):
        out = run(Rollout())
    assert s.started == [] and out.exit_code == 3
    assert results(out) == {"h4": "refused", **{f"h{i}": "skipped" for i in (1, 2, 3, 5, 6)}}
    assert "would be refused; nothing was changed" in (out.stopped or "")
    s2 = Script({})
    with scripted(monkeypatch, s2, refused={"h4": "preflight: memory: KV pool would hold 0 tokens"}):
        out = run(Rollout(skip_refused=True))
    assert sorted(s2.started) == ["h1", "h2", "h3", "h5", "h6"] and out.exit_code == 1
    assert all(h4 not in w for w in out.waves for h4 in ["h4"])


def test_not_confirmed_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Script({})
    with scripted(monkeypatch, s):
        out = fleet.deploy_fleet(targets(3), nowhere, fleet.Options("dflash", Rollout(), confirm=lambda q: False))
        refused = fleet.deploy_fleet(targets(3), nowhere, fleet.Options("dflash", Rollout(), confirm=None))
    assert s.started == [] and out.exit_code == 3 and refused.exit_code == 3
    assert "pass --yes" in (refused.stopped or "")


def test_dry_run_plans_and_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Script({})
    with scripted(monkeypatch, s):
        out = run(Rollout(batch=(Size(3),)), dry_run=True)
    assert s.started == [] and out.exit_code == 0 and set(results(out).values()) == {"dry-run"}
    assert out.waves == [["h1"], ["h2", "h3", "h4"], ["h5", "h6"]]


def _signal_when(host: str, sig: signal.Signals, times: int = 1) -> Callable[[str], None]:
    def during(name: str) -> None:
        if name == host:
            for _ in range(times):
                os.kill(os.getpid(), sig)
                time.sleep(0.05)

    return during


def test_ctrl_c_in_a_wave_lets_it_finish_and_starts_nothing_more(monkeypatch: pytest.MonkeyPatch) -> None:
    # Python's own Ctrl-C handler, whatever the suite was started with (a shell's background job
    # starts with SIGINT ignored): the rollout must put back what it found
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    s = Script({}, delay=0.3, during=_signal_when("h2", signal.SIGINT))
    try:
        with scripted(monkeypatch, s):
            out = run(Rollout(canary=1, batch=(Size(2),)))
        restored = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
    got = results(out)
    assert got["h1"] == "ok" and got["h2"] == "ok"
    # h3 runs beside h2: it either had not reached its change (skipped) or finished it
    assert got["h3"] in ("ok", "skipped")
    assert [got[h] for h in ("h4", "h5", "h6")] == ["skipped"] * 3
    assert out.stopped == "interrupted (Ctrl-C / SIGTERM): no new host started"
    assert restored is signal.default_int_handler  # put back afterwards


def test_sigterm_twice_rolls_the_running_hosts_back(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Script({}, delay=0.3, during=_signal_when("h2", signal.SIGTERM, times=2))
    with scripted(monkeypatch, s):
        out = run(Rollout(canary=1, batch=(Size(1),)))
    got = results(out)
    assert got["h2"] == "rolled-back" and got["h1"] == "ok"
    assert all(got[h] == "skipped" for h in ("h3", "h4", "h5", "h6"))
    assert out.exit_code == 1


def test_the_json_document_has_one_entry_per_host(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Script({"h3": "rolled-back"})
    with scripted(monkeypatch, s):
        out = run(Rollout(canary=1, batch=(Size(2),), max_fail=Size(percent=50)))
    doc = out.to_json()
    assert (doc["command"], doc["result"], doc["exit_code"], doc["failures"]) == ("deploy", "rolled-back", 1, 1)
    assert doc["rollout"] == {"canary": 1, "batch": ["2"], "max_fail": "50%", "allowed_failures": 3,
                              "canary_stay_s": None, "skip_refused": False}
    assert [h["host"] for h in doc["hosts"]] == ["h1", "h2", "h3", "h4", "h5", "h6"]
    h3 = doc["hosts"][2]
    assert (h3["result"], h3["exit_code"], h3["wave"], h3["release"]) == ("rolled-back", 1, 1, "kg")
    assert h3["deploy"]["result"] == "rolled-back" and h3["root_cause"]["label"] == "cuda_lib_load"
    lines = fleet.summary_lines(out)
    assert lines[0].split() == ["HOST", "WAVE", "RESULT", "TIME", "SERVING", "CAUSE"] and len(lines) == 7
    assert lines[1].split()[:3] == ["h1", "canary", "ok"]
    # each column holds what its name says: a host on the new release serves it and has no cause;
    # a rolled-back one serves its known-good release and names why
    assert lines[1].split()[4:] == ["dflash-h1", "-"]
    assert lines[3].split()[4] == "kg" and "cuda_lib_load; rolled back" in lines[3]


def test_fifty_hosts_one_line_each_and_causes_grouped(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Script({"g07": "rolled-back", "g08": "rolled-back", "g09": "rolled-back"}, delay=0.0)
    base = load_profile("ct129", directory=REPO / "profiles")
    many = [fleet.Target(f"g{i:02d}", base.model_copy(update={"name": f"g{i:02d}"}), f"r{i}", "A6000")
            for i in range(1, 51)]
    with scripted(monkeypatch, s):
        out = fleet.deploy_fleet(many, nowhere, fleet.Options("dflash", Rollout(batch=(Size(percent=10),),
                                                                             max_fail=Size(percent=10)),
                                                              assume_yes=True))
    lines = fleet.summary_lines(out)
    assert len(lines) == 51 and len({ln.split()[0] for ln in lines[1:]}) == 50
    assert max(len(ln) for ln in lines) < 160
    assert [len(w) for w in out.waves] == [1] + [5] * 9 + [4]  # 10% of 50: waves of 5
    assert fleet.causes(out.hosts) == [("cuda_lib_load", ["g07", "g08", "g09"], "fix LD_LIBRARY_PATH")]
    assert out.stopped is None  # 3 failures of 50: within the 10% budget (5)
    assert out.to_json()["counts"] == {"ok": 47, "rolled-back": 3}


def test_a_wave_off_a_terminal_says_where_each_running_host_is_every_interval(
        capsys: pytest.CaptureFixture[str]) -> None:
    from ddtree_ops import output

    def work(name: str) -> None:
        with output.captured(name, echo=False):
            for i in range(5):
                output.status(f"dflash {i}s of 900s: starting, waiting for /health_generate")
                time.sleep(0.1)

    threads = [threading.Thread(target=work, args=(n,)) for n in ("a1", "b1")]
    for th in threads:
        th.start()
    fleet.watch_wave(threads, ["a1", "b1"], every_s=0.15)
    err = capsys.readouterr().err
    progress = [ln for ln in err.splitlines() if ln.strip().startswith("...")]
    assert progress, err
    assert all("a1: dflash" in ln and "b1: dflash" in ln and "of 900s" in ln for ln in progress[:1])


def test_a_fleet_preflight_whose_connection_dropped_reads_the_host_again(tmp_path: Path) -> None:
    """A fleet's preflight of one host, its connection dropped during the GPU probe: read again on a new
    connection, not refused as "no GPU visible" (make test, a lab fleet run on 2026-12-06)."""
    from fakehost import FakeHost, shipped_profiles

    from ddtree_ops.gpu import PROBE
    from ddtree_ops.render import render

    p = load_profile("ct129", directory=shipped_profiles(tmp_path / "profiles", "ct129", ""))
    host = FakeHost.serving(p, "nextn")
    host.drops.append(PROBE)
    c = fleet.check_one(fleet.Target("ct129", p, render(p, "nextn").release_id, "a6000", "nextn"), lambda _p: host)
    assert (c.ok, c.reason, host.reconnects) == (True, "", 1)
