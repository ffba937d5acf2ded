"""The lab hosts themselves: one network namespace, veth and address per host, a per-host overlay on
the cached tree, and `systemd-nspawn --boot` with real systemd as PID 1 inside it.

Everything `up` starts is recorded (by PID, netns, link and mount) in <home>/run/state.json as it
happens, so `down` undoes a partial `up` as well as a full one. Nothing here uses broad process
matching: processes are stopped by the PIDs recorded (or, for a lab whose state file was lost, by the
PIDs of nspawn processes whose command line names this lab's own root directories).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import psutil

from ddtree_ops.lab import _sys, payload, tree
from ddtree_ops.lab._sys import LabError
from ddtree_ops.lab.hosts import SUBNET, address_of
from ddtree_ops.lab.paths import Paths

BOOT_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


@dataclass
class HostState:
    name: str
    address: str
    netns: str
    veth: str
    root: str
    nspawn_pid: int | None = None
    mounted: bool = False
    netns_made: bool = False
    cgroups: list[str] = field(default_factory=list)


@dataclass
class LabState:
    hosts: dict[str, HostState] = field(default_factory=dict)
    started: float = 0.0

    @classmethod
    def load(cls, paths: Paths) -> LabState | None:
        try:
            raw = json.loads(paths.state.read_text())
        except (OSError, ValueError):
            return None
        return cls(hosts={k: HostState(**v) for k, v in raw.get("hosts", {}).items()}, started=raw.get("started", 0.0))

    def save(self, paths: Paths) -> None:
        paths.run.mkdir(parents=True, exist_ok=True)
        write_atomic(paths.state, json.dumps({"hosts": {k: asdict(v) for k, v in self.hosts.items()},
                                              "started": self.started}, indent=2))


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` whole (a temp file beside it, then a rename): the lab's state, inventory and ssh
    files are read by other processes while the lab changes (a lab that grows while commands run
    against its first hosts, as the test suite's two lab workers do), and must never be half-written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def host_state(paths: Paths, host: str) -> HostState:
    return HostState(name=host, address=address_of(host), netns=host, veth=f"vh-{host}"[:15],
                     root=str(paths.host_root(host)))


# --------------------------------------------------------------------------- steps of `up` (argv as data)


def netns_argvs(h: HostState) -> list[list[str]]:
    """Network namespace + veth pair: the address exists only inside the namespace, the root
    namespace reaches it through a /32 route over the veth (facts/test-hosts.md section 4)."""
    return [["ip", "netns", "add", h.netns],
            ["ip", "link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "netns", h.netns],
            ["ip", "link", "set", h.veth, "up"],
            ["ip", "-n", h.netns, "link", "set", "lo", "up"],
            ["ip", "-n", h.netns, "addr", "add", f"{h.address}/32", "dev", "eth0"],
            ["ip", "-n", h.netns, "link", "set", "eth0", "up"],
            ["ip", "-n", h.netns, "route", "add", "default", "dev", "eth0"],
            # lab hosts reach each other (a multi-node service's rendezvous): the root namespace
            # answers ARP for the others' addresses on this veth and forwards between the veths
            ["sysctl", "-q", "-w", f"net.ipv4.conf.{h.veth}.proxy_arp=1"],
            ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"],
            ["ip", "route", "replace", f"{h.address}/32", "dev", h.veth]]


CUT_LINK = "ddl-cut"


def cut_argvs(h: HostState, *, on: bool) -> list[list[str]]:
    """The `rendezvous-unreachable` fault: inside the host's namespace, the rest of the lab subnet is
    routed to a veth whose peer drops everything (a static neighbour entry, so no ARP failure
    answers early): connections to other lab hosts time out, as through a firewall that drops
    them. The operator's SSH to the host is untouched (its replies go to the root namespace)."""
    if not on:
        return [["ip", "-n", h.netns, "link", "del", CUT_LINK]]
    others = [f"{SUBNET}.{n}" for n in range(1, 255) if f"{SUBNET}.{n}" != h.address]
    argvs = [["ip", "-n", h.netns, "link", "add", CUT_LINK, "type", "veth", "peer", "name", CUT_LINK + "-p"],
             ["ip", "-n", h.netns, "link", "set", CUT_LINK, "up"],
             ["ip", "-n", h.netns, "link", "set", CUT_LINK + "-p", "up"]]
    argvs += [["ip", "-n", h.netns, "route", "replace", f"{SUBNET}.0/24", "dev", CUT_LINK]]
    argvs += [["ip", "-n", h.netns, "neigh", "replace", a, "lladdr", "02:00:00:00:dd:01", "dev", CUT_LINK,
               "nud", "permanent"] for a in others]
    return argvs


def overlay_argv(paths: Paths, h: HostState) -> list[str]:
    d = paths.host_dir(h.name)
    return ["mount", "-t", "overlay", "overlay", "-o",
            f"lowerdir={paths.tree},upperdir={d / 'upper'},workdir={d / 'work'}", h.root]


def nspawn_argv(h: HostState) -> list[str]:
    """systemd-nspawn, started from inside the host's own cgroups (`h.cgroups`).

    --register=no --keep-unit: there is no systemd/machined on this machine to register with, so
    nspawn makes the container's cgroup (`payload`) beside its own, under the cgroup it starts in.
    Two containers started from one cgroup would share that `payload`: both systemd instances then
    create and prune the same /system.slice/<unit> directories at boot, and a unit fails at random
    with 219/CGROUP. The wrapper shell moves itself into the host's cgroups, then execs nspawn
    (same pid); where it cannot, nspawn still starts, as before."""
    nspawn = ["systemd-nspawn", "-D", h.root, "--boot", "--register=no", "--keep-unit",
              f"--network-namespace-path=/run/netns/{h.netns}", "--console=pipe", "-M", h.name,
              f"--hostname={h.name}"]
    if not h.cgroups:
        return nspawn
    procs = [str(Path(c) / "cgroup.procs") for c in h.cgroups]
    return ["sh", "-c", 'echo $$ | tee "$@" > /dev/null; exec ' + shlex.join(nspawn), "sh", *procs]


def cgroup_dirs(host: str, mountinfo: str, self_cgroup: str) -> list[str]:
    """Where the host's own cgroups go: beside this process's cgroup, in the hierarchies systemd
    uses (the cgroup2 one, and the v1 `name=systemd` one on a hybrid machine). Pure: the texts of
    /proc/self/mountinfo and /proc/self/cgroup in."""
    mounts: dict[str, str] = {}
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        fstype, _, opts = line.split(" - ", 1)[1].split()[:3]
        if fstype == "cgroup2":
            mounts.setdefault("", fields[4])
        elif fstype == "cgroup" and "name=systemd" in opts.split(","):
            mounts.setdefault("name=systemd", fields[4])
    out = []
    for line in self_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers in mounts:
            out.append(str(Path(mounts[controllers]) / path.lstrip("/") / f"ddtree-lab-{host}"))
    return out


def make_cgroups(host: str) -> list[str]:
    made = []
    try:
        dirs = cgroup_dirs(host, Path("/proc/self/mountinfo").read_text(), Path("/proc/self/cgroup").read_text())
    except OSError:
        return []
    for d in dirs:
        try:
            Path(d).mkdir(exist_ok=True)
        except OSError:
            continue
        made.append(d)
    return made


def remove_cgroups(h: HostState) -> list[str]:
    """rmdir the host's cgroups, deepest first (the container's systemd leaves its tree behind)."""
    left = []
    for d in h.cgroups:
        for root, _, _ in os.walk(d, topdown=False):
            try:
                os.rmdir(root)
            except OSError:
                pass
        if Path(d).exists():
            left.append(d)
    return left


def ensure_keys(paths: Paths, hosts: Sequence[str]) -> None:
    paths.keys.mkdir(parents=True, exist_ok=True, mode=0o700)
    wanted = [(paths.client_key, "ddtree-ops-lab-client")] + [(paths.host_key(h), f"root@{h}") for h in hosts]
    for key, comment in wanted:
        if not key.exists():
            _sys.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)], timeout=30,
                     what="ssh-keygen")


def write_ssh_files(paths: Paths, states: Sequence[HostState]) -> None:
    """ssh_config + known_hosts that make the names ct129/ct200 reach the lab, for this CLI, OpenSSH
    and paramiko alike; the operator's ~/.ssh is never touched."""
    cfg = ["# ddtree-ops lab: written by `ddtree-ops lab up` (these hosts are containers on this machine)",
           "# use: eval \"$(ddtree-ops lab env)\"  or  ssh -F " + str(paths.ssh_config) + " ct129", ""]
    known = []
    for h in states:
        cfg += [f"Host {h.name}", f"  HostName {h.address}", "  User root", "  Port 22",
                f"  IdentityFile {paths.client_key}", "  IdentitiesOnly yes", f"  UserKnownHostsFile {paths.known_hosts}",
                "  StrictHostKeyChecking yes", "  ConnectTimeout 5", "  LogLevel ERROR", ""]
        pub = paths.host_key(h.name).with_name(paths.host_key(h.name).name + ".pub").read_text().split()
        known.append(f"{h.name},{h.address} {pub[0]} {pub[1]}")
    write_atomic(paths.known_hosts, "\n".join(known) + "\n")
    write_atomic(paths.ssh_config, "\n".join(cfg))


# --------------------------------------------------------------------------- process helpers


def alive(pid: int | None) -> bool:
    """Running and not a zombie (an exited container leaves one until reaped)."""
    if not pid:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def descendants(pid: int) -> list[int]:
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _comm(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.NoSuchProcess:
        return ""


def container_init(nspawn_pid: int | None) -> int | None:
    """The container's PID 1 (systemd) as this namespace numbers it."""
    if not alive(nspawn_pid):
        return None
    for pid in descendants(nspawn_pid or 0):
        if _comm(pid) == "systemd":
            return pid
    return None


def _wait(pred: Any, timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return bool(pred())


def tcp_open(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def nsexec(init_pid: int, argv: Sequence[str], *, timeout: float = 30.0, check: bool = False,
           input: bytes | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command inside a lab host at machine level (its namespaces, as root): the escape hatch for
    lab administration and test setup, never for what the tool itself does (that goes over SSH)."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    return _sys.run(["nsenter", "-t", str(init_pid), "-m", "-u", "-i", "-n", "-p", "-C", "--", *argv],
                    timeout=timeout, check=check, env=env, input=input, what=f"{argv[0]} in the lab host")


# --------------------------------------------------------------------------- up / down


def boot(paths: Paths, state: LabState, host: str, profile: Any) -> HostState:
    h = host_state(paths, host)
    state.hosts[host] = h
    state.save(paths)
    d = paths.host_dir(host)
    for sub in ("upper", "work", "root"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    _sys.run(overlay_argv(paths, h), timeout=30, what=f"mounting the overlay for {host}")
    h.mounted = True
    state.save(paths)
    payload.install_host(Path(h.root), host, profile, host_key=paths.host_key(host),
                         client_pub=paths.client_key.with_name(paths.client_key.name + ".pub"))
    claim_netns(h)
    h.netns_made = True
    state.save(paths)
    for argv in netns_argvs(h):
        _sys.run(argv, timeout=15, what=f"network setup for {host}")
    paths.logs.mkdir(parents=True, exist_ok=True)
    h.cgroups = make_cgroups(host)
    state.save(paths)
    with open(paths.logs / f"{host}.console.log", "wb") as log:
        proc = subprocess.Popen(nspawn_argv(h), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    h.nspawn_pid = proc.pid
    state.save(paths)
    return h


def netns_pids(netns: str) -> list[int]:
    """The processes living in a network namespace (none for one that does not exist)."""
    if not Path(f"/run/netns/{netns}").exists():
        return []
    res = _sys.run(["ip", "netns", "pids", netns], timeout=15, check=False)
    return [int(tok) for tok in res.stdout.split() if tok.isdigit()]


def remove_network(h: HostState) -> None:
    """Delete the host's namespace and its veth, where they exist (best effort: `down` reports
    what is left)."""
    if Path(f"/run/netns/{h.netns}").exists():
        _sys.run(["ip", "netns", "del", h.netns], timeout=15, check=False)
    if Path(f"/sys/class/net/{h.veth}").exists():
        _sys.run(["ip", "link", "del", h.veth], timeout=15, check=False)


def claim_netns(h: HostState) -> None:
    """Make the host's network namespace name free before `up` creates it. Host names are global to
    the machine, whatever lab home a session uses: a namespace of the same name with no process in
    it was left by a lab that is gone (a killed session, a lost state file) and is removed; one with
    processes in it belongs to a lab that is running, which this `up` must neither clobber nor
    (when it fails and cleans up) tear down."""
    pids = netns_pids(h.netns)
    if pids:
        raise LabError(f"{h.name}: another lab on this machine is running this host (network namespace "
                       f"{h.netns}, pids {' '.join(map(str, pids[:5]))}); take it down with `ddtree-ops lab "
                       f"down` under that lab's DDTREE_LAB_HOME, or use that lab")
    remove_network(h)


def wait_booted(paths: Paths, h: HostState, timeout: float = BOOT_TIMEOUT_S) -> None:
    if not _wait(lambda: tcp_open(h.address, 22) or not alive(h.nspawn_pid), timeout):
        raise LabError(f"{h.name}: sshd did not answer on {h.address}:22 within {timeout:g}s "
                       f"(console: {paths.logs / (h.name + '.console.log')})")
    if not alive(h.nspawn_pid):
        tail = (paths.logs / f"{h.name}.console.log").read_text(errors="replace").strip().splitlines()[-5:]
        raise LabError(f"{h.name}: systemd-nspawn exited during boot: {' | '.join(tail)}")


def stop_host(paths: Paths, h: HostState) -> list[str]:
    """Power the container off (nspawn turns SIGTERM into a clean shutdown of its systemd), escalate
    to SIGKILL of the recorded PIDs if it does not go, then remove the mount and the network. Returns
    what could not be cleaned."""
    problems: list[str] = []
    pid = h.nspawn_pid
    if alive(pid):
        inner = descendants(pid or 0)
        os.kill(pid or 0, signal.SIGTERM)
        if not _wait(lambda: not alive(pid), STOP_TIMEOUT_S):
            for p in [pid, *inner]:
                try:
                    os.kill(p or 0, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if not _wait(lambda: not alive(pid), 5):
                problems.append(f"{h.name}: systemd-nspawn (pid {pid}) did not exit")
    _reap(pid)
    problems += [f"{h.name}: cgroup {d} is still there" for d in remove_cgroups(h)]
    if is_mount(h.root):
        res = _sys.run(["umount", h.root], timeout=30, check=False)
        if res.returncode != 0:
            _sys.run(["umount", "-l", h.root], timeout=30, check=False)
        if is_mount(h.root):
            problems.append(f"{h.name}: {h.root} is still mounted")
    if pid is None and netns_pids(h.netns):
        # never booted by this lab, and processes live in it: another lab's host, not ours to remove
        return problems
    remove_network(h)
    tree.cleanup_nspawn_leftovers(h.name)
    if not is_mount(h.root):
        _sys.run(["rm", "-rf", "--one-file-system", str(paths.host_dir(h.name))], timeout=120, check=False)
    for what, gone in ((f"netns {h.netns}", not Path(f"/run/netns/{h.netns}").exists()),
                       (f"link {h.veth}", not Path(f"/sys/class/net/{h.veth}").exists())):
        if not gone:
            problems.append(f"{h.name}: {what} is still there")
    return problems


def _reap(pid: int | None) -> None:
    # nspawn was our child only in the process that ran `up`; reap it if so
    try:
        os.waitpid(pid or -1, os.WNOHANG)
    except (ChildProcessError, OSError):
        pass


def is_mount(path: str) -> bool:
    try:
        with open("/proc/self/mountinfo") as fh:
            return any(line.split()[4] == path for line in fh)
    except OSError:
        return False


def stray_nspawns(paths: Paths) -> list[int]:
    """nspawn processes booted from this lab's run directory (for a lab whose state file is gone)."""
    marker = str(paths.run) + "/"
    out = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if cmd and cmd[0].endswith("systemd-nspawn") and any(a.startswith(marker) for a in cmd):
            out.append(proc.pid)
    return out


def memory_of(nspawn_pid: int | None) -> dict[str, int]:
    """RSS and PSS (bytes) of everything running in one host: its nspawn and all it started."""
    rss = pss = 0
    if not alive(nspawn_pid):
        return {"rss": 0, "pss": 0}
    for pid in [nspawn_pid or 0, *descendants(nspawn_pid or 0)]:
        try:
            mem = psutil.Process(pid).memory_full_info()      # PSS from smaps_rollup
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss += mem.rss
        pss += mem.pss
    return {"rss": rss, "pss": pss}
