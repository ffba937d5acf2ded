"""The SSH implementation of `Host`, on paramiko, with OpenSSH's rules where people rely on them.

- ssh_config is the authority: HostName, User, Port, IdentityFile, UserKnownHostsFile,
  StrictHostKeyChecking, ConnectTimeout and ProxyJump chains (each hop resolved through the same
  file), read with paramiko's own SSHConfig parser.
- known_hosts with OpenSSH semantics: `accept-new` (default) records an unknown key, `strict`
  refuses it, and a changed key is always refused.
- one transport per host per command; commands, file writes and HTTP to the service's loopback
  port are channels on it (HTTP goes through `direct-tcpip`, so nothing needs curl on the host).
- only the connection is retried (with back-off); commands never are, since not all are idempotent.
"""

from __future__ import annotations

import fcntl
import http.client
import json
import logging
import os
import select
import shlex
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ddtree_ops.host import (
    HostKeyError,
    HostUnreachable,
    HttpResponse,
    HttpUnavailable,
    RemoteTimeout,
    Result,
    SudoPasswordRequired,
)
from ddtree_ops import output
from ddtree_ops.errors import OpsError
from ddtree_ops.profile import Profile, load_profile

if TYPE_CHECKING:
    import paramiko

ENV_SSH_CONFIG = "DDTREE_OPS_SSH_CONFIG"
# paramiko logs every refused port-forward ("Secsh channel N open FAILED") through logging's
# last-resort handler; the tool reports those itself (HttpUnavailable), so keep them quiet
logging.getLogger("paramiko").addHandler(logging.NullHandler())
SUDO_PASSWORD_HINTS = ("a password is required", "a terminal is required", "no tty present")
# stderr's last line when a command ended without an exit status (its rc is then -1)
NO_EXIT_STATUS = "ddtree-ops: the command ended without an exit status (killed by a signal, or sshd closed its session)\n"


@dataclass(frozen=True)
class Endpoint:
    """Where one ssh_config name really leads."""

    alias: str
    hostname: str
    port: int = 22
    user: str | None = None
    identity_files: tuple[str, ...] = ()
    known_hosts: tuple[str, ...] = ()
    strict: bool = False  # StrictHostKeyChecking yes
    connect_timeout: float = 10.0
    jumps: tuple[Endpoint, ...] = field(default=())


def ssh_config_path(explicit: str | None = None) -> Path | None:
    for candidate in (explicit, os.environ.get(ENV_SSH_CONFIG), "~/.ssh/config"):
        if candidate:
            path = Path(candidate).expanduser()
            if path.is_file():
                return path
            if candidate is explicit:
                raise OpsError(f"ssh config {candidate} does not exist", exit_code=64)
    return None


def resolve(alias: str, *, config_path: Path | None, user: str | None = None, port: int | None = None,
            _depth: int = 0) -> Endpoint:
    """Resolve an ssh_config name the way `ssh -G` would, for the keys we honour."""
    import paramiko

    if _depth > 8:
        raise OpsError(f"ProxyJump chain through {alias} is deeper than 8 hops (a loop?)")
    cfg = paramiko.SSHConfig.from_path(str(config_path)) if config_path else paramiko.SSHConfig()
    opts = cfg.lookup(alias)
    # "user@host:port" inside ProxyJump is a spec, not only a name
    spec_user, _, rest = alias.rpartition("@") if "@" in alias else (None, "", alias)
    spec_host, _, spec_port = rest.partition(":")
    if spec_user or spec_port:
        opts = cfg.lookup(spec_host)
    jumps: tuple[Endpoint, ...] = ()
    proxy = opts.get("proxyjump")
    if proxy and proxy.lower() != "none":
        jumps = tuple(resolve(hop.strip(), config_path=config_path, _depth=_depth + 1)
                      for hop in proxy.split(","))
    strict = str(opts.get("stricthostkeychecking", "accept-new")).lower() in ("yes", "true")
    known = tuple(os.path.expanduser(p) for p in str(opts.get("userknownhostsfile", "~/.ssh/known_hosts")).split())
    return Endpoint(
        alias=alias,
        hostname=opts.get("hostname", spec_host),
        port=int(spec_port or port or opts.get("port", 22)),
        user=spec_user or opts.get("user") or user,
        identity_files=tuple(os.path.expanduser(p) for p in opts.get("identityfile", [])),
        known_hosts=known,
        strict=strict,
        connect_timeout=float(opts.get("connecttimeout", 10)),
        jumps=jumps,
    )


def _known_host_key(endpoint: Endpoint) -> str:
    return endpoint.hostname if endpoint.port == 22 else f"[{endpoint.hostname}]:{endpoint.port}"


class _Policy:
    """OpenSSH StrictHostKeyChecking for unknown keys (a changed key never gets here)."""

    def __init__(self, endpoint: Endpoint, strict: bool) -> None:
        self.endpoint = endpoint
        self.strict = strict

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        name = _known_host_key(self.endpoint)
        if self.strict:
            raise HostKeyError(
                f"{self.endpoint.alias}: no known host key for {name} and host key checking is strict; "
                f"add it to {self.endpoint.known_hosts[0] if self.endpoint.known_hosts else '~/.ssh/known_hosts'} "
                f"(offered {key.get_name()} {key.fingerprint})")
        path = Path(self.endpoint.known_hosts[0] if self.endpoint.known_hosts else "~/.ssh/known_hosts").expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="ascii") as fh:  # the lock keeps parallel checks from interleaving lines
            fcntl.flock(fh, fcntl.LOCK_EX)
            fh.write(f"{name} {key.get_name()} {key.get_base64()}\n")
        output.warn(f"{self.endpoint.alias}: recorded new host key {key.get_name()} {key.fingerprint} in {path}")


def _client(endpoint: Endpoint, strict: bool, sock: Any = None) -> paramiko.SSHClient:
    import paramiko

    client = paramiko.SSHClient()
    for path in endpoint.known_hosts:
        if Path(path).is_file():
            try:
                client.get_host_keys().load(path)
            except (OSError, paramiko.SSHException) as exc:
                raise HostKeyError(f"{endpoint.alias}: cannot read known_hosts {path}: {exc}") from None
    policy = _Policy(endpoint, strict or endpoint.strict)
    client.set_missing_host_key_policy(policy)  # type: ignore[arg-type]
    try:
        client.connect(
            endpoint.hostname, port=endpoint.port, username=endpoint.user,
            key_filename=list(endpoint.identity_files) or None, timeout=endpoint.connect_timeout,
            banner_timeout=endpoint.connect_timeout, auth_timeout=endpoint.connect_timeout,
            allow_agent=True, look_for_keys=not endpoint.identity_files, sock=sock,
        )
    except paramiko.BadHostKeyException as exc:
        raise HostKeyError(
            f"{endpoint.alias}: HOST KEY CHANGED for {_known_host_key(endpoint)}: expected "
            f"{exc.expected_key.get_name()} {exc.expected_key.fingerprint}, got {exc.key.get_name()} "
            f"{exc.key.fingerprint}. Someone may be intercepting the connection, or the host was "
            "reinstalled; refusing. Remove the old entry from known_hosts only if you know why it changed."
        ) from None
    except paramiko.AuthenticationException as exc:
        raise HostUnreachable(f"{endpoint.alias}: authentication failed for user "
                              f"{endpoint.user or 'default'} ({exc})") from None
    return client


def _connect_chain(endpoint: Endpoint, strict: bool) -> tuple[paramiko.SSHClient, list[paramiko.SSHClient]]:
    """Connect through each ProxyJump hop in turn; returns the target and the hops to close."""
    hops: list[paramiko.SSHClient] = []
    sock = None
    for hop in endpoint.jumps:
        client = _client(hop, strict, sock)
        hops.append(client)
        transport = client.get_transport()
        assert transport is not None
        nxt = _after(endpoint, hop)
        sock = transport.open_channel("direct-tcpip", (nxt.hostname, nxt.port), ("127.0.0.1", 0),
                                      timeout=endpoint.connect_timeout)
    return _client(endpoint, strict, sock), hops


def _after(target: Endpoint, hop: Endpoint) -> Endpoint:
    """The endpoint a ProxyJump hop forwards to: the next hop, or the target itself."""
    chain = [*target.jumps, target]
    return chain[chain.index(hop) + 1]


class SSHHost:
    """`Host` over one paramiko transport. Counts round trips for the benchmarks."""

    def __init__(self, name: str, endpoint: Endpoint, *, strict: bool = False, use_sudo: bool = False,
                 retries: int = 2) -> None:
        self.name = name
        self.endpoint = endpoint
        self.use_sudo = use_sudo
        self.round_trips = 0  # commands + streams + HTTP requests
        self.sessions = 0  # commands + streams: each one is a login (PAM session) on the host
        self._lock = threading.Lock()
        self._strict = strict
        self._connect(retries)

    def reconnect(self, retries: int = 3) -> None:
        """A new connection after a drop (the old transport is closed first)."""
        self.close()
        self._connect(retries)

    def _connect(self, retries: int) -> None:
        import paramiko

        endpoint, name, strict = self.endpoint, self.name, self._strict
        delay = 0.5
        last: Exception | None = None
        for attempt in range(retries + 1):
            try:
                self._client, self._hops = _connect_chain(endpoint, strict)
                break
            except (HostKeyError, HostUnreachable):
                raise
            except (OSError, socket.timeout, paramiko.SSHException, EOFError) as exc:
                last = exc
                if attempt < retries:
                    time.sleep(delay)
                    delay *= 2
        else:
            via = f" via {', '.join(j.alias for j in endpoint.jumps)}" if endpoint.jumps else ""
            raise HostUnreachable(f"{name}: cannot connect to {endpoint.hostname}:{endpoint.port}{via} "
                                  f"after {retries + 1} attempts ({_reason(last)})")

    # ---------------------------------------------------------------- commands

    def _exec(self, command: str, stdin: bytes | None, timeout: float) -> tuple[int, bytes, bytes, float]:
        t0 = time.monotonic()
        chan = self._open_session(timeout)
        chan.settimeout(timeout)
        out, err = bytearray(), bytearray()
        try:
            chan.exec_command(command)
            if stdin is not None:
                try:
                    chan.sendall(stdin)
                except OSError:
                    # the command ended without reading all of it (the lock's acquire script exits at once
                    # when the lock is held): its exit status and output below are still its answer
                    pass
            if not chan.closed:
                chan.shutdown_write()
            deadline = t0 + timeout
            # Read to EOF, not to the exit status: sshd may send the exit status while output
            # still sits in its buffers (seen with several channels in flight at once).
            while True:
                if chan.recv_ready():
                    out += chan.recv(65536)
                elif chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                elif chan.eof_received or chan.closed:  # closed: the pipe stays readable, so leave, not spin
                    break
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise RemoteTimeout(f"{self.name}: command timed out after {timeout:g}s: {command[:120]}")
                    if not chan.get_transport().is_active():
                        raise HostUnreachable(f"{self.name}: SSH connection lost while running {command[:80]}")
                    # paramiko's channel pipe is readable once output, stderr or EOF arrives, so a
                    # long command costs no CPU while it runs (a 2 ms poll here cost ~2% of a CPU each)
                    select.select([chan], [], [], min(left, 0.5))
            while chan.recv_ready():
                out += chan.recv(65536)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
            rc = chan.recv_exit_status()
        except socket.timeout:
            raise RemoteTimeout(f"{self.name}: command timed out after {timeout:g}s: {command[:120]}") from None
        finally:
            chan.close()
        if rc == -1:  # paramiko's "no exit status came": the channel closed without one
            if not chan.get_transport().is_active():
                # the connection dropped mid-command: its output, empty or cut short, is no answer
                raise HostUnreachable(f"{self.name}: SSH connection lost while running {command[:80]}")
            # sshd reports a command killed by a signal as exit-signal, which paramiko does not read
            err += (b"\n" if err and not err.endswith(b"\n") else b"") + NO_EXIT_STATUS.encode()
        return rc, bytes(out), bytes(err), time.monotonic() - t0

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float = 60.0,
            sudo: bool = False) -> Result:
        argv = list(argv)
        if sudo and self.use_sudo:
            argv = ["sudo", "-n", "--", *argv]
        rc, out, err, took = self._exec(shlex.join(argv), stdin, timeout)
        stderr = err.decode("utf-8", "replace")
        if sudo and self.use_sudo and rc != 0 and any(h in stderr for h in SUDO_PASSWORD_HINTS):
            raise SudoPasswordRequired(
                f"{self.name}: sudo needs a password for {self.endpoint.user or 'this user'}; ddtree-ops "
                "only uses `sudo -n`. Allow the commands without a password (NOPASSWD) or connect as root.")
        return Result(tuple(argv), rc, out.decode("utf-8", "replace"), stderr, took)

    def put(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        script = 'umask 077 && cat > "$1" && chmod "$2" "$1"'
        res = self.run(["sh", "-c", script, "sh", path, f"{mode:o}"], stdin=data, sudo=True)
        res.check(f"writing {path}")

    def get(self, path: str) -> bytes | None:
        argv = ["sh", "-c", 'test -e "$1" || exit 44; cat -- "$1"', "sh", path]
        if self.use_sudo:
            argv = ["sudo", "-n", "--", *argv]
        rc, out, err, _ = self._exec(shlex.join(argv), None, 60.0)
        if rc == 44:
            return None
        if rc != 0:
            raise OpsError(f"{self.name}: cannot read {path}: {err.decode('utf-8', 'replace').strip()}")
        return out

    def stream(self, argv: Sequence[str], *, timeout: float = 30.0) -> _ChannelLines:
        import paramiko

        chan = self._open_session(timeout)
        try:
            chan.exec_command(shlex.join(list(argv)))
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise HostUnreachable(f"{self.name}: SSH connection lost ({_reason(exc)})") from None
        return _ChannelLines(self.name, chan)

    def _open_session(self, timeout: float) -> Any:
        """A new channel for one command; a dead transport is `HostUnreachable`, which callers
        (deploy's reconnect-and-roll-back) treat differently from a failed command."""
        import paramiko

        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise HostUnreachable(f"{self.name}: SSH connection lost")
        with self._lock:
            self.round_trips += 1
            self.sessions += 1
        # sshd refuses a session past its MaxSessions (10 by default) on one connection while the others
        # run; paramiko then says "Connect failed" or, with several threads opening at once, "Unable to
        # open channel". The connection is fine: wait for one of them to end, up to the command's timeout
        # (`make test` run 27 failed a fleet preflight on this, reported as "SSH connection lost").
        deadline, pause = time.monotonic() + timeout, 0.02
        while True:
            try:
                # each try waits only for what is left, so the whole wait stays within the timeout
                return transport.open_session(timeout=max(deadline - time.monotonic(), 0.1))
            except (paramiko.SSHException, EOFError, OSError) as exc:
                if not transport.is_active():
                    raise HostUnreachable(f"{self.name}: SSH connection lost ({_reason(exc)})") from None
                if time.monotonic() + pause > deadline:
                    raise HostUnreachable(f"{self.name}: the host refused a new SSH session for {timeout:g}s "
                                          f"({_reason(exc)}; sshd's MaxSessions?)") from None
                time.sleep(pause)
                pause = min(pause * 2, 0.5)

    # ---------------------------------------------------------------- HTTP over the SSH connection

    def http(self, method: str, port: int, path: str, *, body: Any = None, timeout: float = 10.0,
             host: str = "127.0.0.1") -> HttpResponse:
        import paramiko

        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise HostUnreachable(f"{self.name}: SSH connection lost")
        with self._lock:
            self.round_trips += 1
        t0 = time.monotonic()
        try:
            chan = transport.open_channel("direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=timeout)
        except paramiko.ChannelException as exc:
            raise HttpUnavailable(f"{self.name}: nothing answers on {host}:{port} ({exc.text or exc})") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise HostUnreachable(f"{self.name}: SSH connection lost ({_reason(exc)})") from None
        chan.settimeout(timeout)
        payload = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close",
                "User-Agent: ddtree-ops", f"Content-Length: {len(payload)}"]
        if body is not None and not isinstance(body, bytes):
            head.append("Content-Type: application/json")
        try:
            chan.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
            resp = http.client.HTTPResponse(_ChannelSock(chan), method=method)  # type: ignore[arg-type]
            resp.begin()
            data = resp.read()
            headers = {k.lower(): v for k, v in resp.getheaders()}
            return HttpResponse(resp.status, data, time.monotonic() - t0, headers)
        except (socket.timeout, TimeoutError):
            raise HttpUnavailable(f"{self.name}: {method} {path} on port {port} timed out after {timeout:g}s") from None
        except (http.client.HTTPException, OSError, EOFError) as exc:
            raise HttpUnavailable(f"{self.name}: {method} {path} on port {port} failed ({_reason(exc)})") from None
        finally:
            chan.close()

    def close(self) -> None:
        self._client.close()
        for hop in reversed(self._hops):
            hop.close()

    def __enter__(self) -> SSHHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _ChannelLines:
    """Lines from a running remote command, each read with its own deadline."""

    def __init__(self, name: str, chan: paramiko.Channel) -> None:
        self._name, self._chan, self._buf = name, chan, b""

    def readline(self, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RemoteTimeout(f"{self._name}: no output from the watcher for {timeout:g}s")
            self._chan.settimeout(left)
            try:
                data = self._chan.recv(65536)
            except socket.timeout:
                continue
            except (OSError, EOFError) as exc:
                raise HostUnreachable(f"{self._name}: SSH connection lost ({_reason(exc)})") from None
            if not data:
                if self._chan.get_transport() is None or not self._chan.get_transport().is_active():
                    raise HostUnreachable(f"{self._name}: SSH connection lost")
                rest, self._buf = self._buf, b""
                return rest.decode("utf-8", "replace") if rest else None
            self._buf += data
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode("utf-8", "replace")

    def __enter__(self) -> _ChannelLines:
        return self

    def __exit__(self, *exc: object) -> None:
        self._chan.close()  # the remote loop dies of SIGPIPE at its next write


class _ChannelSock:
    """Just enough of a socket for http.client.HTTPResponse."""

    def __init__(self, chan: paramiko.Channel) -> None:
        self._chan = chan

    def makefile(self, mode: str, *args: Any) -> Any:
        return self._chan.makefile(mode)


def _reason(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown error"
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]


def connect(profile: Profile | str, *, ssh_config: str | None = None, strict: bool | None = None) -> SSHHost:
    """Open the one connection a command uses for a host (use it as a context manager)."""
    if isinstance(profile, str):
        profile = load_profile(profile)
    path = ssh_config_path(ssh_config)
    endpoint = resolve(profile.host.ssh_host, config_path=path, user=profile.host.user, port=profile.host.port)
    is_strict = profile.host.host_key_policy == "strict" if strict is None else strict
    return SSHHost(profile.name, endpoint, strict=is_strict, use_sudo=profile.host.sudo)
