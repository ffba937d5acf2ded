"""`ddtree-ops lab up | down | status | env | fault | load`, as functions (the CLI and the pytest fixture
both call these)."""

from __future__ import annotations

import os
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ddtree_ops.config.inventory import Inventory
from ddtree_ops.errors import UsageError
from ddtree_ops.lab import _sys, machine, payload, tree
from ddtree_ops.lab._sys import LabError
from ddtree_ops.lab.hosts import HOSTS, MAX_HOSTS, address_of, inventory_text, lab_hosts
from ddtree_ops.lab.machine import HostState, LabState
from ddtree_ops.lab.paths import Paths
from ddtree_ops.lab.seed import seed_nextn, unseed
from ddtree_ops.ssh import connect as ssh_connect

ENV_VAR = "DDTREE_OPS_SSH_CONFIG"
ENV_INVENTORY = "DDTREE_OPS_INVENTORY"
# read by the stand-in at the next start of the service, which uses them up; a line ending in
# EVERY_START stays and applies to every start until `clear`
EVERY_START = "@every-start"
FILE_FAULTS = ("libcuda-missing", "hang", "crash-after-ready", "slow-start", "accept-collapse")
# made real by a process on the host (so the stand-in meets them, it is not told about them)
FILE_FAULTS += ("rank-oom",)  # the last rank of the next start runs out of memory loading its weights
# the next start's served tree (mode ddtree) verifies under a broken mask: nodes off the spine see the
# wrong ancestors, so the tree accepts little beyond the chain, well below what the shadow predicted
FILE_FAULTS += ("tree-mask",)
# faults that last a while: how long may be given (`NAME=SECONDS` in the file); without it the
# stand-in's own length (16 s more loading; death 8 s after ready). Tests pass a shorter one.
TIMED_FAULTS = ("slow-start", "crash-after-ready")
PROCESS_FAULTS = ("port-busy", "stray-gpu-process", "stray-gpu-card1")
# made real in the host's network namespace: its packets to every other lab host are dropped (as a
# firewall that drops them does), so a multi-node rank there never reaches rank 0's rendezvous
NETWORK_FAULTS = ("rendezvous-unreachable",)
FAULTS = FILE_FAULTS + PROCESS_FAULTS + NETWORK_FAULTS
FAULT_UNITS = {"port-busy": "ddtree-lab-port-busy.service", "stray-gpu-process": "ddtree-lab-stray-gpu.service",
               "stray-gpu-card1": "ddtree-lab-stray-gpu1.service"}
# share of the card a stray process holds: ~30 GB on the 48 GB host, enough to break the next start
STRAY_SHARE = 0.625
STRAY_SHARE_CARD1 = 0.9

Log = Callable[[str], None]


def env_line(paths: Paths | None = None) -> str:
    """One line for `eval`: the lab's ssh_config (how names are reached) and inventory (its groups)."""
    paths = paths or Paths.default()
    return f"export {ENV_VAR}={paths.ssh_config} {ENV_INVENTORY}={paths.inventory}"


def _profiles(hosts: Sequence[str], paths: Paths | None = None) -> dict[str, Any]:
    """ct129 and ct200 from their own profiles, the extra hosts from their class group
    (profiles/groups/a6000.yaml, pro6000.yaml) through the lab's inventory."""
    paths = paths or Paths.default()
    inv = Inventory.load(None, paths.inventory if paths.inventory.is_file() else "")
    return {h: inv.profile(h) for h in hosts}


def running_hosts(paths: Paths) -> list[str]:
    """The hosts of the lab as it stands (its state file), in lab order; the first two otherwise."""
    st = LabState.load(paths)
    return list(st.hosts) if st and st.hosts else list(HOSTS)


def _write_inventory(paths: Paths, hosts: Sequence[str]) -> None:
    order = lab_hosts(MAX_HOSTS)
    ordered = sorted(hosts, key=lambda h: order.index(h) if h in order else len(order))
    paths.home.mkdir(parents=True, exist_ok=True)
    machine.write_atomic(paths.inventory, inventory_text(ordered, f"ddtree-ops lab up --hosts {len(ordered)}"))


def is_up(paths: Paths, hosts: Sequence[str] = HOSTS) -> bool:
    st = LabState.load(paths)
    return bool(st) and all(h in st.hosts and machine.alive(st.hosts[h].nspawn_pid)
                            and machine.tcp_open(st.hosts[h].address, 22) for h in hosts)


def up(paths: Paths | None = None, *, hosts: Sequence[str] | None = None, count: int | None = None,
       seed: bool = True, log: Log = print) -> dict[str, float]:
    """Build (once) and boot the lab; returns phase timings in seconds.

    `count` hosts (ct129, ct200, then more of each class in turn), or exactly `hosts`. A lab that is
    up with fewer hosts grows: only the missing ones boot; the running ones are left as they are."""
    paths = paths or Paths.default()
    hosts = list(hosts) if hosts else lab_hosts(count or len(HOSTS))
    _sys.require_root()
    _sys.require_tools(log=log)
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    old = LabState.load(paths)
    if is_up(paths, hosts):
        log(f"lab already up ({len(old.hosts) if old else len(hosts)} hosts)")
        return {"total": 0.0}
    growing = old is not None and bool(old.hosts) and is_up(paths, list(old.hosts))
    if not growing and (old or machine.stray_nspawns(paths)):
        log("cleaning up the remains of an earlier lab")
        down(paths, log=lambda _m: None)
    timings["tree_built"] = float(tree.ensure_tree(paths, log=log))
    timings["tree"] = time.monotonic() - t0
    if not growing:
        payload.install_shared(paths.tree)
    state = old if growing and old is not None else LabState(started=time.time())
    new = [h for h in hosts if h not in state.hosts]
    everyone = [*state.hosts, *new]
    machine.ensure_keys(paths, everyone)
    _write_inventory(paths, everyone)
    profiles = _profiles(new, paths)
    try:
        t1 = time.monotonic()
        states = [machine.boot(paths, state, h, profiles[h]) for h in new]
        for h in states:
            machine.wait_booted(paths, h)
        machine.write_ssh_files(paths, list(state.hosts.values()))
        timings["boot"] = time.monotonic() - t1
        log(f"booted {', '.join(f'{h.name} ({h.address})' for h in states)} in {timings['boot']:.1f}s"
            + (f" (beside the {len(everyone) - len(new)} running)" if growing else ""))
        if seed:
            t2 = time.monotonic()
            with ThreadPoolExecutor(len(new)) as pool:
                list(pool.map(lambda h: _seed(paths, h, profiles[h]), new))
            timings["seed"] = time.monotonic() - t2
            log(f"NEXTN service healthy on {', '.join(new)} after {timings['seed']:.1f}s")
    except BaseException:
        if growing:  # the hosts that were up stay up; the new ones go
            for h in new:
                if h in state.hosts:
                    machine.stop_host(paths, state.hosts.pop(h))
            state.save(paths)
            _write_inventory(paths, list(state.hosts))
            machine.write_ssh_files(paths, list(state.hosts.values()))
        else:
            down(paths, log=lambda _m: None)
        raise
    timings["total"] = time.monotonic() - t0
    return timings


def _seed(paths: Paths, host: str, profile: Any) -> None:
    with connect(paths, host) as conn:
        seed_nextn(conn, profile)


def connect(paths: Paths, host: str) -> Any:
    """The tool's own Host over SSH, through the lab's ssh_config."""
    return ssh_connect(_profiles([host], paths)[host], ssh_config=str(paths.ssh_config), strict=True)


def down(paths: Paths | None = None, *, log: Log = print) -> float:
    """Stop everything `up` started and remove what it made. Returns seconds taken."""
    paths = paths or Paths.default()
    _sys.require_root()
    t0 = time.monotonic()
    state = LabState.load(paths) or LabState()
    problems: list[str] = []
    names = list(dict.fromkeys([*state.hosts, *HOSTS]))
    for name in names:
        h = state.hosts.get(name) or machine.host_state(paths, name)
        problems += machine.stop_host(paths, h)
    for pid in machine.stray_nspawns(paths):  # booted by a lab whose state file was lost
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if paths.run.exists() and not any(machine.is_mount(str(paths.host_root(n))) for n in names):
        shutil.rmtree(paths.run, ignore_errors=True)
    took = time.monotonic() - t0
    if problems:
        raise LabError("lab down left things behind: " + "; ".join(problems))
    log(f"lab down in {took:.1f}s")
    return took


@dataclass(frozen=True)
class HostStatus:
    name: str
    address: str
    running: bool
    system: str
    service: str
    faults: list[str]
    rss_mib: float
    pss_mib: float


def status(paths: Paths | None = None) -> list[HostStatus]:
    paths = paths or Paths.default()
    _sys.require_root()
    state = LabState.load(paths)
    out = []
    for name in running_hosts(paths):
        h = state.hosts.get(name) if state else None
        if h is None:
            out.append(HostStatus(name, address_of(name), False, "down", "-", [], 0.0, 0.0))
            continue
        init = machine.container_init(h.nspawn_pid)
        system = service = "-"
        if init:
            system = machine.nsexec(init, ["systemctl", "is-system-running"], timeout=10).stdout.strip() or "unknown"
            unit = _profiles([name], paths)[name].service.unit
            service = machine.nsexec(init, ["systemctl", "is-active", unit], timeout=10).stdout.strip() or "unknown"
        mem = machine.memory_of(h.nspawn_pid)
        out.append(HostStatus(name, h.address, bool(init), system if init else "down", service,
                              read_faults(paths, name), mem["rss"] / 2**20, mem["pss"] / 2**20))
    return out


# --------------------------------------------------------------------------- faults


def _host(paths: Paths, name: str) -> tuple[HostState, int]:
    if name not in running_hosts(paths):
        raise UsageError(f"unknown lab host {name!r} (lab hosts: {', '.join(running_hosts(paths))})")
    state = LabState.load(paths)
    h = state.hosts.get(name) if state else None
    init = machine.container_init(h.nspawn_pid) if h else None
    if h is None or init is None:
        raise LabError(f"lab host {name} is not running", hint="ddtree-ops lab up")
    return h, init


def faults_file(paths: Paths, name: str) -> Path:
    # under /var: the unit has ProtectSystem=full, and the stand-in must be able to use faults up
    return paths.host_root(name) / "var/lib/ddtree-lab/faults"


def read_faults(paths: Paths, name: str) -> list[str]:
    try:
        return [x.strip() for x in faults_file(paths, name).read_text().splitlines() if x.strip()]
    except OSError:
        return []


def fault(name: str, fault_name: str, paths: Paths | None = None, *, every_start: bool = False,
          seconds: float | None = None) -> list[str]:
    """Inject a fault or `clear` them all; returns the faults now set on the host.

    A file fault applies to the next start of the service only (the stand-in uses it up), so a
    rollback's own start is clean, as when a deploy broke something the known-good release does
    not touch; `every_start` keeps it for every start until cleared (a broken host). Process
    faults (port-busy, stray-gpu-process) are real processes and last until `clear`. `seconds`:
    how long a timed fault lasts (TIMED_FAULTS), instead of the stand-in's default."""
    paths = paths or Paths.default()
    _sys.require_root()
    if fault_name != "clear" and fault_name not in FAULTS:
        raise UsageError(f"unknown fault {fault_name!r}; one of: {', '.join(FAULTS)}, clear")
    if seconds is not None and fault_name not in TIMED_FAULTS:
        raise UsageError(f"fault {fault_name!r} takes no length; only {', '.join(TIMED_FAULTS)} do")
    if seconds is not None and not 0 < seconds <= 3600:
        raise UsageError(f"fault {fault_name!r}: a length of {seconds:g} s is not in (0, 3600]")
    h, init = _host(paths, name)
    faults_file(paths, name).parent.mkdir(parents=True, exist_ok=True)
    current = read_faults(paths, name)
    if fault_name == "clear":
        for unit in FAULT_UNITS.values():
            machine.nsexec(init, ["systemctl", "stop", unit], timeout=30)
            machine.nsexec(init, ["systemctl", "reset-failed", unit], timeout=30)
        for argv in machine.cut_argvs(h, on=False):
            _sys.run(argv, timeout=15, what=f"{name}: clearing the network fault", check=False)
        faults_file(paths, name).write_text("")
        return []
    if fault_name in PROCESS_FAULTS:
        _start_fault_process(paths, name, init, fault_name)
    if fault_name in NETWORK_FAULTS:
        for argv in machine.cut_argvs(h, on=True):
            _sys.run(argv, timeout=15, what=f"{name}: the {fault_name} fault")
    entry = (fault_name + (f"={seconds:g}" if seconds is not None else "")
             + (EVERY_START if every_start and fault_name in FILE_FAULTS else ""))
    current = [f for f in current if f.removesuffix(EVERY_START).split("=")[0] != fault_name] + [entry]
    faults_file(paths, name).write_text("".join(f + "\n" for f in current))
    return current


def _start_fault_process(paths: Paths, name: str, init: int, fault_name: str) -> None:
    profile = _profiles([name], paths)[name]
    unit = FAULT_UNITS[fault_name]
    if fault_name == "port-busy":
        listen = profile.service.listen_host if profile.service.listen_host not in ("0.0.0.0", "::") else "0.0.0.0"
        argv = ["/usr/bin/python3", f"{payload.LAB_LIB}/sglang_standin/squat.py", listen, str(profile.service.port)]
    else:
        card = "1" if fault_name == "stray-gpu-card1" else "0"
        # card 1's stray holds most of it: a TP service's every rank is then sized from that card
        mib = int(profile.gpu.memory_mib * (STRAY_SHARE_CARD1 if card == "1" else STRAY_SHARE))
        argv = [f"{payload.VENV}/bin/python", "-m", "sglang_standin.hold", str(mib), card]
    machine.nsexec(init, ["systemctl", "stop", unit], timeout=30)
    machine.nsexec(init, ["systemctl", "reset-failed", unit], timeout=30)
    res = machine.nsexec(init, ["systemd-run", f"--unit={unit}", "--description=ddtree-ops lab fault " + fault_name,
                                *argv], timeout=30)
    if res.returncode != 0:
        raise LabError(f"{name}: could not start the {fault_name} process: {res.stderr.strip()}")
    if fault_name != "port-busy":
        # the fault is set once the memory is held: the next command must meet it, not race it
        wait = ('pid=$(systemctl show -p MainPID --value "$1"); for i in $(seq 100); do '
                'for f in /run/ddtree-lab/gpu/"$pid".json /run/ddtree-lab/gpu/"$pid".card*.json; do '
                '[ "$pid" != 0 ] && [ -e "$f" ] && exit 0; done; '
                'sleep 0.1; done; exit 1')
        if machine.nsexec(init, ["sh", "-c", wait, "sh", unit], timeout=30).returncode != 0:
            raise LabError(f"{name}: the {fault_name} process did not register its GPU memory within 10 s")


LOAD_UNIT = "ddtree-lab-load.service"


@dataclass
class LoadPlan:
    seconds: float = 60.0
    clients: int = 1
    batch: int = 4            # prompts a request (one batch): the lab profiles' max_running_requests
    max_new_tokens: int = 256


def load_argv(port: int, plan: LoadPlan, python: str = "/usr/bin/python3") -> list[str]:
    """The load's command in the host, with PYTHONPATH at the lab's copy of the stand-in package. As a
    module: run as a file, its directory would come first on sys.path, and the stand-in's own
    `http.py` would shadow the standard library's `http` that urllib imports."""
    return [python, "-m", "sglang_standin.load", str(port), f"{plan.seconds:g}", str(plan.clients),
            str(plan.batch), str(plan.max_new_tokens)]


def load(name: str, plan: LoadPlan, paths: Paths | None = None, *, wait: bool = False) -> str:
    """Traffic for HOST's service for `plan.seconds`: a transient unit inside the host (so it goes on
    through a restart of the service, and after this returns) running `standin/load.py` against the
    service's port. A load already running there is replaced. Returns what it started, or with
    `wait` the count it printed when it ended."""
    paths = paths or Paths.default()
    _sys.require_root()
    _h, init = _host(paths, name)
    port = _profiles([name], paths)[name].service.port
    stop_load(name, paths)
    res = machine.nsexec(init, ["systemd-run", f"--unit={LOAD_UNIT}", "--description=ddtree-ops lab load",
                                f"--property=RuntimeMaxSec={int(plan.seconds) + 150}",
                                f"--setenv=PYTHONPATH={payload.LAB_LIB}", *load_argv(port, plan)], timeout=30)
    if res.returncode != 0:
        raise LabError(f"{name}: could not start the load: {res.stderr.strip()}")
    what = (f"{name}: load for {plan.seconds:g} s on port {port} ({plan.clients} clients x {plan.batch} greedy "
            f"prompts of {plan.max_new_tokens} tokens a request), {LOAD_UNIT}")
    if not wait:
        return what
    deadline = time.monotonic() + plan.seconds + 180
    while time.monotonic() < deadline:
        state = machine.nsexec(init, ["systemctl", "is-active", LOAD_UNIT], timeout=30).stdout.strip()
        if state not in ("active", "activating", "deactivating"):
            break
        time.sleep(1.0)
    out = machine.nsexec(init, ["journalctl", "-u", LOAD_UNIT, "-o", "cat", "--no-pager", "-n", "20"], timeout=30)
    done = [ln for ln in out.stdout.splitlines() if ln.startswith("ddtree-lab load:")]
    return f"{name}: {done[-1]}" if done else f"{name}: the load ended without its count ({what})"


def stop_load(name: str, paths: Paths | None = None) -> None:
    paths = paths or Paths.default()
    _h, init = _host(paths, name)
    machine.nsexec(init, ["systemctl", "stop", LOAD_UNIT], timeout=30)
    machine.nsexec(init, ["systemctl", "reset-failed", LOAD_UNIT], timeout=30)


def exec_in(name: str, argv: Sequence[str], paths: Paths | None = None, *, timeout: float = 60.0,
            input: bytes | None = None) -> Any:
    """Machine-level command in a lab host (tests' setup only)."""
    paths = paths or Paths.default()
    _h, init = _host(paths, name)
    return machine.nsexec(init, argv, timeout=timeout, input=input)


class Lab:
    """A running lab, as tests use it (the `lab` fixture in tests/conftest.py hands one out).

    ssh_config / known_hosts  paths for `--ssh-config`, DDTREE_OPS_SSH_CONFIG, `ssh -F`
    hosts                     ["ct129", "ct200"] and any extra hosts (grow(count) boots more)
    inventory                 the lab's Ansible inventory (groups lab, a6000, pro6000)
    address(host)             its address (10.200.0.N)
    connect(host)             the tool's own Host (ddtree_ops.ssh) over real SSH; a context manager
    fault(host, name)         inject a fault for the next service start (every_start=True: every start;
                              seconds=S: how long slow-start / crash-after-ready last); clear(host) removes all
    load(host, plan)          traffic for the host's service (a transient unit in the host); stop_load(host)
    restore(host)             clear faults and reinstall + restart the NEXTN service, healthy
    unseed(host)              remove the NEXTN service: a fresh host with SGLang and models but no unit
    exec(host, argv)          machine-level command inside the host (test setup only, not the tool's path)
    env                       {"DDTREE_OPS_SSH_CONFIG": ..., "DDTREE_OPS_INVENTORY": ...} for a subprocess
    """

    def __init__(self, paths: Paths | None = None) -> None:
        self.paths = paths or Paths.default()

    @property
    def hosts(self) -> list[str]:
        """Every host of the lab as it stands: ct129, ct200 and any extra ones (`up(count=N)`)."""
        return running_hosts(self.paths)

    def grow(self, count: int) -> list[str]:
        """At least `count` hosts up (only the missing ones boot); returns the lab's hosts."""
        up(self.paths, count=count, log=lambda _m: None)
        return self.hosts

    @property
    def inventory(self) -> Path:
        return self.paths.inventory

    @property
    def ssh_config(self) -> Path:
        return self.paths.ssh_config

    @property
    def known_hosts(self) -> Path:
        return self.paths.known_hosts

    @property
    def env(self) -> dict[str, str]:
        return {ENV_VAR: str(self.paths.ssh_config), ENV_INVENTORY: str(self.paths.inventory)}

    def address(self, host: str) -> str:
        return address_of(host)

    def connect(self, host: str) -> Any:
        return connect(self.paths, host)

    def fault(self, host: str, name: str, *, every_start: bool = False, seconds: float | None = None) -> list[str]:
        return fault(host, name, self.paths, every_start=every_start, seconds=seconds)

    def clear(self, host: str) -> None:
        fault(host, "clear", self.paths)

    def restore(self, host: str) -> None:
        self.clear(host)
        profile = _profiles([host], self.paths)[host]
        with self.connect(host) as conn:
            conn.run(["systemctl", "stop", profile.service.unit], timeout=60)
            seed_nextn(conn, profile)

    def unseed(self, host: str) -> None:
        with self.connect(host) as conn:
            unseed(conn, _profiles([host], self.paths)[host])

    def exec(self, host: str, argv: Sequence[str], *, timeout: float = 60.0, input: bytes | None = None) -> Any:
        return exec_in(host, argv, self.paths, timeout=timeout, input=input)

    def faults(self, host: str) -> list[str]:
        return read_faults(self.paths, host)

    def load(self, host: str, plan: LoadPlan | None = None, *, wait: bool = False) -> str:
        return load(host, plan or LoadPlan(), self.paths, wait=wait)

    def stop_load(self, host: str) -> None:
        stop_load(host, self.paths)
