"""Textfile metrics, dead-man pings and the no-overlap lock, against real files, sockets and processes."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families
from smoke_fakes import FakeHost, connector, generate_body, ok

from ddtree_ops import smoke
from ddtree_ops.host import HostUnreachable
from ddtree_ops.status import NagiosExit

DDTREE_OPS = str(Path(sys.executable).parent / "ddtree-ops")


def results(profiles: dict[str, Any], **fakes: Any) -> list[smoke.HostResult]:
    fakes = {"ct129": FakeHost(), "ct200": FakeHost(name="ct200"), **fakes}
    return smoke.check_hosts([smoke.Target(n, profiles[n]) for n in ("ct129", "ct200")], connector(fakes))


def families(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def key(host: str, mode: str = "nextn") -> tuple[tuple[str, str], ...]:
    return (("host", host), ("mode", mode))


# ------------------------------------------------------------------ textfile collector


def test_prom_file_parses_with_prometheus_client(profiles: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "ddtree.prom"
    smoke.write_prom(path, results(profiles, ct129=FakeHost(routes={"POST /generate": ok(generate_body(accept=1.0))})),
                     now=1000.0)
    fam = families(path.read_text())
    assert fam["ddtree_smoke_success"] == {key("ct129"): 0.0, key("ct200"): 1.0}
    assert fam["ddtree_smoke_state"][key("ct129")] == 2.0
    assert fam["ddtree_smoke_accept_length"][key("ct129")] == pytest.approx(1.0)
    assert fam["ddtree_smoke_latency_seconds"][key("ct200")] == pytest.approx(0.41)
    assert fam["ddtree_smoke_unit_restarts"][key("ct200")] == 0.0
    assert fam["ddtree_smoke_last_run_timestamp_seconds"][key("ct129")] == 1000.0
    assert fam["ddtree_smoke_last_success_timestamp_seconds"] == {key("ct200"): 1000.0}  # ct129 never passed
    assert oct(path.stat().st_mode & 0o777) == "0o644"  # node_exporter runs as its own user


def test_last_success_is_kept_when_a_run_fails(profiles: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "ddtree.prom"
    smoke.write_prom(path, results(profiles), now=1000.0)
    down = HostUnreachable("ct129: cannot connect")
    smoke.write_prom(path, results(profiles, ct129=down), now=2000.0)
    fam = families(path.read_text())
    # the unreachable host keeps its last mode label and its last success time
    assert fam["ddtree_smoke_last_success_timestamp_seconds"] == {key("ct129"): 1000.0, key("ct200"): 2000.0}
    assert fam["ddtree_smoke_success"][key("ct129")] == 0.0
    assert fam["ddtree_smoke_state"][key("ct129")] == 3.0
    assert key("ct129") not in fam.get("ddtree_smoke_latency_seconds", {})
    assert fam["ddtree_smoke_last_run_timestamp_seconds"][key("ct129")] == 2000.0


def test_hosts_not_checked_in_this_run_keep_their_series(profiles: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "ddtree.prom"
    smoke.write_prom(path, results(profiles), now=1000.0)
    only = smoke.check_hosts([smoke.Target("ct200", profiles["ct200"])], connector({"ct200": FakeHost(name="ct200")}))
    smoke.write_prom(path, only, now=3000.0)
    fam = families(path.read_text())
    assert fam["ddtree_smoke_last_run_timestamp_seconds"] == {key("ct129"): 1000.0, key("ct200"): 3000.0}


def test_label_values_are_escaped(profiles: dict[str, Any]) -> None:
    r = results(profiles)[0]
    odd = smoke.HostResult('we"ird\\host', 'm"o\nde', r.state, r.checks, r.perfdata, r.observation)
    text = smoke.render_prom([odd], [], now=1.0)
    fam = families(text)
    assert (("host", 'we"ird\\host'), ("mode", 'm"o\nde')) in fam["ddtree_smoke_success"]
    assert {s.label("host") for s in smoke.read_prom(text)} == {'we"ird\\host'}


def test_prom_file_is_replaced_atomically(profiles: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "ddtree.prom"
    smoke.write_prom(path, results(profiles), now=1000.0)
    before = path.read_text()
    with open(path) as old:  # a reader that opened the old file keeps reading the old file, whole
        smoke.write_prom(path, results(profiles), now=2000.0)
        assert old.read() == before
        assert os.fstat(old.fileno()).st_ino != path.stat().st_ino
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ddtree.prom"]  # no temp file left behind


def test_a_failed_write_leaves_the_old_file(profiles: dict[str, Any], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ddtree.prom"
    smoke.write_prom(path, results(profiles), now=1000.0)
    before = path.read_text()

    class FullDisk:
        """The temp file, which takes half of what is written and then hits ENOSPC."""

        def __init__(self, *args: Any) -> None:
            self._fh = open(*args)

        def __enter__(self) -> "FullDisk":
            return self

        def __exit__(self, *exc: object) -> None:
            self._fh.close()

        def write(self, data: bytes) -> int:
            self._fh.write(data[: len(data) // 2])
            self._fh.flush()
            raise OSError(28, "No space left on device")

    from prometheus_client import exposition

    monkeypatch.setattr(exposition, "open", FullDisk, raising=False)
    with pytest.raises(OSError):
        smoke.write_prom(path, results(profiles), now=2000.0)
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ddtree.prom"]


def test_readers_never_see_a_partial_file(profiles: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "ddtree.prom"
    res = results(profiles)
    smoke.write_prom(path, res, now=1.0)
    stop = threading.Event()
    seen: list[int] = []

    def writer() -> None:
        n = 2
        while not stop.is_set():
            smoke.write_prom(path, res, now=float(n))
            n += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            fam = families(path.read_text())
            seen.append(len(fam))
            assert len(fam["ddtree_smoke_success"]) == 2
    finally:
        stop.set()
        t.join()
    assert len(seen) > 10 and len(set(seen)) == 1


# ------------------------------------------------------------------ dead-man pings


class _Recorder(http.server.BaseHTTPRequestHandler):
    hits: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).hits.append((self.command, self.path, body))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"OK")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def ping_server() -> Iterator[tuple[str, list[tuple[str, str, bytes]]]]:
    hits: list[tuple[str, str, bytes]] = []
    handler = type("Handler", (_Recorder,), {"hits": hits})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/ping/abc", hits
    server.shutdown()


def run(profiles: dict[str, Any], tmp_path: Path, ping_url: str | None, **fakes: Any) -> smoke.RunOutcome:
    targets = [smoke.Target(n, profiles[n]) for n in ("ct129", "ct200")]
    fakes = {"ct129": FakeHost(), "ct200": FakeHost(name="ct200"), **fakes}
    return smoke.run(targets, connector(fakes), lock_path=tmp_path / "smoke.lock", state_dir=tmp_path / "state",
                     prom_file=tmp_path / "ddtree.prom", ping_url=ping_url)


def test_pings_start_then_exit_code_with_the_summary(profiles: dict[str, Any], tmp_path: Path,
                                                     ping_server: Any) -> None:
    url, hits = ping_server
    out = run(profiles, tmp_path, url, ct129=FakeHost(routes={"POST /generate": ok(generate_body(accept=1.0))}))
    assert out.exit_code == 2
    paths = [p for _, p, _ in hits]
    assert [p.split("?")[0] for p in paths] == ["/ping/abc/start", "/ping/abc/2"]
    rids = {p.split("rid=")[1] for p in paths}
    assert len(rids) == 1  # one run id pairs the start with its end
    assert hits[1][2].decode().startswith("DDTREE-SMOKE CRITICAL - ct129: accept_len 1.00 < 1.1")


def test_ping_url_with_a_query_keeps_it(ping_server: Any) -> None:
    url, hits = ping_server
    p = smoke.Pinger(url + "?create=1")
    p.start()
    p.finish(0, "ok")
    assert [h[1].split("&rid=")[0] for h in hits] == ["/ping/abc/start?create=1", "/ping/abc/0?create=1"]


def test_a_dead_ping_url_changes_nothing_and_costs_at_most_a_couple_of_seconds(
        profiles: dict[str, Any], tmp_path: Path) -> None:
    # a listener that never answers: the worst kind of dead endpoint (connect succeeds, then silence)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        t0 = time.monotonic()
        out = run(profiles, tmp_path, f"http://127.0.0.1:{silent.getsockname()[1]}/ping")
        took = time.monotonic() - t0
    finally:
        silent.close()
    assert out.exit_code == 0
    # the ping waits its 2 s timeout, not forever: the listener never answers, so only the timeout ends it.
    # A wide bound, since a loaded machine adds its own waits to the run's
    assert took < 15.0
    refused = socket.socket()
    refused.bind(("127.0.0.1", 0))
    port = refused.getsockname()[1]
    refused.close()  # nothing listens there now
    warnings: list[str] = []
    targets = [smoke.Target("ct129", profiles["ct129"])]
    out = smoke.run(targets, connector({"ct129": FakeHost()}), lock_path=tmp_path / "l", state_dir=None,
                    ping_url=f"http://127.0.0.1:{port}/ping", warn=warnings.append)
    assert out.exit_code == 0
    assert any("ping" in w and "failed" in w for w in warnings)


# ------------------------------------------------------------------ no overlap


def test_second_lock_holder_is_refused_and_told_who_holds_it(tmp_path: Path) -> None:
    first, second = smoke.RunLock(tmp_path / "x.lock"), smoke.RunLock(tmp_path / "x.lock")
    assert first.acquire()
    try:
        assert not second.acquire()
        assert f"pid {os.getpid()}" in second.holder
    finally:
        first.release()
    assert second.acquire()
    second.release()


def test_a_run_that_finds_the_lock_held_skips_and_exits_0(profiles: dict[str, Any], tmp_path: Path) -> None:
    fake = FakeHost()
    lock = smoke.RunLock(tmp_path / "smoke.lock")
    assert lock.acquire()
    try:
        out = smoke.run([smoke.Target("ct129", profiles["ct129"])], connector({"ct129": fake}),
                        lock_path=tmp_path / "smoke.lock", state_dir=tmp_path, prom_file=tmp_path / "m.prom")
    finally:
        lock.release()
    assert out.skipped and out.exit_code == 0
    assert out.summary().startswith("DDTREE-SMOKE OK - skipped: another smoke run holds")
    assert fake.calls == []  # nothing was checked
    assert not (tmp_path / "m.prom").exists()


def _cli(*args: str, env: dict[str, str] | None = None, **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([DDTREE_OPS, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "NO_COLOR": "1", **(env or {})}, **kw)


def _refused_ssh_config(tmp_path: Path) -> Path:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host *\n  HostName 127.0.0.1\n  Port {port}\n  User root\n  ConnectTimeout 2\n"
                   f"  UserKnownHostsFile {tmp_path / 'known_hosts'}\n")
    return cfg


def test_concurrent_cli_run_skips_with_exit_0(tmp_path: Path) -> None:
    """A second `ddtree-ops smoke` while the first holds the lock: says it skipped, exits 0."""
    lock = tmp_path / "smoke.lock"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from ddtree_ops.smoke import RunLock\n"
        f"l = RunLock(Path({str(lock)!r})); assert l.acquire(); print('held', flush=True); time.sleep(30)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        cfg = _refused_ssh_config(tmp_path)
        proc = _cli("smoke", "--all", "--lock-file", str(lock), "--ssh-config", str(cfg),
                    "--state-dir", str(tmp_path / "state"))
        out, err = proc.communicate(timeout=60)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 0, (out, err)
    assert out.startswith("DDTREE-SMOKE OK - skipped: another smoke run holds")
    assert "skipped" in err
    assert "unreachable" not in out  # it did not try the hosts


def test_under_flock_wrapper_on_the_same_lock_the_run_proceeds(tmp_path: Path) -> None:
    """cron's `flock -n LOCK ddtree-ops smoke` hands us the lock it holds; we must not skip ourselves,
    and a second wrapped run must be kept out."""
    lock = tmp_path / "smoke.lock"
    cfg = _refused_ssh_config(tmp_path)
    proc = subprocess.run(["flock", "-n", str(lock), DDTREE_OPS, "smoke", "ct129", "--lock-file", str(lock),
                           "--ssh-config", str(cfg), "--state-dir", str(tmp_path / "state")],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "NO_COLOR": "1"})
    assert proc.returncode == int(NagiosExit.UNKNOWN), proc  # it ran: the host is unreachable, not skipped
    assert proc.stdout.startswith("DDTREE-SMOKE UNKNOWN - ct129: unreachable")


def test_cli_json_for_an_unreachable_host(tmp_path: Path) -> None:
    import json

    cfg = _refused_ssh_config(tmp_path)
    proc = _cli("smoke", "ct129", "ct200", "--json", "--ssh-config", str(cfg), "--lock-file", str(tmp_path / "l"),
                "--state-dir", str(tmp_path / "state"))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    doc = json.loads(out)
    assert doc["schema_version"] == 1 and doc["result"] == "unknown" and doc["exit_code"] == 3
    assert [h["host"] for h in doc["hosts"]] == ["ct129", "ct200"]
    assert all(h["checks"][0]["name"] == "connect" for h in doc["hosts"])


@pytest.mark.parametrize("args", [[], ["ct129", "--all"], ["nosuchhost"], ["--jobs", "-1", "ct129"]])
def test_usage_errors_exit_64(args: list[str], tmp_path: Path) -> None:
    proc = _cli("smoke", *args, "--lock-file", str(tmp_path / "l"))
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 64, (out, err)
    assert out == ""
