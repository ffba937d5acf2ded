"""The wheel a newcomer installs renders the same unit as the checkout, from any directory.

units/ and profiles/ live at the top of the tree; the wheel carries them as data files under
<prefix>/share/ddtree-ops. This builds the wheel, installs it into a fresh venv and runs the installed
console script from outside the checkout. Its dependencies are the ones the suite runs with (this venv's,
reached through a .pth line), not what the package index offers on the day of the run, and pip checks
that they meet what the wheel declares (issue 29: nothing a test reads depends on the day)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(d), str(ROOT)], check=True, timeout=300)
    (wheel,) = d.glob("ddtree_ops-*.whl")
    venv.EnvBuilder().create(d / "venv")
    pip = [sys.executable, "-m", "pip", "--python", str(d / "venv/bin/python"), "--disable-pip-version-check"]
    subprocess.run([*pip, "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True, timeout=600)
    # after the install: pip must not meet this venv's own (editable) ddtree-ops while installing the wheel
    (site,) = (d / "venv" / "lib").glob("python3*/site-packages")
    (site / "suite-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    check = subprocess.run([*pip, "check"], capture_output=True, text=True, timeout=120)
    assert not [ln for ln in check.stdout.splitlines() if ln.startswith("ddtree-ops ")], check.stdout
    return d / "venv/bin/ddtree-ops"


@pytest.mark.parametrize("host,mode", [("ct129", "nextn"), ("ct200", "ddtree-shadow")])
def test_installed_wheel_renders_like_the_checkout(installed: Path, tmp_path: Path, host: str, mode: str) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    got = subprocess.run([str(installed), "render", host, "--mode", mode], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    want = subprocess.run([sys.executable, "-m", "ddtree_ops", "render", host, "--mode", mode], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert want.returncode == 0, want.stderr
    assert got.stdout == want.stdout
    assert "[Service]" in got.stdout
