"""Timer/service units and the cron line: rendered text, systemd's own verifier, real flock."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from ddtree_ops import schedule
from ddtree_ops.errors import UsageError
from ddtree_ops.host import Result

DDTREE_OPS = str(Path(sys.executable).parent / "ddtree-ops")
needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")


def spec(**kw: Any) -> schedule.Spec:
    base: dict[str, Any] = {"every": schedule.parse_every("5m"), "executable": DDTREE_OPS, "user": "root",
                            "profiles_dir": "/work/main/profiles"}
    return schedule.Spec(**{**base, **kw})


def directives(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            k, _, v = line.partition("=")
            out.setdefault(k, []).append(v)
    return out


@pytest.mark.parametrize("text, seconds, cal, cron", [
    ("5m", 300, "*-*-* *:0/5:00", "*/5 * * * *"),
    ("1m", 60, "*-*-* *:0/1:00", "* * * * *"),
    ("15", 900, "*-*-* *:0/15:00", "*/15 * * * *"),
    ("30s", 30, "*-*-* *:*:0/30", None),
    ("1h", 3600, "*-*-* 0/1:00:00", "0 * * * *"),
    ("60m", 3600, "*-*-* 0/1:00:00", "0 * * * *"),
    ("6h", 21600, "*-*-* 0/6:00:00", "0 */6 * * *"),
])
def test_every(text: str, seconds: int, cal: str, cron: str | None) -> None:
    e = schedule.parse_every(text)
    assert (e.seconds, e.on_calendar) == (seconds, cal)
    if cron is None:
        with pytest.raises(UsageError, match="smallest step is one minute"):
            _ = e.cron
    else:
        assert e.cron == cron


@pytest.mark.parametrize("text", ["7m", "90s", "5s", "0m", "5 minutes", "", "5d", "25h"])
def test_every_refuses_uneven_or_silly_periods(text: str) -> None:
    with pytest.raises(UsageError):
        schedule.parse_every(text)


@needs_analyze
@pytest.mark.parametrize("every", ["5m", "30s", "2h"])
def test_on_calendar_fires_every_period(every: str) -> None:
    """systemd's own parser says when the expression elapses: evenly, one period apart."""
    e = schedule.parse_every(every)
    out = subprocess.run(["systemd-analyze", "calendar", "--iterations=4", e.on_calendar],
                         capture_output=True, text=True, check=True).stdout
    stamps = [datetime.strptime(m, "%a %Y-%m-%d %H:%M:%S") for m in
              re.findall(r"(?:Next elapse|Iter\. #\d+): (\w{3} \d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", out)]
    assert len(stamps) == 4, out
    assert {(b - a).total_seconds() for a, b in zip(stamps, stamps[1:])} == {e.seconds}


def test_timer_and_service_text() -> None:
    s = spec(hosts=("ct129", "ct200"), prom_file="/var/lib/node exporter/ddtree.prom", ping_url="https://hc/x%y")
    timer, service = directives(schedule.render_timer(s)), directives(schedule.render_service(s))
    assert timer["OnCalendar"] == ["*-*-* *:0/5:00"]
    assert timer["Persistent"] == ["true"]
    assert timer["RandomizedDelaySec"] == ["30s"]
    assert timer["Unit"] == ["ddtree-smoke.service"]
    assert timer["WantedBy"] == ["timers.target"]
    assert service["Type"] == ["oneshot"]
    assert service["StandardOutput"] == ["journal"]
    assert service["ExecStart"] == [f'{DDTREE_OPS} smoke ct129 ct200 --prom-file "/var/lib/node exporter/ddtree.prom"'
                                    ' --ping-url "https://hc/x%%y"']
    assert service["Environment"] == ['"DDTREE_OPS_PROFILES=/work/main/profiles"']
    assert "PrivateDevices" not in service


@needs_analyze
@pytest.mark.parametrize("kw", [
    {},
    {"hosts": ("ct129",), "prom_file": "/var/lib/node exporter/ddtree.prom", "ping_url": "https://hc-ping.com/a%b",
     "ssh_config": "/home/op/.ssh/lab config"},
    {"every": schedule.parse_every("30s"), "user": "ddtree-operator"},
])
def test_units_pass_systemd_analyze_verify(kw: dict[str, Any]) -> None:
    assert schedule.verify(schedule.units(spec(**kw))) == []


@needs_analyze
def test_verify_reports_problems_in_our_units() -> None:
    """The verifier is only worth something if it can fail: a misspelt key must be reported."""
    broken = schedule.render_timer(spec()).replace("Persistent=true", "Persistant=true")
    problems = schedule.verify({schedule.SERVICE: schedule.render_service(spec()), schedule.TIMER: broken})
    assert any("Persistant" in p for p in problems), problems
    missing = schedule.render_service(spec(executable="/nonexistent/ddtree-ops"))
    problems = schedule.verify({schedule.SERVICE: missing, schedule.TIMER: schedule.render_timer(spec())})
    assert any("/nonexistent/ddtree-ops" in p for p in problems), problems


def test_cron_line_is_flock_wrapped() -> None:
    line = schedule.cron_line(spec(ping_url="https://hc/x%y"))
    fields = line.split(" ", 5)
    assert fields[:5] == ["*/5", "*", "*", "*", "*"]
    assert "flock -n -E 75 /run/lock/ddtree-smoke.lock env DDTREE_OPS_PROFILES=/work/main/profiles" in line
    assert f"{DDTREE_OPS} smoke --all --ping-url https://hc/x\\%y" in line
    assert "%" not in line.replace("\\%", "")  # cron would cut the line at a bare %
    assert "\n" not in line


def test_cron_wrapper_keeps_a_second_run_out_and_says_so(tmp_path: Path) -> None:
    """The crontab command itself, run by sh twice at once: the second says it skipped and exits 0."""
    stub = tmp_path / "ddtree-ops"
    stub.write_text(f"#!/bin/sh\ntouch {tmp_path}/started\nsleep 2\necho DDTREE-SMOKE OK - stub\nexit 1\n")
    stub.chmod(0o755)
    logger = tmp_path / "bin" / "logger"
    logger.parent.mkdir()
    logger.write_text(f'#!/bin/sh\ncat >> "{tmp_path}/log.$$"\n')
    logger.chmod(0o755)
    command = schedule.cron_line(spec(executable=str(stub), lock=str(tmp_path / "smoke.lock"))).split(" ", 5)[5]
    env = {**os.environ, "PATH": f"{logger.parent}:{os.environ['PATH']}"}
    first = subprocess.Popen(["sh", "-c", command + "; echo rc=$? >> " + str(tmp_path / "rc1")], env=env)
    deadline = time.monotonic() + 10
    while not (tmp_path / "started").exists():
        assert time.monotonic() < deadline, "the first run never started"
        time.sleep(0.02)
    second = subprocess.run(["sh", "-c", command], env=env, timeout=30)
    first.wait(timeout=30)
    logs = sorted(p.read_text() for p in tmp_path.glob("log.*"))
    assert second.returncode == 0
    assert any(f"skipped: another smoke run holds {tmp_path}/smoke.lock" in log for log in logs), logs
    assert any("DDTREE-SMOKE OK - stub" in log for log in logs), logs


def test_install_plan_is_data() -> None:
    p = schedule.plan(spec())
    assert [f for f, _ in p.files] == ["/etc/systemd/system/ddtree-smoke.service",
                                       "/etc/systemd/system/ddtree-smoke.timer"]
    assert p.commands == (("systemctl", "daemon-reload"), ("systemctl", "enable", "--now", "ddtree-smoke.timer"))
    assert schedule.plan(spec(), root="/srv/stage").commands == ()


class RecordingHost:
    name = "fake"

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def run(self, argv: Any, **kw: Any) -> Result:
        self.calls.append(("run", tuple(argv)))
        return Result(tuple(argv), 0, "", "")

    def put(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        self.calls.append(("put", path, mode))


def test_apply_writes_beside_then_renames_then_enables() -> None:
    host = RecordingHost()
    schedule.apply(schedule.plan(spec()), host)  # type: ignore[arg-type]
    svc = "/etc/systemd/system/ddtree-smoke.service"
    assert host.calls[:3] == [("run", ("mkdir", "-p", "-m", "0755", "--", "/etc/systemd/system")),
                              ("put", svc + ".ddtree-new", 0o644),
                              ("run", ("mv", "-f", "-T", "--", svc + ".ddtree-new", svc))]
    assert host.calls[-2:] == [("run", ("systemctl", "daemon-reload")),
                               ("run", ("systemctl", "enable", "--now", "ddtree-smoke.timer"))]


def test_cli_install_root_writes_what_print_shows(tmp_path: Path) -> None:
    env = {**os.environ, "NO_COLOR": "1"}
    got = subprocess.run([DDTREE_OPS, "schedule", "install", "--root", str(tmp_path), "--every", "10m",
                          "--hosts", "ct129"], capture_output=True, text=True, env=env, timeout=60)
    assert got.returncode == 0, got.stderr
    shown = subprocess.run([DDTREE_OPS, "schedule", "print", "--every", "10m", "--hosts", "ct129"],
                           capture_output=True, text=True, env=env, timeout=60).stdout
    for name in (schedule.SERVICE, schedule.TIMER):
        text = (tmp_path / "etc/systemd/system" / name).read_text()
        assert text in shown
    assert "OnCalendar=*-*-* *:0/10:00" in (tmp_path / "etc/systemd/system/ddtree-smoke.timer").read_text()


@pytest.mark.skipif(os.path.isdir("/run/systemd/system"), reason="this machine runs systemd: install would work")
def test_cli_install_without_systemd_fails_clearly() -> None:
    got = subprocess.run([DDTREE_OPS, "schedule", "install"], capture_output=True, text=True,
                         env={**os.environ, "NO_COLOR": "1"}, timeout=60)
    assert got.returncode == 3
    assert "does not run systemd as PID 1" in got.stderr
    assert "schedule print --cron" in got.stderr
    assert got.stdout == ""


def test_cli_usage_errors_exit_64() -> None:
    for args in (["print", "--every", "7m"], ["print", "--hosts", "nosuch"], ["print", "--cron", "--every", "30s"]):
        got = subprocess.run([DDTREE_OPS, "schedule", *args], capture_output=True, text=True, timeout=60)
        assert got.returncode == 64, (args, got.stderr)
