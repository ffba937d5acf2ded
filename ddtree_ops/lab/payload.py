"""What `lab up` copies into the cached tree and into each host before it boots.

Shared (into the tree, cheap, refreshed on every `up`): the SGLang stand-in package, the shim that
replaces `sglang.launch_server`, the nvidia-smi stand-in, the model config fixtures, a README.
Per host (into the host's own overlay): its simulated GPU, its SSH host key, the lab's client key,
an empty fault list.
"""

from __future__ import annotations

import glob
import json
import shutil
import uuid
from pathlib import Path

from ddtree_ops.lab._sys import LabError
from ddtree_ops.lab.hosts import MAX_HOSTS, address_of, lab_hosts

HERE = Path(__file__).resolve().parent
STANDIN = HERE / "standin"
FIXTURES = HERE / "fixtures"
VENV = "/opt/sglang/venv"
LAB_LIB = "/usr/lib/ddtree-lab"
DRIVER_VERSION = "570.172.08"
CUDA_VERSION = "12.8"
_COMPUTE_CAP = {"sm_80": "8.0", "sm_86": "8.6", "sm_89": "8.9", "sm_90": "9.0", "sm_100": "10.0", "sm_120": "12.0"}
# Run by site at every start of the lab venv's python: for the stand-in's command line only, the cyclic
# garbage collector is off while `python -m sglang.launch_server` imports the sglang package (torch with
# it), before the stand-in's own code runs; the stand-in turns it on again once the argv is parsed
# (sglang_standin.server.collector_paused, which says why). Every other command keeps Python's default.
GC_PTH_NAME = "ddtree_lab_standin_gc.pth"
GC_PTH = 'import sys, gc; gc.disable() if "sglang.launch_server" in sys.orig_argv else None\n'
STANDIN_FILES = ("__init__.py", "simgpu.py", "nvidia_smi.py", "memory.py", "behaviour.py", "textgen.py",
                 "sglog.py", "lines.py", "shadow.py", "http.py", "server.py", "scheduler.py", "startup.py",
                 "faults.py", "nodes.py", "serving.py", "hold.py", "squat.py", "ranks.py", "treesim.py",
                 "load.py")
# the stand-in declares its simulated tree verify to the ddtree plugin (DDTREE_MODE=tree) as a package
# would: an entry point in its own dist-info (see ddtree_ops/engine/sglang_backend.py)
STANDIN_DIST = "sglang_standin-0.0.0.dist-info"
STANDIN_ENTRY_POINTS = "[ddtree_ops.tree_verify]\n* = sglang_standin.treesim:SimTreeVerify\n"
README = """ddtree-ops LAB HOST (a container on the operator's machine, not a GPU host)

Real: systemd (PID 1), journald, sshd, the sglang 0.5.23 package in /opt/sglang/venv (its argument
parser, plugin loader and speculative-algorithm registry run for real).
STAND-IN: `python -m sglang.launch_server` (the module is replaced by a shim that runs sglang_standin:
no model is loaded, the KV pool is sized with SGLang's formula against the simulated GPU, the log lines
are what real SGLang 0.5.17 printed on an H200 for the same scenario, the endpoints answer in SGLang's
shapes; with the ddtree plugin installed its shadow accounting, or its tree serving through the stand-in's
simulated tree verify, runs on simulated rounds) and /usr/bin/nvidia-smi (reads /etc/ddtree-lab/gpu.json and the
processes registered in /run/ddtree-lab/gpu/). NVML is not simulated: pynvml fails with
NVMLError_LibraryNotFound as on a host without the NVIDIA driver.
Faults for the next service start: /var/lib/ddtree-lab/faults (set with `ddtree-ops lab fault HOST NAME`).
"""


def site_packages(tree: Path) -> Path:
    found = glob.glob(str(tree / VENV.lstrip("/") / "lib" / "python3.*" / "site-packages"))
    if not found:
        raise LabError(f"the lab tree has no {VENV}; remove {tree} and run `ddtree-ops lab up` to rebuild it")
    return Path(found[0])


def _copy_package(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name in STANDIN_FILES:
        shutil.copy2(STANDIN / name, dest / name)
    shutil.rmtree(dest / "__pycache__", ignore_errors=True)


def install_shared(tree: Path) -> None:
    sp = site_packages(tree)
    _copy_package(sp / "sglang_standin")
    (sp / GC_PTH_NAME).write_text(GC_PTH)
    dist = sp / STANDIN_DIST
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang-standin\nVersion: 0.0.0\n"
                                   "Summary: ddtree-ops LAB STAND-IN for sglang.launch_server\n")
    (dist / "entry_points.txt").write_text(STANDIN_ENTRY_POINTS)
    # nvidia-smi's stand-in runs on the system python, beside a copy of the package
    _copy_package(tree / LAB_LIB.lstrip("/") / "sglang_standin")
    launcher = sp / "sglang" / "launch_server.py"
    original = sp / "sglang" / "launch_server.py.sglang-0.5.23"
    if not original.exists():
        shutil.copy2(launcher, original)  # kept for reference: the real module this shim replaces
    shutil.copy2(STANDIN / "launch_server_shim.py", launcher)
    for pyc in glob.glob(str(sp / "sglang" / "__pycache__" / "launch_server.*")):
        Path(pyc).unlink()
    smi = tree / "usr/bin/nvidia-smi"
    smi.write_text("#!/usr/bin/python3\n# ddtree-ops LAB STAND-IN for nvidia-smi (simulated GPU; see /etc/ddtree-lab/README)\n"
                   f"import sys\nsys.path.insert(0, {LAB_LIB!r})\nfrom sglang_standin.nvidia_smi import main\n"
                   "sys.exit(main())\n")
    smi.chmod(0o755)
    models = tree / "models"
    for fixture in sorted(p for p in FIXTURES.iterdir() if p.is_dir()):
        dest = models / fixture.name
        dest.mkdir(parents=True, exist_ok=True)
        for f in fixture.iterdir():
            shutil.copy2(f, dest / f.name)
    readme = tree / "etc/ddtree-lab/README"
    readme.parent.mkdir(parents=True, exist_ok=True)
    readme.write_text(README)


def gpu_facts(host: str, gpu: object) -> dict[str, object]:
    """The simulated cards, from the host profile's gpu section (`count` of them, alike): card 0's
    facts at the top level, every card under `cards`."""
    arch = str(getattr(gpu, "arch"))
    name = str(getattr(gpu, "model"))
    cards = []
    for i in range(int(getattr(gpu, "count", 1) or 1)):
        tag = f"{host}.ddtree-lab" if i == 0 else f"{host}.card{i}.ddtree-lab"  # card 0 keeps its old uuid
        cards.append({"index": i, "name": name, "uuid": "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, tag)),
                      "memory_mib": int(getattr(gpu, "memory_mib")),
                      "compute_cap": _COMPUTE_CAP.get(arch, arch[3:-1] + "." + arch[-1]),
                      "arch": arch, "driver_version": DRIVER_VERSION, "cuda_version": CUDA_VERSION,
                      "pci_bus_id": f"00000000:{i + 1:02X}:00.0", "power_limit_w": 600 if "Blackwell" in name else 300})
    return {**cards[0], "cards": cards, "standin": "ddtree-ops LAB: simulated GPU, no device behind it"}


def install_host(root: Path, host: str, profile: object, *, host_key: Path, client_pub: Path) -> None:
    etc = root / "etc"
    lab = etc / "ddtree-lab"
    lab.mkdir(parents=True, exist_ok=True)
    (lab / "gpu.json").write_text(json.dumps(gpu_facts(host, getattr(profile, "gpu")), indent=2) + "\n")
    (lab / "faults").write_text("")
    for src, dest, mode in ((host_key, etc / "ssh/ssh_host_ed25519_key", 0o600),
                            (host_key.with_name(host_key.name + ".pub"), etc / "ssh/ssh_host_ed25519_key.pub", 0o644)):
        shutil.copyfile(src, dest)
        dest.chmod(mode)
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(client_pub.read_text())
    (ssh_dir / "authorized_keys").chmod(0o600)
    # every lab host's name, as a site's DNS would give them (a multi-node service's
    # --dist-init-addr names rank 0's host); this host's own name is its lab address
    names = "".join(f"{address_of(h)}\t{h}\n" for h in lab_hosts(MAX_HOSTS))
    (etc / "hosts").write_text(f"127.0.0.1\tlocalhost\n{names}::1\tlocalhost ip6-localhost ip6-loopback\n")
