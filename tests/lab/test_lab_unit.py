"""The lab's own logic without booting anything: addresses, argv as data, ssh files, validation."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ddtree_ops.errors import UsageError
from ddtree_ops.lab import _sys, api, hosts, machine, payload, tree
from ddtree_ops.lab.paths import Paths


def test_addresses_and_names() -> None:
    assert hosts.address_of("ct129") == "10.200.0.129" and hosts.address_of("ct200") == "10.200.0.200"
    h = machine.host_state(Paths(Path("/x")), "ct129")
    assert (h.netns, h.veth, h.root) == ("ct129", "vh-ct129", "/x/run/ct129/root")


def test_network_and_boot_argv() -> None:
    h = machine.host_state(Paths(Path("/x")), "ct200")
    argvs = machine.netns_argvs(h)
    assert argvs[0] == ["ip", "netns", "add", "ct200"]
    assert ["ip", "-n", "ct200", "addr", "add", "10.200.0.200/32", "dev", "eth0"] in argvs
    assert argvs[-1] == ["ip", "route", "replace", "10.200.0.200/32", "dev", "vh-ct200"]
    # the lab hosts reach one another through the root namespace (multi-node rendezvous)
    assert ["sysctl", "-q", "-w", "net.ipv4.conf.vh-ct200.proxy_arp=1"] in argvs
    boot = machine.nspawn_argv(h)
    assert boot[:3] == ["systemd-nspawn", "-D", "/x/run/ct200/root"]
    assert {"--boot", "--register=no", "--keep-unit", "--network-namespace-path=/run/netns/ct200",
            "--hostname=ct200"} <= set(boot)


HYBRID_MOUNTINFO = """\
30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec - cgroup2 cgroup2 rw,nsdelegate
32 30 0:28 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec - cgroup cgroup rw,xattr,name=systemd
33 30 0:29 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec - cgroup cgroup rw,memory
"""


def test_each_host_boots_in_its_own_cgroups() -> None:
    # two containers started from one cgroup share nspawn's `payload` and race at boot (219/CGROUP)
    cg = "9:name=systemd:/ci\n4:memory:/job/7\n0::/ci\n"
    assert machine.cgroup_dirs("ct129", HYBRID_MOUNTINFO, cg) == [
        "/sys/fs/cgroup/systemd/ci/ddtree-lab-ct129", "/sys/fs/cgroup/unified/ci/ddtree-lab-ct129"]
    v2 = "40 25 0:30 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n"
    assert machine.cgroup_dirs("ct200", v2, "0::/user.slice/session-3.scope\n") == [
        "/sys/fs/cgroup/user.slice/session-3.scope/ddtree-lab-ct200"]
    h = machine.host_state(Paths(Path("/x")), "ct200")
    h.cgroups = ["/cg/a/ddtree-lab-ct200", "/cg/b/ddtree-lab-ct200"]
    argv = machine.nspawn_argv(h)
    assert argv[:2] == ["sh", "-c"] and argv[3:] == ["sh", "/cg/a/ddtree-lab-ct200/cgroup.procs",
                                                     "/cg/b/ddtree-lab-ct200/cgroup.procs"]
    assert argv[2].endswith("exec systemd-nspawn -D /x/run/ct200/root --boot --register=no --keep-unit "
                            "--network-namespace-path=/run/netns/ct200 --console=pipe -M ct200 --hostname=ct200")


def test_ssh_files(tmp_path: Path) -> None:
    paths = Paths(tmp_path)
    machine.ensure_keys(paths, ["ct129"])
    machine.write_ssh_files(paths, [machine.host_state(paths, "ct129")])
    cfg = paths.ssh_config.read_text()
    for line in ("Host ct129", "HostName 10.200.0.129", "User root", "Port 22", f"IdentityFile {paths.client_key}",
                 f"UserKnownHostsFile {paths.known_hosts}", "StrictHostKeyChecking yes"):
        assert f"  {line}" in cfg or line in cfg
    pub = (tmp_path / "keys" / "host_ct129_ed25519.pub").read_text().split()
    assert paths.known_hosts.read_text() == f"ct129,10.200.0.129 {pub[0]} {pub[1]}\n"
    # OpenSSH reads the config the same way
    out = subprocess.run(["ssh", "-G", "-F", str(paths.ssh_config), "ct129"], capture_output=True, text=True).stdout
    assert "hostname 10.200.0.129" in out and "stricthostkeychecking true" in out


def test_env_line() -> None:
    assert api.env_line(Paths(Path("/srv/lab"))) == ("export DDTREE_OPS_SSH_CONFIG=/srv/lab/ssh_config "
                                                     "DDTREE_OPS_INVENTORY=/srv/lab/inventory.yml")


@pytest.mark.skipif(os.geteuid() != 0, reason="fault checks root first")
def test_unknown_fault_and_host_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="unknown fault 'bogus'"):
        api.fault("ct129", "bogus")
    with pytest.raises(UsageError, match="unknown lab host"):
        api.fault("ct999", "hang")
    # a length only for the faults that last a while, and a sane one (checked before any host is touched)
    with pytest.raises(UsageError, match="fault 'hang' takes no length; only slow-start, crash-after-ready do"):
        api.fault("ct129", "hang", seconds=3)
    with pytest.raises(UsageError, match=r"a length of 0 s is not in \(0, 3600\]"):
        api.fault("ct129", "slow-start", seconds=0)


def test_not_root_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(_sys.LabError, match="needs root"):
        _sys.require_root()


def test_every_step_has_a_deadline() -> None:
    with pytest.raises(_sys.LabError, match="timed out after 0.2s"):
        _sys.run(["sleep", "5"], timeout=0.2)


def test_recipe_id_is_stable_and_the_payload_is_complete() -> None:
    assert tree.recipe_id() == tree.recipe_id() and len(tree.recipe_id()) == 16
    for name in payload.STANDIN_FILES:
        assert (payload.STANDIN / name).is_file(), name
    facts = payload.gpu_facts("ct200", type("G", (), {"arch": "sm_120", "model": "NVIDIA RTX PRO 6000 Blackwell",
                                                     "memory_mib": 97887})())
    assert facts["compute_cap"] == "12.0" and facts["power_limit_w"] == 600 and facts["uuid"].startswith("GPU-")


def test_the_payload_carries_every_module_the_standin_imports() -> None:
    """The stand-in runs on the lab hosts from the copied files alone: a module of its own that
    `server.py` (or `nvidia_smi.py`) reaches through a relative import and that is not copied would
    fail there, at the first start."""
    import ast

    todo, seen = ["server.py", "nvidia_smi.py"], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in ast.walk(ast.parse((payload.STANDIN / name).read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                names = [node.module] if node.module else [a.name for a in node.names]
                todo += [f"{n}.py" for n in names if (payload.STANDIN / f"{n}.py").is_file()]
    assert seen - set(payload.STANDIN_FILES) == set()


def test_the_lab_venv_pauses_the_collector_for_the_standins_command_line_only(tmp_path: Path) -> None:
    """The payload's .pth turns Python's cyclic collector off at interpreter start for `python -m
    sglang.launch_server` (the stand-in's own code turns it on after the parse; the import of the sglang
    package, which runs first, cost a sixth more CPU with it on), and for no other command."""
    venv = tmp_path / "tree" / payload.VENV.lstrip("/")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    pkg = payload.site_packages(tmp_path / "tree") / "sglang"
    pkg.mkdir()
    (pkg / "launch_server.py").write_text("")
    # sglang's package is imported before launch_server runs: it says what it found, and ends the process there
    (pkg / "__init__.py").write_text('import gc, os\nprint("on" if gc.isenabled() else "off", flush=True)\nos._exit(0)\n')
    (tmp_path / "tree" / "usr" / "bin").mkdir(parents=True)        # where the nvidia-smi stand-in goes
    payload.install_shared(tmp_path / "tree")

    def collector(*argv: str) -> str:
        return subprocess.run([str(venv / "bin" / "python"), *argv], capture_output=True, text=True,
                              timeout=60, check=True).stdout.strip()

    assert collector("-m", "sglang.launch_server", "--model-path", "/models/x") == "off"
    assert collector("-c", "import sglang") == collector("-m", "sglang") == "on"


def test_extra_hosts_take_both_classes_in_turn_and_an_inventory_names_them(tmp_path: Path) -> None:
    from ddtree_ops.config.inventory import Inventory

    six = hosts.lab_hosts(6)
    assert six == ["ct129", "ct200", "ct130", "ct201", "ct131", "ct202"]
    assert [hosts.address_of(h) for h in six[2:4]] == ["10.200.0.130", "10.200.0.201"]
    path = tmp_path / "inventory.yml"
    path.write_text(hosts.inventory_text(six, "ddtree-ops lab up --hosts 6"))
    inv = Inventory.load(Path(__file__).resolve().parents[2] / "profiles", path)
    assert inv.members("lab") == six
    assert inv.members("a6000") == ["ct129", "ct130", "ct131"] and inv.members("pro6000") == ["ct200", "ct201", "ct202"]
    assert (inv.profile("ct130").gpu.arch, inv.profile("ct202").gpu.arch) == ("sm_86", "sm_120")
    with pytest.raises(Exception, match="1 to 64"):
        hosts.lab_hosts(65)


def test_the_lab_goes_down_with_the_last_process_of_the_run_that_booted_it(tmp_path: Path) -> None:
    """Two workers of one run share the lab: the first to ask boots it, the first to leave keeps it up
    for the other, the last one takes it down; a lab some other run booted is left up."""
    from labkit import LabUse

    up, downs = [], []
    lab_state = {"up": False}

    def boot(count: int) -> None:
        up.append(count)
        lab_state["up"] = True

    run = tmp_path / "run"
    run.mkdir()
    a, b = LabUse(run, tmp_path), LabUse(run, tmp_path)
    a.bring_up(lambda: lab_state["up"], boot, 6)
    b.bring_up(lambda: lab_state["up"], boot, 6)
    assert up == [6, 6]                              # up() itself boots only what is missing
    assert a.leave(lambda: downs.append("a")) is False and downs == []     # b still uses it
    assert b.leave(lambda: downs.append("b")) is True and downs == ["b"]
    other = tmp_path / "other-run"
    other.mkdir()
    c = LabUse(other, tmp_path)
    c.bring_up(lambda: True, lambda _n: None, 2)     # found up: booted by someone else
    assert c.leave(lambda: downs.append("c")) is False and downs == ["b"]


def test_a_held_host_waits_for_its_holder_and_other_hosts_do_not(tmp_path: Path) -> None:
    import threading
    import time

    from labkit import hosts_held

    events: list[str] = []
    with hosts_held(["ct200", "ct129"], tmp_path):
        def other(hosts: list[str], name: str) -> None:
            with hosts_held(hosts, tmp_path):
                events.append(name)

        t1 = threading.Thread(target=other, args=(["ct129"], "ct129 got it"))
        t2 = threading.Thread(target=other, args=(["ct130"], "ct130 got it"))
        t1.start()
        t2.start()
        t2.join(5)
        time.sleep(0.3)
        assert events == ["ct130 got it"]          # ct129 is held by this block
    t1.join(5)
    assert events == ["ct130 got it", "ct129 got it"]


def test_the_lab_groups_follow_the_hosts_their_tests_hold() -> None:
    """One worker per busy host, so no worker waits for another's tests on a host it alone uses: ct129's
    tests in one group, ct200's in another; those on both after ct129's own (by then ct200's worker is done
    or nearly, so the two meet once, not every time one test meets the other); the grown hosts' and the
    host-less in a third; the whole-lab test last in ct129's."""
    from labkit import LAB_GROUPS, lab_group

    assert [lab_group(h) for h in (["ct129"], ["ct200"], ["ct200", "ct129"])] == [
        ("lab-ct129", 0), ("lab-ct200", 1), ("lab-ct129", 1)]
    assert lab_group(["ct201", "ct202"]) == lab_group(["ct130", "ct201", "ct131"]) == lab_group([]) == ("lab-grown", 1)
    assert lab_group(["ct129", "ct200", "ct130"], whole_lab=True) == ("lab-ct129", 2)
    assert LAB_GROUPS[0] == "lab-ct129"  # the longest group is handed out first


def test_the_files_with_slow_tests_go_first_beside_the_lab() -> None:
    """A file with one slow test is a long group: it goes before the files without, all in collection order."""
    from labkit import slow_files_first

    files = ["a.py", "b.py", "b.py", "c.py", "d.py", "b.py"]
    order = slow_files_first(files, [False, False, True, False, True, False])
    assert [files[i] for i in order] == ["b.py", "b.py", "d.py", "b.py", "a.py", "c.py"]
    assert order[:3] == [1, 2, 4]


def test_a_whole_lab_test_waits_until_no_other_process_has_lab_tests_left(tmp_path: Path) -> None:
    """The lifecycle test took the lab down while two other workers still had lab tests to run (a CI
    run of 2026-12-05): it waits now for every other holder's lab tests to run out, its own let go."""
    import threading
    import time

    from labkit import LabTests

    mine, other = LabTests(tmp_path), LabTests(tmp_path)  # two workers (flock is per open file)
    mine.running()
    other.running()
    events: list[str] = []

    def whole_lab() -> None:
        with mine.alone():
            events.append("alone")

    t = threading.Thread(target=whole_lab)
    t.start()
    time.sleep(0.5)
    assert events == []                      # the other worker still has lab tests
    other.running()                          # its next lab test: still the same hold
    time.sleep(0.2)
    assert events == []
    other.done()
    t.join(5)
    assert events == ["alone"]


def test_the_wheels_are_fetched_while_the_debian_tree_is_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cold build's two downloads overlap (about 12 s of a CI run's first `lab up`): the Debian tree
    waits here until the wheelhouse has started, which it never would if they ran one after the other."""
    import threading

    started = threading.Event()
    steps: list[str] = []

    def wheelhouse(paths: Paths) -> None:
        started.set()
        steps.append("wheels")

    def bootstrap(target: Path) -> None:
        assert started.wait(5), "the wheels were not fetched while the Debian tree was built"
        target.mkdir(parents=True)
        steps.append("debian")

    monkeypatch.setattr(tree, "_wheelhouse", wheelhouse)
    monkeypatch.setattr(tree, "_bootstrap", bootstrap)
    monkeypatch.setattr(tree, "_configure", lambda root: steps.append("configure"))
    monkeypatch.setattr(tree, "_venv", lambda root, wheelhouse: steps.append("venv"))
    paths = Paths(tmp_path / "lab")
    assert tree.ensure_tree(paths, log=lambda _m: None)
    assert steps == ["wheels", "debian", "configure", "venv"] and tree.is_current(paths)


def test_the_tree_builds_before_the_virtualenv_exists() -> None:
    """`make test` builds the tree beside `make install` with the bare interpreter: the modules it runs
    import nothing outside the standard library (-S: no site-packages at all)."""
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-S", "-c", "import ddtree_ops.lab.tree, ddtree_ops.lab._sys"],
                          capture_output=True, text=True, cwd=repo, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_tree_command_builds_once_and_reports_a_failure(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    built: list[Paths] = []

    def ensure(paths: Paths, *, log: Any) -> bool:
        built.append(paths)
        log("lab tree ready in 1s")
        return True

    monkeypatch.setattr(tree.os, "geteuid", lambda: 0)
    monkeypatch.setattr(tree, "ensure_tree", ensure)
    assert tree.main([]) == 0 and built == [Paths.default()]
    assert "lab tree ready" in capsys.readouterr().err
    monkeypatch.setattr(tree, "ensure_tree", lambda paths, *, log: False)
    assert tree.main([]) == 0 and "cached and current" in capsys.readouterr().err

    def broken(paths: Paths, *, log: Any) -> bool:
        raise _sys.LabError("mmdebstrap failed (exit 1): no network")

    monkeypatch.setattr(tree, "ensure_tree", broken)
    assert tree.main([]) == 1 and "error: mmdebstrap failed (exit 1): no network" in capsys.readouterr().err
    monkeypatch.setattr(tree.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(tree, "ensure_tree", ensure)
    assert tree.main([]) == 0 and len(built) == 1 and "needs root" in capsys.readouterr().err
    assert tree.main(["x"]) == 64
