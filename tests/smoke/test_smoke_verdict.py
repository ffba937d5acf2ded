"""The smoke verdict on canned observations: each rule, the status line, the ordering of states."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from smoke_fakes import FakeHost, connector, generate_body, metrics, ok, server_info, show

from ddtree_ops import smoke
from ddtree_ops.host import HostKeyError, HostUnreachable, HttpResponse, HttpUnavailable
from ddtree_ops.status import NagiosExit


def check(profiles: dict[str, Any], fake: FakeHost | Exception, host: str = "ct129",
          state: smoke.StateStore | None = None) -> smoke.HostResult:
    return smoke.check_host(smoke.Target(host, profiles[host]), connector({host: fake}), state=state)


def test_healthy_host_is_ok_and_changes_nothing(profiles: dict[str, Any]) -> None:
    fake = FakeHost()
    r = check(profiles, fake)
    assert r.state is NagiosExit.OK, r.reasons
    assert r.reasons == []
    assert r.mode == "nextn"
    assert r.observation.release == "nextn-0123456789ab"
    assert {c.name: c.status for c in r.checks} == {
        "unit": "ok", "restarts": "ok", "health": "ok", "generate": "ok", "accept_len": "ok", "golden": "skipped"}
    assert r.value("latency") == pytest.approx(0.41)
    assert r.value("accept_len") == pytest.approx(2.67)
    # only reads: systemctl show, the unit file, and GETs besides the one smoke /generate
    assert [c for c in fake.calls if c.startswith("run ")] == [
        "run systemctl show --property " + ",".join(__import__("ddtree_ops.remote").remote.UNIT_PROPS)
        + " -- sglang.service"]
    assert [c for c in fake.calls if c.startswith("POST")] == ["POST /generate"]
    assert fake.closed


def test_smoke_request_is_greedy_and_small(profiles: dict[str, Any]) -> None:
    seen: list[Any] = []

    class Recording(FakeHost):
        def http(self, method: str, port: int, path: str, **kw: Any) -> HttpResponse:
            seen.append((method, port, path, kw.get("body"), kw.get("timeout")))
            return super().http(method, port, path, **kw)

    check(profiles, Recording())
    gen = next(s for s in seen if s[2] == "/generate")
    p = profiles["ct129"]
    assert gen[1] == p.service.port
    assert gen[3] == {"text": p.smoke.prompt,
                      "sampling_params": {"temperature": 0, "max_new_tokens": p.smoke.max_new_tokens}}
    assert gen[4] <= p.smoke.latency_critical_s + 1.0


@pytest.mark.parametrize("elapsed, state, reason", [
    (2.5, NagiosExit.WARNING, "latency 2.50s > 2s"),
    (5.2, NagiosExit.CRITICAL, "latency 5.20s > 5s"),
    (1.99, NagiosExit.OK, None),
])
def test_latency_budget(profiles: dict[str, Any], elapsed: float, state: NagiosExit, reason: str | None) -> None:
    r = check(profiles, FakeHost(routes={"POST /generate": ok(generate_body(), elapsed)}))
    assert r.state is state
    assert r.reasons == ([reason] if reason else [])


def test_accept_len_collapse_is_critical_draft_path_broken(profiles: dict[str, Any]) -> None:
    fake = FakeHost(routes={"POST /generate": ok(generate_body(accept=1.0), 0.9),
                            "GET /server_info": ok(server_info(avg=1.0)), "GET /metrics": ok(metrics(1.0))})
    r = check(profiles, fake)
    assert r.state is NagiosExit.CRITICAL
    assert r.reasons[0].startswith("accept_len 1.00 < 1.1 (draft path broken)")
    line = smoke.status_line([r])
    assert line.startswith("DDTREE-SMOKE CRITICAL - ct129: accept_len 1.00 < 1.1 (draft path broken)")
    assert "'ct129_accept_len'=1;1.5:;1.1:;0" in line


def test_accept_len_low_is_warning(profiles: dict[str, Any]) -> None:
    r = check(profiles, FakeHost(routes={"POST /generate": ok(generate_body(accept=1.3))}))
    assert r.state is NagiosExit.WARNING
    assert r.reasons == ["accept_len 1.30 < 1.5"]


def test_server_reported_collapse_counts_even_when_the_request_looked_fine(profiles: dict[str, Any]) -> None:
    r = check(profiles, FakeHost(routes={"GET /metrics": ok(metrics(1.02))}))
    assert r.state is NagiosExit.CRITICAL
    assert r.reasons == ["accept_len /metrics 1.02 < 1.1 (draft path broken)"]


@pytest.mark.parametrize("meta, expected", [
    # older SGLang: no spec_accept_length, only the verify counter
    ({"spec_verify_ct": 8, "completion_tokens": 16}, 2.0),
    # draft counters under either spelling, without completion_tokens
    ({"spec_verify_ct": 4, "spec_num_correct_drafts": 6, "completion_tokens": None}, 2.5),
    ({"spec_verify_ct": 4, "spec_accept_token_num": 2, "completion_tokens": None}, 1.5),
    ({"spec_verify_ct": 0, "completion_tokens": 16}, None),
    ({}, None),
])
def test_acceptance_length_tolerates_field_name_drift(meta: dict[str, Any], expected: float | None) -> None:
    got = smoke.accept_length({k: v for k, v in meta.items() if v is not None})
    assert got == (pytest.approx(expected) if expected is not None else None)


def test_spec_fields_under_old_names_are_judged(profiles: dict[str, Any]) -> None:
    body = generate_body(accept=None, meta={"spec_verify_ct": 16, "completion_tokens": 16})
    r = check(profiles, FakeHost(routes={"POST /generate": ok(body), "GET /server_info": ok(server_info(avg=None)),
                                         "GET /metrics": ok(metrics(None))}))
    assert r.state is NagiosExit.CRITICAL
    assert "accept_len 1.00 < 1.1 (draft path broken)" in r.reasons


def test_no_acceptance_reported_for_a_speculative_mode_is_a_warning(profiles: dict[str, Any]) -> None:
    fake = FakeHost(routes={"POST /generate": ok(generate_body(accept=None)),
                            "GET /server_info": ok(server_info(avg=None)), "GET /metrics": ok(metrics(None))})
    r = check(profiles, fake)
    assert r.state is NagiosExit.WARNING
    assert r.reasons == ["accept_len not reported"]


@pytest.mark.parametrize("systemctl, reason", [
    (show(active="failed", sub="failed", result="exit-code", pid=0), "unit failed/failed (exit-code)"),
    (show(active="inactive", sub="dead", pid=0), "unit inactive/dead"),
    (show(active="activating", sub="auto-restart", result="exit-code", restarts=3), "unit activating/auto-restart"),
    (show(active="inactive", sub="dead", load="not-found", pid=0), "sglang.service not installed"),
])
def test_unit_not_active_is_critical(profiles: dict[str, Any], systemctl: str, reason: str) -> None:
    refused = HttpUnavailable("ct129: nothing answers on 127.0.0.1:30000 (Connection refused)")
    r = check(profiles, FakeHost(systemctl=systemctl, routes={"GET /health_generate": refused}))
    assert r.state is NagiosExit.CRITICAL
    assert r.reasons[0].startswith(reason)


def test_health_unavailable_is_critical_and_nothing_else_waits_on_it(profiles: dict[str, Any]) -> None:
    fake = FakeHost(routes={"GET /health_generate": HttpUnavailable(
        "ct129: GET /health_generate on port 30000 timed out after 10s")})
    r = check(profiles, fake)
    assert r.state is NagiosExit.CRITICAL
    assert r.reasons == ["/health_generate timed out after 10s"]
    assert "POST /generate" not in fake.calls  # a hung server would make it wait out its timeout too
    assert {c.name: c.status for c in r.checks}["generate"] == "skipped"


def test_health_503_is_critical(profiles: dict[str, Any]) -> None:
    r = check(profiles, FakeHost(routes={"GET /health_generate": ok(b"unhealthy", status=503)}))
    assert (r.state, r.reasons) == (NagiosExit.CRITICAL, ["/health_generate HTTP 503"])


@pytest.mark.parametrize("answer, reason", [
    (ok(b"boom", status=500), "/generate HTTP 500"),
    (ok(b"<html>"), "/generate answered 200 with a non-JSON body"),
    (ok(generate_body(text="   ")), "empty completion"),
    (HttpUnavailable("ct129: POST /generate on port 30000 timed out after 6s"), "/generate timed out after 6s"),
])
def test_a_bad_smoke_answer_is_critical(profiles: dict[str, Any], answer: Any, reason: str) -> None:
    r = check(profiles, FakeHost(routes={"POST /generate": answer}))
    assert r.state is NagiosExit.CRITICAL
    assert r.reasons[0].startswith(reason)


@pytest.mark.parametrize("error", [
    HostUnreachable("ct129: cannot connect to 10.9.9.9:22 after 3 attempts (timed out)"),
    HostKeyError("ct129: HOST KEY CHANGED for 10.9.9.9"),
])
def test_unreachable_host_is_unknown(profiles: dict[str, Any], error: Exception) -> None:
    r = check(profiles, error)
    assert r.state is NagiosExit.UNKNOWN
    assert r.reasons[0].startswith("unreachable: ")
    assert "ct129: ct129" not in smoke.status_line([r])


def test_connection_lost_mid_check_is_unknown(profiles: dict[str, Any]) -> None:
    r = check(profiles, FakeHost(routes={"POST /generate": HostUnreachable("ct129: SSH connection lost")}))
    assert r.state is NagiosExit.UNKNOWN


def test_a_bug_in_a_check_is_unknown_not_a_crash(profiles: dict[str, Any]) -> None:
    r = check(profiles, FakeHost(routes={"GET /health_generate": ZeroDivisionError("oops")}))
    assert r.state is NagiosExit.UNKNOWN
    assert "ZeroDivisionError: oops" in r.reasons[0]


def test_unreadable_unit_state_is_unknown(profiles: dict[str, Any]) -> None:
    r = check(profiles, FakeHost(systemctl=""))
    assert r.state is NagiosExit.UNKNOWN
    assert "could not read the state of sglang.service" in r.reasons[0]


def test_restarts_rising_since_the_last_check_is_a_warning(profiles: dict[str, Any], tmp_path: Any) -> None:
    store = smoke.StateStore(tmp_path)
    first = check(profiles, FakeHost(systemctl=show(restarts=2)), state=store)
    assert first.state is NagiosExit.OK  # no earlier check: restarts alone prove nothing new
    store.update([first], time.time())
    again = smoke.StateStore(tmp_path)  # a later run reads what the first one left
    same = check(profiles, FakeHost(systemctl=show(restarts=2)), state=again)
    assert same.state is NagiosExit.OK
    rose = check(profiles, FakeHost(systemctl=show(restarts=4, pid=5151)), state=again)
    assert rose.state is NagiosExit.WARNING
    assert rose.reasons == ["restarted 2x since last check"]
    by_hand = check(profiles, FakeHost(systemctl=show(restarts=2, pid=777)), state=again)
    assert by_hand.state is NagiosExit.OK
    assert "started again by hand" in next(c.detail for c in by_hand.checks if c.name == "restarts")


def test_golden_recorded_then_replayed(profiles: dict[str, Any], tmp_path: Any) -> None:
    store = smoke.StateStore(tmp_path)
    p = profiles["ct129"]
    recorded = smoke.check_host(smoke.Target("ct129", p), connector({"ct129": FakeHost()}), state=store, record=True)
    path = store.record_golden(p, recorded, "2026-01-01T00:00:00Z")
    assert path is not None and json.loads(path.read_text())["mode"] == "nextn"
    same = check(profiles, FakeHost(), state=store)
    assert {c.name: c.status for c in same.checks}["golden"] == "ok"
    other = check(profiles, FakeHost(routes={"POST /generate": ok(generate_body(text=" Lyon. It is"))}), state=store)
    assert other.state is NagiosExit.WARNING
    assert other.reasons == ["output differs from golden"]
    detail = next(c.detail for c in other.checks if c.name == "golden")
    assert "at character 1: got 'Lyon" in detail
    # a changed prompt makes the recording stale: skipped with a reason, never a false alarm
    changed = p.model_copy(update={"smoke": p.smoke.model_copy(update={"prompt": "Name a colour:"})})
    stale = smoke.check_host(smoke.Target("ct129", changed), connector({"ct129": FakeHost()}), state=store)
    assert stale.state is NagiosExit.OK
    assert "no longer applies (prompt changed)" in next(c.detail for c in stale.checks if c.name == "golden")


def test_golden_pinned_in_the_profile_is_a_prefix(profiles: dict[str, Any], tmp_path: Any) -> None:
    p = profiles["ct129"]
    pinned = p.model_copy(update={"smoke": p.smoke.model_copy(update={"golden": "Paris."})})
    store = smoke.StateStore(tmp_path)
    good = smoke.check_host(smoke.Target("ct129", pinned), connector({"ct129": FakeHost()}), state=store)
    assert {c.name: c.status for c in good.checks}["golden"] == "ok"
    bad = smoke.check_host(smoke.Target("ct129", pinned), connector(
        {"ct129": FakeHost(routes={"POST /generate": ok(generate_body(text=" Pari, France"))})}), state=store)
    assert bad.state is NagiosExit.WARNING


def test_mode_falls_back_to_server_info_when_the_unit_has_no_header(profiles: dict[str, Any]) -> None:
    r = check(profiles, FakeHost(unit_text="[Unit]\n", routes={"GET /server_info": ok(server_info("DFLASH"))}))
    assert r.mode == "dflash"
    assert r.state is NagiosExit.OK


def test_status_line_and_overall_state(profiles: dict[str, Any]) -> None:
    results = smoke.check_hosts(
        [smoke.Target("ct129", profiles["ct129"]), smoke.Target("ct200", profiles["ct200"])],
        connector({"ct129": FakeHost(routes={"POST /generate": ok(generate_body(accept=1.0), 0.41)}),
                   "ct200": FakeHost(name="ct200")}))
    line = smoke.status_line(results)
    head, perf = line.split(" | ")
    assert head == "DDTREE-SMOKE CRITICAL - ct129: accept_len 1.00 < 1.1 (draft path broken); ct200: OK"
    assert "'ct129_latency'=0.41s;2;5;0" in perf.split()
    assert "'ct200_accept_len'=2.67;1.5:;1.1:;0" in perf.split()
    assert "\n" not in line
    details = smoke.detail_lines(results)
    assert details[0].startswith("ct129 [nextn]: CRITICAL")
    assert any(d.startswith("ct200 [nextn]: OK") for d in details)


@pytest.mark.parametrize("states, expected", [
    ([NagiosExit.OK, NagiosExit.WARNING], NagiosExit.WARNING),
    ([NagiosExit.WARNING, NagiosExit.UNKNOWN], NagiosExit.UNKNOWN),
    ([NagiosExit.UNKNOWN, NagiosExit.CRITICAL], NagiosExit.CRITICAL),
    ([NagiosExit.OK, NagiosExit.UNKNOWN], NagiosExit.UNKNOWN),
    ([], NagiosExit.OK),
])
def test_worst_state_order(states: list[NagiosExit], expected: NagiosExit) -> None:
    assert smoke.worst(states) is expected


def test_invalid_profile_makes_its_host_unknown() -> None:
    r = smoke.check_host(smoke.Target("ct999", error="profiles/ct999.yaml:3 gpu.arch: 'x' does not match"),
                         connector({}))
    assert r.state is NagiosExit.UNKNOWN
    assert r.reasons == ["profile: profiles/ct999.yaml:3 gpu.arch: 'x' does not match"]


def test_hosts_are_checked_in_parallel(profiles: dict[str, Any]) -> None:
    """Each host's first HTTP call waits until the other host's has begun. Checked in parallel, both
    meet at once; checked one after the other, the first would wait out the barrier and fail. No
    wall-clock bound, so a loaded machine cannot fail it."""
    met = threading.Barrier(2, timeout=20)

    class Meeting(FakeHost):
        def http(self, method: str, port: int, path: str, **kw: Any) -> Any:
            if not any(c.startswith(("GET ", "POST ")) for c in self.calls):
                met.wait()
            return super().http(method, port, path, **kw)

    fakes = {n: Meeting(name=n) for n in ("ct129", "ct200")}
    targets = [smoke.Target(n, profiles[n]) for n in fakes]
    par = smoke.check_hosts(targets, connector(fakes))
    assert not met.broken
    assert [r.host for r in par] == ["ct129", "ct200"] and all(r.state is NagiosExit.OK for r in par), par
    seq = smoke.check_hosts(targets, connector({n: FakeHost(name=n) for n in fakes}), jobs=1)
    assert [r.host for r in seq] == ["ct129", "ct200"]


def test_json_document(profiles: dict[str, Any]) -> None:
    r = check(profiles, FakeHost())
    doc = smoke.to_json([r], started_at="a", finished_at="b")
    assert doc["result"] == "ok" and doc["exit_code"] == 0
    host = doc["hosts"][0]
    assert host["metrics"]["accept_len"] == pytest.approx(2.67)
    assert host["unit"]["restarts"] == 0
    assert {c["name"] for c in host["checks"]} >= {"unit", "health", "generate", "accept_len"}
    json.dumps(doc)  # serialisable as is


def test_perfdata_label_quotes_are_doubled() -> None:
    assert smoke.Perf("it's_latency", 0.5, "s", "2", "5").render() == "'it''s_latency'=0.5s;2;5"


def test_a_server_of_unknown_mode_without_speculation_is_not_judged_on_acceptance(profiles: dict[str, Any]) -> None:
    plain = FakeHost(unit_text="[Unit]\n", routes={"POST /generate": ok(generate_body(accept=None)),
                                                   "GET /server_info": ok(server_info(algorithm=None, avg=None)),
                                                   "GET /metrics": ok(metrics(None))})
    r = check(profiles, plain)
    assert (r.state, r.mode) == (NagiosExit.OK, None)
    assert {c.name: c.status for c in r.checks}["accept_len"] == "skipped"
    # the same server under a unit that says it runs NEXTN: the draft path cannot be confirmed
    r = check(profiles, FakeHost(routes=plain.routes))
    assert (r.state, r.reasons) == (NagiosExit.WARNING, ["accept_len not reported"])


def test_an_idle_servers_zero_gauges_are_no_data_not_a_collapse(profiles: dict[str, Any]) -> None:
    """Acceptance below 1 is impossible (the bonus token alone is 1): a 0.0 gauge means nothing measured."""
    r = check(profiles, FakeHost(routes={"GET /server_info": ok(server_info(avg=0.0)), "GET /metrics": ok(metrics(0.0))}))
    assert r.state is NagiosExit.OK, r.reasons
    assert smoke.parse_metrics_accept(metrics(0.0).decode()) is None
    assert smoke.accept_length({"spec_accept_length": 0.0}) is None


def test_fifty_hosts_stay_readable(profiles: dict[str, Any]) -> None:
    """Past a handful of hosts the OK ones fold: the status line names the others and counts the OK
    ones; the long output gives an OK host one line and a failing one its checks."""
    names = [f"gpu-{i:02d}" for i in range(1, 51)]
    p = profiles["ct129"]
    fakes = {n: FakeHost(name=n) for n in names}
    fakes["gpu-17"] = FakeHost(name="gpu-17", routes={"POST /generate": ok(generate_body(accept=1.0), 0.4)})
    results = smoke.check_hosts([smoke.Target(n, p.model_copy(update={"name": n})) for n in names], connector(fakes))
    head = smoke.status_line(results).split(" | ")[0]
    assert head == "DDTREE-SMOKE CRITICAL - gpu-17: accept_len 1.00 < 1.1 (draft path broken); 49 of 50 hosts OK"
    details = smoke.detail_lines(results)
    assert len([d for d in details if not d.startswith(" ")]) == 50
    assert details[0].startswith("gpu-01 [nextn]: OK (") and "accept_len 2.67" in details[0]
    block = details[details.index(next(d for d in details if d.startswith("gpu-17"))):][:3]
    assert block[0].startswith("gpu-17 [nextn]: CRITICAL") and block[1].startswith("  unit: OK")
    assert len(details) == 49 + 1 + len(results[16].checks)


# ------------------------------------------------------------------ DDTREE shadow's own gauges

DDTREE_UNIT = "# ddtree-ops release=ddtree-shadow-0123456789ab profile_sha256=abcd mode=ddtree-shadow host=ct200\n[Unit]\n"


def shadow_exposition(*, silent_reason: str | None) -> bytes:
    """/metrics as the plugin's own gauges write it (prometheus_client, a fresh registry)."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    reg = CollectorRegistry()
    Gauge("ddtree_shadow_rounds", "r", registry=reg).set(0 if silent_reason else 512)
    Gauge("ddtree_shadow_tau_chain", "c", registry=reg).set(2.81)
    Gauge("ddtree_shadow_tau_tree_lower", "t", registry=reg).set(3.02)
    silent = Gauge("ddtree_shadow_silent", "s", ["reason"], registry=reg)
    if silent_reason:
        silent.labels(reason=silent_reason).set(1)
    return metrics() + generate_latest(reg)


@pytest.mark.parametrize("silent,state,reason", [
    (None, NagiosExit.OK, None),
    ("DDTREE_SHADOW_SHARE is 0", NagiosExit.WARNING, "shadow accounting not running"),
])
def test_ddtree_shadow_that_accounts_nothing_is_a_warning(profiles: dict[str, Any], silent: str | None,
                                                          state: NagiosExit, reason: str | None) -> None:
    fake = FakeHost(name="ct200", unit_text=DDTREE_UNIT,
                    routes={"GET /server_info": ok(server_info("DDTREE")),
                            "GET /metrics": ok(shadow_exposition(silent_reason=silent))})
    r = check(profiles, fake, host="ct200")
    shadow = next(c for c in r.checks if c.name == "shadow")
    assert r.state is state and shadow.state is state
    if silent:
        assert r.reasons == [reason] and silent in shadow.detail
    else:
        assert shadow.detail == "512 rounds accounted, tau chain 2.81, tree lower bound 3.02"
        assert r.value("shadow_rounds") == 512


def test_shadow_gauges_absent_skip_the_check_and_other_modes_have_none(profiles: dict[str, Any]) -> None:
    fake = FakeHost(name="ct200", unit_text=DDTREE_UNIT, routes={"GET /server_info": ok(server_info("DDTREE"))})
    r = check(profiles, fake, host="ct200")
    assert next(c for c in r.checks if c.name == "shadow").status == "skipped" and r.state is NagiosExit.OK
    assert "shadow" not in {c.name for c in check(profiles, FakeHost()).checks}
