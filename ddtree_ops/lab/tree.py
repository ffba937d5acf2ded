"""The lab's Debian tree: built once with mmdebstrap, cached, shared read-only by every host.

What a real GPU host running SGLang has, minus the GPU: systemd, journald, sshd, curl, Debian's own
python3 (3.11) and `/opt/sglang/venv` with the REAL sglang 0.5.23 (installed --no-deps, as on a CPU
box) plus what its argument parser and plugin loader import (torch CPU, triton, small deps) and pip.
The tree is rebuilt only when RECIPE changes; the small payload (the SGLang stand-in, the nvidia-smi
stand-in, model config fixtures) is refreshed on every `lab up`, so editing the stand-in never costs
a rebuild.
"""

from __future__ import annotations

import concurrent.futures
import glob
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

from ddtree_ops.lab import _sys
from ddtree_ops.lab._sys import LabError
from ddtree_ops.lab.paths import Paths

SUITE = "bookworm"
MIRROR = os.environ.get("DDTREE_LAB_MIRROR", "http://deb.debian.org/debian")
DEBIAN_PACKAGES = ("systemd", "systemd-sysv", "dbus", "openssh-server", "iproute2", "python3", "python3-venv",
                   "curl", "ca-certificates", "procps", "sudo")
VENV = "/opt/sglang/venv"
# pip resolves these with their dependencies (all small except torch, the local CPU wheel) ...
VENV_WITH_DEPS = ("torch==2.13.0", "numpy", "nvidia-ml-py", "psutil", "packaging", "orjson", "pybase64",
                  "requests", "pillow", "starlette", "anyio", "msgspec", "pydantic", "pyzmq", "tqdm", "IPython",
                  "aiohttp")
# ... and these without: sglang pins a CUDA torch and flashinfer/sgl-kernel that cannot run here
VENV_NO_DEPS = ("sglang==0.5.23", "triton==3.9.0")
# what the stand-in imports: the build fails unless these import
IMPORT_CHECK = ("from sglang.srt.server_args import prepare_server_args; "
                "from sglang.srt.speculative.spec_info import SpeculativeAlgorithm; "
                "from sglang.srt.speculative.spec_registry import CustomSpecAlgo; "
                "from sglang.srt.plugins import load_plugins; print('sglang-import-ok')")
# The venv is installed with --no-compile (pip byte-compiles all ~12,000 modules, torch's and sympy's
# included) and then compiled by importing what the hosts import (~2,800 modules, torch's share included):
# the stand-in's SGLang path above and what the ddtree plugin reaches in SGLang when a host serves it.
# A module left out is compiled by each host into its own overlay at each boot, so the list is checked:
# tests/lab/test_lab_ddtree.py finds no bytecode a host wrote into the shared venv. Each import may
# fail on a CPU box part way (no CUDA kernels): what it reached is compiled by then. (--no-compile with
# only IMPORT_CHECK compiled cost more than it saved: the stand-in's CPU in `make test` rose from 283 s to
# 324 s, runs 23 and 25 in bench/results/make_test/.)
WARM_IMPORTS = ("sglang.srt.server_args", "sglang.srt.plugins", "sglang.srt.speculative.spec_info",
                "sglang.srt.speculative.spec_registry", "sglang.srt.arg_groups.speculative_hook",
                "sglang.srt.arg_groups.overrides", "sglang.srt.arg_groups.model_override_base",
                "sglang.srt.speculative.dflash_worker_v2", "sglang.srt.speculative.dflash_info_v2",
                "sglang.srt.speculative.dflash_info", "sglang.srt.speculative.dflash_utils",
                "sglang.srt.model_executor.forward_batch_info", "sglang.srt.mem_cache.allocation",
                "sglang.srt.managers.overlap_utils",
                "sglang.kernels.ops.speculative.cache_locs", "sglang.kernels.ops.kv_canary.consts",
                "sglang.srt.parser.reasoning_parser_names", "sglang.srt.function_call.parser_names",
                "sglang.srt.sampling.watermarking.core", "msgspec", "tqdm", "numpy", "psutil", "pynvml")
WARM = ("import importlib\n"
        f"for m in {WARM_IMPORTS!r}:\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except BaseException as exc:\n"
        "        print('warm import stopped:', m, type(exc).__name__)\n")

RECIPE = {"version": 3, "builder": "mmdebstrap", "suite": SUITE, "packages": DEBIAN_PACKAGES, "venv": VENV,
          "with_deps": VENV_WITH_DEPS, "no_deps": VENV_NO_DEPS, "compiled_by_importing": WARM_IMPORTS}


def recipe_id() -> str:
    return hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode()).hexdigest()[:16]


def is_current(paths: Paths) -> bool:
    try:
        return paths.tree_stamp.read_text().strip() == recipe_id()
    except OSError:
        return False


def ensure_tree(paths: Paths, *, log=print) -> bool:
    """Build the tree unless a current one is cached. Returns True when it was (re)built."""
    if is_current(paths):
        return False
    t0 = time.monotonic()
    partial = paths.home / "tree.partial"
    _remove_tree(partial)
    partial.parent.mkdir(parents=True, exist_ok=True)
    log(f"building the lab tree (mmdebstrap {SUITE} from {MIRROR}); this happens once and takes a few minutes")
    # the wheels come from PyPI while the Debian packages come from the mirror: both mostly wait on the network
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        wheels = pool.submit(_wheelhouse, paths)
        _bootstrap(partial)
        _configure(partial)
        log(f"  Debian tree done in {time.monotonic() - t0:.0f}s")
        wheels.result()
    log(f"  wheels ready after {time.monotonic() - t0:.0f}s; building {VENV} in the tree")
    _venv(partial, paths.wheelhouse)
    stamp = partial / paths.tree_stamp.relative_to(paths.tree)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(recipe_id() + "\n")
    _remove_tree(paths.tree)
    partial.rename(paths.tree)
    log(f"  lab tree ready in {time.monotonic() - t0:.0f}s ({paths.tree})")
    return True


def _remove_tree(path: Path) -> None:
    if path.exists():
        _sys.run(["rm", "-rf", "--one-file-system", str(path)], timeout=300, what=f"removing {path}")


def _bootstrap(target: Path) -> None:
    # mmdebstrap rather than debootstrap: apt's resolver and parallel downloads, one dpkg run; the same
    # minbase tree (usrmerge in place of usr-is-merged) in 19 s instead of 50 s on this box. Its
    # /etc/machine-id is empty, so each booted host gets one of its own, as real hosts have.
    argv = ["mmdebstrap", "--variant=minbase", f"--include={','.join(DEBIAN_PACKAGES)}", SUITE, str(target), MIRROR]
    try:
        _sys.run(argv, timeout=1200, what="mmdebstrap")
    except LabError as exc:
        raise LabError(str(exc), hint=f"check that {MIRROR} is reachable (set DDTREE_LAB_MIRROR to use another "
                                      "mirror)") from None


def _write(root: Path, rel: str, text: str, mode: int = 0o644) -> None:
    path = root / rel.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _configure(root: Path) -> None:
    # nspawn --hostname only takes effect when the tree does not name itself
    _write(root, "/etc/hostname", "")
    # openssh-server's install generated host keys; every host gets its own at `up` instead
    for key in glob.glob(str(root / "etc/ssh/ssh_host_*")):
        os.remove(key)
    _write(root, "/etc/ssh/sshd_config.d/ddtree-lab.conf",
           "# ddtree-ops lab: key-only root login, one host key per host (written at `lab up`)\n"
           "HostKey /etc/ssh/ssh_host_ed25519_key\nPermitRootLogin prohibit-password\n"
           "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUseDNS no\n")
    (root / "root/.ssh").mkdir(mode=0o700, parents=True, exist_ok=True)
    # the journal lives in RAM, bounded, as on a host without persistent journald
    _write(root, "/etc/systemd/journald.conf.d/ddtree-lab.conf",
           "[Journal]\nStorage=volatile\nRuntimeMaxUse=64M\n")
    # nothing in the lab uses these; skipping them keeps boot short and memory low
    for unit in ("apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_all.timer", "fstrim.timer",
                 "systemd-tmpfiles-clean.timer", "console-getty.service", "getty@tty1.service"):
        link = root / "etc/systemd/system" / unit
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists() and not link.is_symlink():
            link.symlink_to("/dev/null")


def _wheelhouse(paths: Paths) -> None:
    wh = paths.wheelhouse
    done = wh / ".complete"
    if done.exists() and done.read_text() == recipe_id():
        return
    wh.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet",
           "--only-binary=:all:", "--dest", str(wh)]
    _sys.run([*pip, *VENV_WITH_DEPS], timeout=900, what="pip download (lab venv wheels)")
    _sys.run([*pip, "--no-deps", *VENV_NO_DEPS], timeout=900, what="pip download (sglang, triton)")
    done.write_text(recipe_id())


def in_tree(root: Path, script: str, *, binds: dict[str, str] | None = None, timeout: float) -> str:
    """Run a shell script inside the tree (not booted): nspawn provides /proc, /dev and a private /run."""
    argv = ["systemd-nspawn", "--quiet", "--register=no", "--keep-unit", "--pipe", "-D", str(root),
            "--setenv=PIP_DISABLE_PIP_VERSION_CHECK=1", "--setenv=PIP_NO_INPUT=1"]
    for src, dst in (binds or {}).items():
        argv.append(f"--bind-ro={src}:{dst}")
    argv += ["/bin/sh", "-ec", script]
    try:
        return _sys.run(argv, timeout=timeout, what="command in the lab tree").stdout
    finally:
        cleanup_nspawn_leftovers(root.name)


def _venv(root: Path, wheelhouse: Path) -> None:
    pip = f"{VENV}/bin/pip install --quiet --no-compile --no-index --find-links /wheelhouse"
    script = "\n".join([
        f"python3 -m venv {VENV}",
        f"{pip} {' '.join(VENV_WITH_DEPS)}",
        f"{pip} --no-deps {' '.join(VENV_NO_DEPS)}",
        f"{VENV}/bin/python -c \"{IMPORT_CHECK}\"",
        f"{VENV}/bin/python - <<'EOF'\n{WARM}EOF",
    ])
    out = in_tree(root, script, binds={str(wheelhouse): "/wheelhouse"}, timeout=1500)
    if "sglang-import-ok" not in out:
        raise LabError(f"the lab venv was built but sglang does not import: {out.strip()[-300:]}")


def cleanup_nspawn_leftovers(name: str) -> None:
    """nspawn leaves /run/systemd/nspawn/propagate/<name> behind when /run is not a tmpfs (here)."""
    base = Path("/run/systemd/nspawn")
    subs = ("propagate", "unix-export", "incoming", "locks")
    for sub in subs:
        p = base / sub / name
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
    # the shared directories go too once no other container uses them (a bare /run/systemd stays)
    for sub in subs:
        d = base / sub
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()
    if base.is_dir() and not any(base.iterdir()):
        base.rmdir()


def main(argv: list[str] | None = None) -> int:
    """`python -m ddtree_ops.lab.tree`: build the lab's tree unless a current one is cached. `make test` runs it
    beside `make install`, before the project's virtualenv exists: it needs root, the lab's Debian packages
    and the standard library only. Exit 1 on a failed build (the lab tests then build it again and fail
    with the same error)."""
    if argv:
        sys.stderr.write("usage: python -m ddtree_ops.lab.tree\n")
        return 64
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731 (progress lines)
    if os.geteuid() != 0:
        say("lab tree: not built (the lab needs root)")
        return 0
    try:
        if not ensure_tree(Paths.default(), log=say):
            say("lab tree: cached and current")
    except LabError as exc:
        say(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
