"""A real sshd on a loopback port, for the SSH layer's own tests (no systemd needed)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from ports import free_port

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


@dataclass
class Sshd:
    port: int
    dir: Path
    client_key: Path
    host_pub: str

    def ssh_config(self, extra: str = "", known_hosts: Path | None = None, strict: str = "accept-new") -> Path:
        kh = known_hosts or self.dir / "known_hosts"
        cfg = self.dir / f"ssh_config.{time.monotonic_ns()}"
        cfg.write_text(
            f"Host target\n  HostName 127.0.0.1\n  Port {self.port}\n  User root\n"
            f"  IdentityFile {self.client_key}\n  UserKnownHostsFile {kh}\n"
            f"  StrictHostKeyChecking {strict}\n"
            f"Host jumped\n  HostName 127.0.0.1\n  Port {self.port}\n  User root\n"
            f"  IdentityFile {self.client_key}\n  UserKnownHostsFile {kh}\n  ProxyJump target\n"
            f"{extra}"
        )
        return cfg


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Sshd:
    if not Path(SSHD).exists():
        pytest.skip("openssh-server is not installed (apt-get install openssh-server)")
    d = tmp_path_factory.mktemp("sshd")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key")], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "client_key")], check=True)
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    port = free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\nPidFile {d / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        "AllowTcpForwarding yes\nSubsystem sftp internal-sftp\n"
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")],
                            stdout=subprocess.DEVNULL, stderr=open(d / "sshd.log", "w"))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail(f"sshd did not start: {(d / 'sshd.log').read_text()}")
    host_pub = (d / "host_key.pub").read_text().split()
    yield Sshd(port, d, d / "client_key", f"{host_pub[0]} {host_pub[1]}")
    proc.terminate()
    proc.wait(timeout=5)
