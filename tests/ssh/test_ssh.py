"""The SSH layer against a real sshd: ssh_config resolution, host keys, ProxyJump, files, HTTP."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from ddtree_ops.host import HostKeyError, HostUnreachable, HttpUnavailable
from ddtree_ops.profile import load_profile
from ddtree_ops.ssh import connect, resolve




def _profile(alias: str = "target", policy: str = "accept-new"):
    return load_profile("ct129", overrides=[f"host.ssh_host={alias}", f"host.host_key_policy={policy}"])


def test_resolves_ssh_config_like_openssh(sshd: Any) -> None:
    cfg = sshd.ssh_config()
    ep = resolve("jumped", config_path=cfg)
    assert (ep.hostname, ep.port, ep.user) == ("127.0.0.1", sshd.port, "root")
    assert [j.alias for j in ep.jumps] == ["target"]
    assert ep.identity_files == (str(sshd.client_key),)


def test_accept_new_records_the_key_then_runs_commands(sshd: Any, tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    cfg = sshd.ssh_config(known_hosts=kh)
    with connect(_profile(), ssh_config=str(cfg)) as host:
        res = host.run(["sh", "-c", 'printf "%s|" "$@"; echo; exit 3', "sh", "a b", "$HOME", "it's"])
    assert res.rc == 3
    assert res.stdout.strip() == "a b|$HOME|it's|"  # quoting survives the remote shell
    assert sshd.host_pub in kh.read_text()  # accept-new wrote the key
    # the second connection verifies against the recorded key
    with connect(_profile(), ssh_config=str(cfg)) as host:
        assert host.run(["true"]).ok


def test_strict_refuses_an_unknown_key(sshd: Any, tmp_path: Path) -> None:
    cfg = sshd.ssh_config(known_hosts=tmp_path / "empty_known_hosts")
    with pytest.raises(HostKeyError, match="no known host key"):
        connect(_profile(policy="strict"), ssh_config=str(cfg))
    assert not (tmp_path / "empty_known_hosts").exists()


def test_changed_host_key_is_always_refused(sshd: Any, tmp_path: Path) -> None:
    import paramiko

    other = paramiko.Ed25519Key.from_private_key_file(str(sshd.client_key))  # any other ed25519 key
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{sshd.port} ssh-ed25519 {other.get_base64()}\n")
    cfg = sshd.ssh_config(known_hosts=kh)
    with pytest.raises(HostKeyError, match="HOST KEY CHANGED"):
        connect(_profile(), ssh_config=str(cfg))
    assert kh.read_text().count("\n") == 1  # nothing was silently replaced


def test_proxyjump_chain(sshd: Any, tmp_path: Path) -> None:
    cfg = sshd.ssh_config(known_hosts=tmp_path / "kh")
    with connect(_profile("jumped"), ssh_config=str(cfg)) as host:
        assert host.run(["echo", "through the jump"]).stdout == "through the jump\n"


def test_more_commands_at_once_than_sshd_allows_sessions_wait_for_one(sshd: Any, tmp_path: Path) -> None:
    """OpenSSH allows 10 sessions on one connection (MaxSessions): the 11th to 14th wait for a slot
    instead of failing as a lost connection (make test run 27: a fleet preflight refused a host)."""
    cfg = sshd.ssh_config(known_hosts=tmp_path / "known_hosts")
    results: list[object] = []
    with connect(_profile(), ssh_config=str(cfg)) as host:
        def one() -> None:
            try:
                results.append(host.run(["sleep", "1"], timeout=30).rc)
            except Exception as exc:  # noqa: BLE001 (the test reports what a thread raised)
                results.append(exc)
        threads = [threading.Thread(target=one) for _ in range(14)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results == [0] * 14, results


def test_put_get_and_missing_file(sshd: Any, tmp_path: Path) -> None:
    cfg = sshd.ssh_config(known_hosts=tmp_path / "kh")
    target = tmp_path / "remote" / "unit.service"
    target.parent.mkdir()
    with connect(_profile(), ssh_config=str(cfg)) as host:
        host.put(str(target), b"[Unit]\n\x00binary\xff", mode=0o600)
        assert host.get(str(target)) == b"[Unit]\n\x00binary\xff"
        assert host.get(str(tmp_path / "absent")) is None
    assert target.stat().st_mode & 0o777 == 0o600


def test_http_reaches_loopback_port_through_the_connection(sshd: Any, tmp_path: Path) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            out = json.dumps({"echo": body, "path": self.path}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cfg = sshd.ssh_config(known_hosts=tmp_path / "kh")
    try:
        with connect(_profile(), ssh_config=str(cfg)) as host:
            resp = host.http("POST", server.server_address[1], "/generate", body={"text": "hi"})
            assert resp.status == 200 and resp.json() == {"echo": {"text": "hi"}, "path": "/generate"}
            server.shutdown()
            server.server_close()
            with pytest.raises(HttpUnavailable):
                host.http("GET", server.server_address[1], "/health", timeout=2)
    finally:
        server.server_close()


def test_unreachable_host_is_reported_not_raised_as_traceback(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.write_text("Host nowhere\n  HostName 127.0.0.1\n  Port 1\n  ConnectTimeout 1\n")
    with pytest.raises(HostUnreachable, match="cannot connect"):
        connect(_profile("nowhere"), ssh_config=str(cfg))


def test_a_connection_dropped_mid_command_is_unreachable_not_a_failed_command(sshd: Any, tmp_path: Path) -> None:
    """The connection's sshd process dies while a command runs (the host rebooted, sshd was killed):
    the command has no result, so the caller must not read its empty output as the host's answer
    (a fleet preflight once refused a host for "no GPU visible" with empty probe output)."""
    cfg = sshd.ssh_config(known_hosts=tmp_path / "kh")
    with connect(_profile(), ssh_config=str(cfg)) as host:
        # the command's parent is the connection's own sshd process: killing it drops the connection
        with pytest.raises(HostUnreachable, match="SSH connection lost while running"):
            host.run(["sh", "-c", "kill -9 $PPID; sleep 5"], timeout=30)


def test_a_command_killed_by_a_signal_says_so(sshd: Any, tmp_path: Path) -> None:
    """sshd reports a command killed by a signal with exit-signal, which paramiko does not read: the
    result has no exit status (-1), and its stderr says why instead of being empty."""
    cfg = sshd.ssh_config(known_hosts=tmp_path / "kh")
    with connect(_profile(), ssh_config=str(cfg)) as host:
        res = host.run(["sh", "-c", "echo partial; kill -9 $$"], timeout=30)
        assert (res.rc, res.stdout) == (-1, "partial\n")
        assert "ended without an exit status" in res.stderr
        assert host.run(["true"]).ok        # the connection itself is fine


def test_a_command_that_exits_without_reading_its_input_gives_its_answer(sshd: Any, tmp_path: Path) -> None:
    """The lock's acquire script exits at once when the lock is held, without reading the record sent on
    its stdin: its exit status is the answer, not a "Socket is closed" traceback from sending the rest
    (make test run 47: the second of two deploys at once crashed with exit 1 instead of being refused)."""
    cfg = sshd.ssh_config(known_hosts=tmp_path / "kh")
    with connect(_profile(), ssh_config=str(cfg)) as host:
        res = host.run(["sh", "-c", "echo held >&2; exit 7"], stdin=b"x" * 20_000_000, timeout=60)
        assert (res.rc, res.stderr) == (7, "held\n")
        assert host.run(["true"]).ok
