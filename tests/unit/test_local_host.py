"""The local transport: the same Host contract as SSH, on this machine, with real processes and HTTP."""

from __future__ import annotations

import http.server
import json
import shutil
import threading
from pathlib import Path
from typing import Iterator

import pytest

from ddtree_ops.errors import ProfileError
from ddtree_ops.host import Host, HttpUnavailable, RemoteTimeout
from ddtree_ops.local import LocalHost
from ddtree_ops.profile import load_profile
from ddtree_ops.transport import connect

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def server() -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            out = json.dumps({"echo": body, "ctype": self.headers["Content-Type"]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()


def test_run_keeps_argv_unquoted_and_reports_exit_codes() -> None:
    h = LocalHost("here")
    assert isinstance(h, Host)
    res = h.run(["printf", "%s|", "a b", "$HOME", "it's"])
    assert res.ok and res.stdout == "a b|$HOME|it's|"            # no shell saw these words
    assert h.run(["sh", "-c", "echo oops >&2; exit 3"]).rc == 3
    assert h.run(["cat"], stdin=b"in").stdout == "in"
    assert h.run(["no-such-command-here"]).rc == 127
    with pytest.raises(RemoteTimeout):
        h.run(["sleep", "5"], timeout=0.2)


def test_put_writes_mode_and_get_reads_back(tmp_path: Path) -> None:
    h = LocalHost("here")
    path = tmp_path / "env"
    h.put(str(path), b"TOKEN=x\n", mode=0o600)
    assert path.stat().st_mode & 0o777 == 0o600
    assert h.get(str(path)) == b"TOKEN=x\n"
    assert h.get(str(tmp_path / "missing")) is None


def test_http_to_loopback_and_a_closed_port(server: int) -> None:
    h = LocalHost("here")
    resp = h.http("POST", server, "/generate", body={"text": "hi"})
    assert resp.status == 200 and resp.json() == {"echo": {"text": "hi"}, "ctype": "application/json"}
    with pytest.raises(HttpUnavailable):
        h.http("GET", 1, "/health", timeout=1)


def test_stream_reads_lines_as_they_come_and_stops_the_command() -> None:
    h = LocalHost("here")
    with h.stream(["sh", "-c", "echo one; sleep 0.2; echo two; sleep 30"]) as lines:
        assert lines.readline(5) == "one"
        assert lines.readline(5) == "two"
        with pytest.raises(RemoteTimeout):
            lines.readline(0.2)


@pytest.fixture
def profiles(tmp_path: Path) -> Path:
    d = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", d)
    return d


def test_profile_picks_the_transport(profiles: Path) -> None:
    text = (profiles / "ct200.yaml").read_text().replace("  ssh_host: ct200\n", "  transport: local\n")
    (profiles / "ct200.yaml").write_text(text)
    p = load_profile("ct200", directory=profiles)
    assert p.host.transport == "local" and p.host.ssh_host is None
    with connect(p) as h:
        assert isinstance(h, LocalHost) and h.run(["true"]).ok


def test_ssh_transport_needs_an_ssh_host(profiles: Path) -> None:
    text = (profiles / "ct200.yaml").read_text().replace("  ssh_host: ct200\n", "  sudo: false\n")
    (profiles / "ct200.yaml").write_text(text)
    with pytest.raises(ProfileError) as exc:
        load_profile("ct200", directory=profiles)
    assert any("host.ssh_host: required when host.transport is ssh" in m for m in exc.value.problems)


def test_extra_args_cannot_say_a_rendered_flag_twice(profiles: Path) -> None:
    from ddtree_ops.render import launch_argv

    p = load_profile("ct200", directory=profiles, overrides=['service.extra_args=["--load-format", "dummy"]'])
    assert launch_argv(p, "dflash")[-2:] == ["--load-format", "dummy"]
    with pytest.raises(ProfileError) as exc:
        load_profile("ct200", directory=profiles, overrides=['service.extra_args=["--port=1"]'])
    assert any("service.extra_args.0: --port is rendered from service.port" in m for m in exc.value.problems)
