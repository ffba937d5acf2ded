"""`diagnose HOST` against a fake Host that returns canned command output (GCM style)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from ddtree_ops.diagnose import live
from ddtree_ops.host import HttpResponse, HttpUnavailable, Result
from diagnose_helpers import FIXTURES, as_journal_json, raw_lines

INV = "0123456789abcdef"


@dataclass
class FakeHost:
    """Canned Results keyed by argv; files by path. Unknown commands fail like a missing binary."""

    name: str = "ct129"
    results: dict[tuple[str, ...], Result] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    calls: list[tuple[str, ...]] = field(default_factory=list)
    health: int | None = None  # what /health_generate answers; None: nothing listens

    def on(self, argv: list[str], stdout: str = "", rc: int = 0, stderr: str = "") -> None:
        self.results[tuple(argv)] = Result(tuple(argv), rc, stdout, stderr)

    def run(self, argv: Any, *, stdin: bytes | None = None, timeout: float = 60.0, sudo: bool = False) -> Result:
        self.calls.append(tuple(argv))
        return self.results.get(tuple(argv), Result(tuple(argv), 127, "", f"{argv[0]}: command not found"))

    def get(self, path: str) -> bytes | None:
        return self.files.get(path)

    def put(self, path: str, data: bytes, *, mode: int = 0o644) -> None:  # pragma: no cover - unused
        self.files[path] = data

    def http(self, method: str, port: int, path: str, **k: Any) -> Any:
        self.calls.append(("http", method, path))
        if (method, path) != ("GET", "/health_generate"):
            raise AssertionError(f"diagnose asks only the health endpoint, not {method} {path}")
        if self.health is None:
            raise HttpUnavailable(f"{self.name}: nothing answers on 127.0.0.1:{port} (connection refused)")
        return HttpResponse(self.health, b"", 0.01)

    def close(self) -> None:
        pass


@pytest.fixture()
def profile() -> Any:
    from ddtree_ops.profile import load_profile

    return load_profile("ct129")


def _host(profile: Any, fixture: str, *, unit_result: str = "exit-code", exec_start: str = "--speculative-algorithm DDTREE",
          kernel: str = "", smi: tuple[str, int, str] = ("0, GPU-1, NVIDIA RTX A6000, 49140, 120, 49020, 8.6, 580.95.05", 0, ""),
          apps: str = "", plugin: dict[str, Any] | None = None, draft_cfg: dict[str, Any] | None = None) -> FakeHost:
    unit = profile.service.unit
    h = FakeHost()
    h.on(live.cmd_unit_state(unit), f"Result={unit_result}\nExecMainStatus=1\nNRestarts=2\nInvocationID={INV}\n"
                                     "ActiveState=failed\nSubState=failed\nMainPID=0\n")
    h.on(live.cmd_exec_start(unit), f"{{ path=/opt/venv/bin/python ; argv[]=python -m sglang.launch_server {exec_start} ; }}")
    journal = b"\n".join(as_journal_json(raw_lines(FIXTURES / fixture))).decode()
    old = json.dumps({"MESSAGE": "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
                      "_SYSTEMD_INVOCATION_ID": "00000000old", "__REALTIME_TIMESTAMP": "1766000000000000"})
    h.on(live.cmd_journal_recent(unit), old + "\n" + journal)
    h.on(live.cmd_journal_invocation(unit, INV), journal)
    h.on(live.cmd_kernel_since(1767000000), kernel)
    h.on(live.cmd_gpus(), smi[0], rc=smi[1], stderr=smi[2])
    h.on(live.cmd_gpu_apps(), apps)
    h.on(live.cmd_service_pids(unit), "")
    h.on(live.cmd_plugin_check(profile.service.python),
         json.dumps(plugin or {"sglang": "0.5.23", "registered": True, "dflash_family": True, "error": None}))
    h.files[f"{profile.service.model_path}/config.json"] = json.dumps({"num_hidden_layers": 36}).encode()
    draft = profile.mode("ddtree-shadow").draft_model_path
    h.files[f"{draft}/config.json"] = json.dumps(
        draft_cfg if draft_cfg is not None else {"num_hidden_layers": 5, "dflash_config": {"target_layer_ids": [1, 9, 17, 25, 33]}}).encode()
    return h


def test_commands_are_data() -> None:
    assert live.cmd_unit_state("s.service") == [
        "systemctl", "show", "-p", "Result,ExecMainStatus,NRestarts,InvocationID,ActiveState,SubState,MainPID,"
        "ExecMainPID,ExecMainCode,LoadState", "--", "s.service"]
    assert live.cmd_kernel_since(1700000000) == ["journalctl", "-k", "--since", "@1700000000", "-o", "short-iso", "--no-pager"]
    assert live.cmd_journal_invocation("s.service", "abc")[-3:] == ["+", "UNIT=s.service", "INVOCATION_ID=abc"]
    assert live.cmd_plugin_check("/opt/venv/bin/python")[:3] == ["env", "SGLANG_PLUGINS=ddtree", "/opt/venv/bin/python"]


def test_journal_cause_with_previous_starts(profile: Any) -> None:
    h = _host(profile, "synthetic-kv_pool_too_small-weights-leave-no-memory.log")
    diag = live.diagnose_host(h, profile)
    rep = diag.combined()
    assert rep.verdict == "failed" and rep.root_cause is not None
    assert rep.root_cause.label == "kv_pool_too_small" and rep.root_cause.direction == "raise"
    assert diag.mode == "ddtree-shadow" and diag.unit.restarts == 2
    assert [i.report.root_cause.label for i in diag.previous if i.report.root_cause] == ["kv_pool_too_small"]
    assert diag.current.memory.weights_gb == 44.80


def test_hardware_xid_wins_over_the_software_symptom(profile: Any) -> None:
    kernel = "2026-01-10T09:20:00+0000 ct129 kernel: NVRM: Xid (PCI:0000:01:00): 79, pid=41231, GPU has fallen off the bus.\n"
    h = _host(profile, "synthetic-illegal_memory_access-nccl-watchdog.log", kernel=kernel)
    rep = live.diagnose_host(h, profile).combined()
    assert rep.root_cause is not None and rep.root_cause.hardware
    assert "do not roll back the software" in rep.root_cause.remedy


def test_kernel_oom_explains_a_silent_death(profile: Any, tmp_path: Any) -> None:
    kernel = ("2026-01-10T09:01:02+0000 ct129 kernel: python invoked oom-killer: gfp_mask=0x140cca\n"
              "2026-01-10T09:01:02+0000 ct129 kernel: Out of memory: Killed process 41231 (python) total-vm:78521468kB\n")
    h = _host(profile, "synthetic-healthy-full-startup.log", kernel=kernel)
    rep = live.diagnose_host(h, profile).combined()
    assert rep.root_cause is not None and rep.root_cause.label == "host_oom"


def test_ddtree_not_dflash_family_is_hidden_capture_missing(profile: Any) -> None:
    h = _host(profile, "synthetic-healthy-full-startup.log",
              plugin={"sglang": "0.5.23", "registered": True, "dflash_family": False, "error": None})
    diag = live.diagnose_host(h, profile)
    rep = diag.combined()
    assert rep.root_cause is not None and rep.root_cause.label == "hidden_capture_missing"
    assert any(c.name.startswith("DDTREE") and c.status == "fail" for c in diag.checks)


def test_sglang_import_failure_is_a_finding_not_a_crash(profile: Any) -> None:
    h = _host(profile, "synthetic-healthy-full-startup.log",
              plugin={"sglang": None, "registered": False, "dflash_family": None,
                      "error": "ImportError: libcudart.so.12: cannot open shared object file: No such file or directory"})
    rep = live.diagnose_host(h, profile).combined()
    assert rep.root_cause is not None and rep.root_cause.label == "cuda_lib_load"


@pytest.mark.parametrize("cfg, status, label", [
    ({"num_hidden_layers": 5, "dflash_config": {"target_layer_ids": [1, 9, 17, 25, 40]}}, "fail", "spec_decode_misconfig"),
    ({"num_hidden_layers": 5, "dflash_config": {}}, "warn", "spec_decode_misconfig"),
    ({"num_hidden_layers": 5, "dflash_config": {"target_layer_ids": [1, 9, 17, 25, 33]}}, "ok", None),
])
def test_target_layer_ids_against_target_layers(profile: Any, cfg: dict[str, Any], status: str, label: str | None) -> None:
    h = _host(profile, "synthetic-healthy-full-startup.log", draft_cfg=cfg)
    diag = live.diagnose_host(h, profile)
    check = next(c for c in diag.checks if c.name == "draft target_layer_ids")
    assert check.status == status
    assert [f.label for f in diag.extra if f.rule_id.startswith("check_")][:1] == ([label] if label else [])


def test_accept_len_stuck_at_one(profile: Any) -> None:
    h = _host(profile, "synthetic-hidden_capture_missing-accept-len-stuck.log")
    diag = live.diagnose_host(h, profile)
    rep = diag.combined()
    assert rep.root_cause is not None and rep.root_cause.label == "hidden_capture_missing"
    assert any(c.name.startswith("acceptance") and c.status == "fail" for c in diag.checks)


def test_nvidia_smi_failure_is_classified(profile: Any) -> None:
    h = _host(profile, "synthetic-healthy-full-startup.log",
              smi=("", 18, "Failed to initialize NVML: Driver/library version mismatch"))
    diag = live.diagnose_host(h, profile)
    assert any(f.label == "cuda_driver_incompatible" for f in diag.extra)


def test_stray_gpu_process_is_reported(profile: Any) -> None:
    h = _host(profile, "synthetic-healthy-full-startup.log", unit_result="success",
              apps="GPU-1, 999, python3, 30000\n")
    diag = live.diagnose_host(h, profile)
    assert any(c.name.startswith("GPU memory held") and "pid 999" in c.detail for c in diag.checks)


def _cli(h: FakeHost, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
         *args: str) -> tuple[int, str, str]:
    """`ddtree-ops diagnose ct129 ARGS` with the SSH layer's connect handing over the fake host."""
    from contextlib import contextmanager

    import ddtree_ops.cli._common as common
    from ddtree_ops.cli.app import main

    @contextmanager
    def fake_connect(p: Any, ssh_config: Any) -> Any:
        yield h

    monkeypatch.setattr(common, "connect", fake_connect)
    with pytest.raises(SystemExit) as exc:
        main(["diagnose", "ct129", *args])
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out, out.err


def test_cli_host_uses_the_ssh_layer(profile: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(_host(profile, "synthetic-cuda_oom-nested-in-capture.log"), monkeypatch, capsys, "--json")
    doc = json.loads(out)
    assert code == 2
    assert doc["root_cause"]["label"] == "cuda_oom" and doc["unit"]["NRestarts" if False else "restarts"] == 2
    assert doc["schema_version"] == 1 and any(c["name"].startswith("DDTREE") for c in doc["checks"])


def test_cli_host_unreachable_exits_3(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import ddtree_ops.cli._common as common
    from ddtree_ops.cli.app import main
    from ddtree_ops.host import HostUnreachable

    def refuse(p: Any, ssh_config: Any) -> Any:
        raise HostUnreachable("cannot connect to ct129:22 (connection refused)")

    monkeypatch.setattr(common, "connect", refuse)
    with pytest.raises(SystemExit) as exc:
        main(["diagnose", "ct129"])
    assert exc.value.code == 3 and "connection refused" in capsys.readouterr().err


REAL = FIXTURES.parents[1] / "data" / "real-sglang" / "0.5.17"


def _entries(lines: list[bytes], inv: str, t0: int, systemd: bool = False) -> list[str]:
    out = []
    for i, ln in enumerate(lines):
        e: dict[str, Any] = {"MESSAGE": ln.decode("utf-8", "replace"), "__REALTIME_TIMESTAMP": str(t0 + i * 1000)}
        e.update({"INVOCATION_ID": inv, "UNIT": "sglang.service", "_PID": "1"} if systemd else
                 {"_SYSTEMD_INVOCATION_ID": inv, "_PID": "41231"})
        out.append(json.dumps(e))
    return out


def test_a_previous_start_stopped_by_systemd_reads_healthy(profile: Any) -> None:
    """Real SGLang 0.5.17 served, then systemd stopped it (SIGTERM to the control group): SGLang
    then logs its scheduler as crashed with exit code -15 and a SIGQUIT. That start was healthy."""
    h = _host(profile, "synthetic-healthy-full-startup.log", unit_result="success")
    old = "00000000stopped"
    lines = raw_lines(REAL / "1_base_graph.log")
    stop_at = next(i for i, ln in enumerate(lines) if b"SIGTERM received" in ln)
    journal = [*_entries(lines[:stop_at], old, 1766000000000000),
               *_entries([b"Stopping sglang.service - SGLang server..."], old, 1766000100000000, systemd=True),
               *_entries(lines[stop_at:], old, 1766000100001000),
               *_entries([b"sglang.service: Deactivated successfully.", b"Stopped sglang.service - SGLang server."],
                         old, 1766000200000000, systemd=True),
               *b"\n".join(as_journal_json(raw_lines(FIXTURES / "synthetic-healthy-full-startup.log"))).decode().splitlines()]
    h.on(live.cmd_journal_recent(profile.service.unit), "\n".join(journal))
    diag = live.diagnose_host(h, profile)
    prev = [i for i in diag.previous if i.invocation == old]
    assert prev and prev[0].report.verdict == "healthy" and prev[0].report.root_cause is None
    rep = diag.combined()
    assert not any(f.rule_id == "previous_start_failed" for f in rep.findings)


def test_a_previous_start_that_crashed_without_a_stop_is_still_named(profile: Any) -> None:
    """The same real log with its stop taken away: the scheduler dying after ready is a crash."""
    h = _host(profile, "synthetic-healthy-full-startup.log", unit_result="success")
    old = "00000000crashed"
    lines = [ln for ln in raw_lines(REAL / "1_base_graph.log") if b"SIGTERM received" not in ln]
    journal = [*_entries(lines, old, 1766000000000000),
               *b"\n".join(as_journal_json(raw_lines(FIXTURES / "synthetic-healthy-full-startup.log"))).decode().splitlines()]
    h.on(live.cmd_journal_recent(profile.service.unit), "\n".join(journal))
    diag = live.diagnose_host(h, profile)
    prev = [i for i in diag.previous if i.invocation == old]
    assert prev and prev[0].report.verdict == "failed"
    assert any(f.rule_id == "previous_start_failed" for f in diag.combined().findings)


@pytest.mark.parametrize("ids, status", [([0, 2], "ok"), ([1, 3], "fail"), ([0, 4], "fail")])
def test_last_target_layer_is_refused_before_anything_changes(profile: Any, ids: list[int], status: str) -> None:
    """Qwen3 captures the hidden state before layer id+1: on a 4-layer target id 3 is never captured
    (real SGLang 0.5.17 died at the first request with exactly this draft)."""
    h = _host(profile, "synthetic-healthy-full-startup.log",
              draft_cfg={"architectures": ["DFlashDraftModel"], "num_hidden_layers": 1,
                         "dflash_config": {"target_layer_ids": ids}})
    h.files[f"{profile.service.model_path}/config.json"] = json.dumps(
        {"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 4}).encode()
    diag = live.diagnose_host(h, profile)
    check = next(c for c in diag.checks if c.name == "draft target_layer_ids")
    assert check.status == status, check
    if status == "fail":
        f = next(f for f in diag.extra if f.rule_id == "check_spec_decode_misconfig")
        assert f.severity == "fatal" and "outside what the target captures" in check.detail
    # diagnose only reads: it ran no command that changes the host
    assert not any(c[:2] in (("systemctl", "restart"), ("systemctl", "start"), ("systemctl", "stop")) for c in h.calls)


# ------------------------------------------------------------------ issue 20: verdicts from what was read


def _kill_host(profile: Any, kernel: str) -> FakeHost:
    h = _host(profile, "synthetic-healthy-full-startup.log")
    lines = [*raw_lines(FIXTURES / "synthetic-healthy-full-startup.log"),
             b"[2026-01-10 09:01:02] Subprocess scheduler_0 (pid=41300) crashed with exit code -9. Triggering SIGQUIT for cleanup..."]
    journal = b"\n".join(as_journal_json(lines)).decode()
    h.on(live.cmd_journal_recent(profile.service.unit), journal)
    h.on(live.cmd_journal_invocation(profile.service.unit, INV), journal)
    h.on(live.cmd_kernel_since(1767000000), kernel)
    return h


def test_a_sigkill_is_host_oom_only_when_the_kernel_log_says_so(profile: Any) -> None:
    quiet = live.diagnose_host(_kill_host(profile, ""), profile).combined()
    assert quiet.root_cause is not None and quiet.root_cause.label == "killed_by_signal"
    oom = ("2026-01-10T09:01:01+0000 ct129 kernel: python invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE)\n"
           "2026-01-10T09:01:02+0000 ct129 kernel: Out of memory: Killed process 41300 (python) total-vm:78521468kB\n")
    rep = live.diagnose_host(_kill_host(profile, oom), profile).combined()
    assert rep.root_cause is not None and rep.root_cause.label == "host_oom"
    assert "Killed process 41300" in rep.root_cause.text and "exit code -9" in rep.root_cause.context


def test_the_kernel_log_is_read_through_the_host_as_a_command(profile: Any) -> None:
    h = _kill_host(profile, "")
    live.diagnose_host(h, profile)
    assert tuple(live.cmd_kernel_since(1767000000)) in h.calls and live.cmd_kernel_since(1767000000)[:2] == ["journalctl", "-k"]


def _nothing_host(profile: Any, systemctl: tuple[str, int, str]) -> FakeHost:
    """A host where systemd and journald answer nothing (the local transport on a machine without
    systemd: `diagnose h200` once printed HEALTHY with 0 lines read)."""
    h = FakeHost(name="h200")
    h.on(live.cmd_unit_state(profile.service.unit), systemctl[0], rc=systemctl[1], stderr=systemctl[2])
    return h


@pytest.mark.parametrize("systemctl", [
    ("", 127, "systemctl: command not found"),
    ("", 1, "System has not been booted with systemd as init system (PID 1). Can't operate."),
    ("LoadState=not-found\nActiveState=inactive\nSubState=dead\nResult=success\n", 0, ""),
])
def test_a_diagnosis_that_read_nothing_says_so(profile: Any, systemctl: tuple[str, int, str]) -> None:
    diag = live.diagnose_host(_nothing_host(profile, systemctl), profile)
    rep = diag.combined()
    assert diag.unreadable and rep.verdict == "unreadable" and rep.root_cause is None
    from ddtree_ops.diagnose import report as rpt

    assert rpt.exit_code(rep.verdict) == 3


def test_cli_exits_3_when_nothing_could_be_read(profile: Any, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from contextlib import contextmanager

    import ddtree_ops.cli._common as common
    from ddtree_ops.cli.app import main

    h = _nothing_host(profile, ("", 1, "System has not been booted with systemd as init system (PID 1). Can't operate."))

    @contextmanager
    def fake_connect(p: Any, ssh_config: Any) -> Any:
        yield h

    monkeypatch.setattr(common, "connect", fake_connect)
    with pytest.raises(SystemExit) as exc:
        main(["diagnose", "ct129"])
    err = capsys.readouterr().err
    assert exc.value.code == 3 and "HEALTHY" not in err and "could not read" in err


def test_an_unreadable_journal_beside_a_known_unit_is_not_healthy(profile: Any) -> None:
    h = _host(profile, "synthetic-healthy-full-startup.log", unit_result="success")
    h.on(live.cmd_unit_state(profile.service.unit), f"Result=success\nExecMainStatus=0\nNRestarts=0\nInvocationID={INV}\n"
                                                    "ActiveState=active\nSubState=running\nMainPID=41231\nLoadState=loaded\n")
    h.on(live.cmd_journal_recent(profile.service.unit), "")
    h.on(live.cmd_journal_invocation(profile.service.unit, INV), "")
    diag = live.diagnose_host(h, profile)
    rep = diag.combined()
    # nothing read shows it serves and the health endpoint does not answer: no verdict, exit 3
    assert not diag.unreadable and rep.verdict == "inconclusive" and rep.serving is None
    assert any(f.rule_id == "journal_unreadable" for f in rep.findings)
    h.health = 200
    rep = live.diagnose_host(h, profile).combined()
    # the health endpoint answers: serving, with the warning that the journal could not be read
    assert rep.verdict == "degraded" and rep.serving == (0, "health endpoint")


def _serving_now(profile: Any, fixture: str = "synthetic-healthy-full-startup.log") -> FakeHost:
    h = _host(profile, fixture, unit_result="success")
    h.on(live.cmd_unit_state(profile.service.unit), f"Result=success\nExecMainStatus=0\nNRestarts=0\nInvocationID={INV}\n"
                                                    "ActiveState=active\nSubState=running\nMainPID=41231\nLoadState=loaded\n")
    return h


def test_a_host_serving_healthy_after_a_failed_start_is_healthy_and_names_that_start(
        profile: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 32: after a rolled-back deploy the host serves its known-good release; the failed start
    is the one before. HEALTHY, exit 0, and it says why that start failed (DEGRADED is the deploy
    contract's word for "not serving")."""
    h = _serving_now(profile)
    h.health = 200
    diag = live.diagnose_host(h, profile)
    rep = diag.combined()
    assert rep.verdict == "healthy" and rep.root_cause is None
    assert diag.previous[-1].report.root_cause.label == "kv_pool_too_small"  # the canned earlier start
    assert ("http", "GET", "/health_generate") not in h.calls  # the journal shows it serves: no probe needed

    code, out, _ = _cli(h, monkeypatch, capsys, "--json")
    doc = json.loads(out)
    assert (code, doc["exit_code"], doc["verdict"], doc["command"]) == (0, 0, "healthy", "diagnose")
    assert doc["previous_start_failed"]["label"] == "kv_pool_too_small"
    code, _, err = _cli(h, monkeypatch, capsys)
    assert code == 0 and "HEALTHY: the previous start failed: kv_pool_too_small" in err
    assert "DEGRADED" not in err and "RAISE memory.mem_fraction_static" in err


def test_the_health_endpoint_is_the_evidence_when_the_journal_shows_none(profile: Any) -> None:
    """A journal cut before its ready line (rotated, rate-limited): the live reader asks the health
    endpoint, as the gate does; a host that does not answer stays inconclusive."""
    h = _serving_now(profile, "synthetic-kv_pool_too_small-weights-leave-no-memory.log")
    fragment = [json.dumps({"MESSAGE": "[2026-01-10 09:00:02 TP0] Load weight begin. avail mem=47.10 GB",
                            "_SYSTEMD_INVOCATION_ID": INV, "__REALTIME_TIMESTAMP": "1767000000000000"})]
    h.on(live.cmd_journal_invocation(profile.service.unit, INV), "\n".join(fragment))
    assert live.diagnose_host(h, profile).combined().verdict == "inconclusive"
    h.health = 503
    diag = live.diagnose_host(h, profile)
    assert diag.combined().verdict == "inconclusive" and diag.health == (503, "/health_generate answered 503")
    h.health = 200
    diag = live.diagnose_host(h, profile)
    assert diag.combined().verdict == "healthy" and ("http", "GET", "/health_generate") in h.calls
    assert any(c.name == "health endpoint" and c.status == "ok" for c in diag.checks)


def _gpu_host(profile: Any, fixture: str) -> FakeHost:
    return _host(profile, fixture, smi=("0, GPU-1, NVIDIA H200, 143771, 0, 143771, 9.0, 580.95.05", 0, ""))


def test_cards_the_host_lacks_are_named_against_the_profile(profile: Any) -> None:
    from ddtree_ops.profile import GpuCard

    one = profile.model_copy(update={"gpus": [GpuCard(index=1)]})
    rc = live.diagnose_host(_gpu_host(one, "synthetic-bad_launch_flags-no-accelerator-gpus-1.log"), one).combined().root_cause
    assert rc is not None and rc.label == "bad_launch_flags" and rc.profile_key == "gpus"
    assert "gpus [1]" in rc.meaning and "0: NVIDIA H200" in rc.meaning
    assert "gpus lists [1]" in rc.remedy and "gpus: [0]" in rc.remedy and "nvidia-smi -L" in rc.remedy


def test_more_ranks_than_cards_names_tp_size(profile: Any) -> None:
    from ddtree_ops.profile import GpuCard, ParallelSection

    two = profile.model_copy(update={"gpus": [GpuCard(index=0), GpuCard(index=1)], "parallel": ParallelSection(tp_size=2)})
    rc = live.diagnose_host(_gpu_host(two, "synthetic-bad_launch_flags-invalid-ordinal-tp2.log"), two).combined().root_cause
    assert rc is not None and "parallel.tp_size" in rc.remedy and "to 1 or less" in rc.remedy
    assert "tp_size 2" in rc.meaning and "1 card(s)" in rc.meaning


def test_a_local_host_without_the_unit_reads_as_unreadable(profile: Any) -> None:
    """The real case through the real local transport: this machine has no such unit (and, where
    it runs without systemd as PID 1, no systemd at all); `diagnose` must not call it healthy."""
    from ddtree_ops.local import LocalHost

    svc = profile.service.model_copy(update={"unit": "ddtree-ops-test-never-installed.service"})
    local = profile.model_copy(update={"service": svc})
    diag = live.diagnose_host(LocalHost("localhost"), local, "nextn")
    assert diag.unreadable and diag.combined().verdict == "unreadable"
