"""Remote actions are data: the argv each step runs, and the parsers over what hosts print."""

from __future__ import annotations

import json

from ddtree_ops import remote
import pytest

from ddtree_ops.gate import read_frame, watch_argv
from ddtree_ops.host import HostUnreachable
from ddtree_ops.observe import parse_cursor, parse_journal_json, parse_systemctl_show


def test_install_and_restart_commands() -> None:
    assert remote.rename("/etc/systemd/system/sglang.service.ddtree-new", "/etc/systemd/system/sglang.service") == [
        "mv", "-f", "-T", "--", "/etc/systemd/system/sglang.service.ddtree-new", "/etc/systemd/system/sglang.service"]
    assert remote.daemon_reload() == ["systemctl", "daemon-reload"]
    assert remote.reset_failed("sglang.service") == ["systemctl", "reset-failed", "--", "sglang.service"]
    assert remote.restart("sglang.service") == [
        "sh", "-c", 'systemctl stop -- "$1"; systemctl start --no-block -- "$1"', "sh", "sglang.service"]
    assert remote.mkdir_lock("/var/lib/ddtree-ops/sglang/lock") == ["mkdir", "--", "/var/lib/ddtree-ops/sglang/lock"]
    assert remote.pip_install("/opt/v/bin/python", "/tmp/x.whl")[:6] == [
        "/opt/v/bin/python", "-m", "pip", "install", "--no-deps", "--no-index"]


def test_journal_reads_are_scoped() -> None:
    after = remote.journal_after("sglang.service", "s=abc;i=1")
    assert after[:3] == ["journalctl", "--unit", "sglang.service"]
    assert after[-2:] == ["--after-cursor", "s=abc;i=1"]
    assert "--output" in after and after[after.index("--output") + 1] == "json"
    assert remote.journal_cursor("u.service")[-3:] == ["--show-cursor", "--no-pager", "--quiet"]
    inv = remote.journal_invocation("u.service", "f00")
    assert "_SYSTEMD_INVOCATION_ID=f00" in inv and "INVOCATION_ID=f00" in inv


def test_append_line_survives_shell_metacharacters() -> None:
    argv = remote.append_line("/var/log/a", "it's $HOME `x` \"y\"")
    assert argv[:2] == ["sh", "-c"] and argv[4] == "it's $HOME `x` \"y\""  # passed as $1, never spliced
    assert "$HOME" not in argv[2]


def test_parse_systemctl_show() -> None:
    u = parse_systemctl_show("ActiveState=active\nSubState=running\nResult=success\nExecMainStatus=0\n"
                             "MainPID=4242\nNRestarts=2\nInvocationID=abc\nLoadState=loaded\nDropInPaths=\n")
    assert u.running and not u.failed and u.main_pid == 4242 and u.restarts == 2 and u.invocation == "abc"
    failed = parse_systemctl_show("ActiveState=activating\nSubState=auto-restart\nResult=exit-code\nLoadState=loaded")
    assert failed.failed
    assert not parse_systemctl_show("LoadState=not-found\nActiveState=inactive").exists


def test_parse_journal_json_handles_byte_arrays_and_multiline() -> None:
    lines = [
        json.dumps({"MESSAGE": "plain line", "__CURSOR": "c1", "_SYSTEMD_INVOCATION_ID": "i1", "_PID": "7"}),
        json.dumps({"MESSAGE": list("caf\xe9 ok".encode("latin-1")), "__CURSOR": "c2"}),
        json.dumps({"MESSAGE": "Traceback (most recent call last):\n  File \"x\"", "__CURSOR": "c3"}),
        "not json at all",
    ]
    out = parse_journal_json("\n".join(lines))
    assert [ln.message for ln in out] == ["plain line", "caf\ufffd ok", "Traceback (most recent call last):", '  File "x"']
    assert out[0].invocation == "i1" and out[0].pid == 7 and out[-1].cursor == "c3"


def test_parse_cursor() -> None:
    assert parse_cursor("-- cursor: s=1;i=2;b=3\n") == "s=1;i=2;b=3"
    assert parse_cursor("") is None


class _Lines:
    def __init__(self, text: str) -> None:
        self.lines = text.split("\n")[:-1]  # not splitlines(): it also splits at \\x1d and \\x1e

    def readline(self, timeout: float) -> str | None:
        return self.lines.pop(0) if self.lines else None


def test_gate_watcher_frames_parse_into_unit_state_and_journal_lines() -> None:
    frames = ("ActiveState=active\nSubState=running\nLoadState=loaded\nInvocationID=i1\n\x1e\n"
              + json.dumps({"MESSAGE": "hello", "__CURSOR": "k", "_SYSTEMD_INVOCATION_ID": "i1"}) + "\n\x1d\n"
              + "ActiveState=failed\nSubState=failed\nLoadState=loaded\n\x1e\n\x1d\n")
    watch = _Lines(frames)
    unit, lines = read_frame(watch, timeout=1)
    assert unit.running and unit.invocation == "i1" and [ln.message for ln in lines] == ["hello"]
    unit, lines = read_frame(watch, timeout=1)
    assert unit.failed and lines == []
    with pytest.raises(HostUnreachable):
        read_frame(watch, timeout=1)


def test_gate_watcher_script_passes_everything_as_arguments() -> None:
    argv = watch_argv("sglang.service", "s=a b;c", 0.25)
    assert argv[:2] == ["sh", "-c"] and argv[3:7] == ["sh", "sglang.service", "0.25", "s=a b;c"]
    assert "sglang.service" not in argv[2]  # nothing spliced into the script text
