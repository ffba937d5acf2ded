"""`profile init` against real lab hosts (real sshd, systemd, journald; SGLang 0.5.23's parser and
model files in the host's venv; the stand-in server), as an operator types it:

- on a host that runs a hand-made NEXTN unit (the lab seeds one), init writes a profile whose render
  is the running process's argv, whose preflight passes, and whose first deploy adopts the running
  unit as the known-good baseline and then deploys ddtree-shadow through the gate;
- on a fresh host with no unit, `init --model ... --draft ...` writes a profile that deploys and
  passes the gate.

The first test starts from a profiles directory holding only the shipped defaults.yaml and no
inventory (a host the tool has never heard of); the second from the shipped groups and the lab's
inventory, where ct200 is a member of group pro6000 (its file then holds what differs from the
group). Each leaves its host seeded again with no ddtree-ops state.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from labkit import COMMAND

pytestmark = pytest.mark.lab
REPO = Path(__file__).resolve().parents[2]
FAST = ("--set", "gate.stay_healthy_s=2")


@pytest.fixture
def profiles(tmp_path: Path) -> Path:
    d = tmp_path / "profiles"
    d.mkdir()
    shutil.copy(REPO / "profiles" / "defaults.yaml", d)
    return d


def tool(lab: Any, profiles: Path, *args: str, inventory: bool = False,
         timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **lab.env, "DDTREE_OPS_PROFILES": str(profiles), "NO_COLOR": "1"}
    if not inventory:
        env.pop("DDTREE_OPS_INVENTORY", None)
    return subprocess.run([*COMMAND, *args], capture_output=True, text=True, timeout=timeout, env=env)


def restore(lab: Any, host: str) -> None:
    with lab.connect(host) as h:
        h.run(["rm", "-rf", "--", "/var/lib/ddtree-ops"], timeout=30)
    lab.restore(host)


@pytest.fixture
def seeded(lab: Any) -> Iterator[str]:
    # a deploy test run earlier in the session leaves ct129 on a release with ddtree-ops state: a host set
    # up by hand has none (seeded again only when there is some, as the lab's `up` leaves it)
    with lab.connect("ct129") as h:
        touched = h.run(["test", "-e", "/var/lib/ddtree-ops"], timeout=30).rc == 0
    if touched:
        restore(lab, "ct129")
    yield "ct129"
    restore(lab, "ct129")


@pytest.fixture
def fresh(lab: Any) -> Iterator[str]:
    lab.unseed("ct200")
    yield "ct200"
    restore(lab, "ct200")


def running_argv(lab: Any, host: str) -> list[str]:
    with lab.connect(host) as h:
        pid = h.run(["systemctl", "show", "-p", "MainPID", "--value", "sglang.service"]).stdout.strip()
        raw = h.run(["cat", f"/proc/{pid}/cmdline"]).stdout
    return raw.split("\0")[:-1]


@pytest.mark.hosts("ct129")
def test_init_on_a_host_that_runs_a_hand_made_unit(lab: Any, profiles: Path, seeded: str) -> None:
    before = running_argv(lab, seeded)
    init = tool(lab, profiles, "profile", "init", seeded)
    assert init.returncode == 0, init.stderr
    assert "gives the running sglang.service's argv and environment exactly" in init.stderr
    assert "preflight passed" in init.stderr
    doc = yaml.safe_load((profiles / f"{seeded}.yaml").read_text())
    assert doc["mode"] == "nextn" and doc["gpu"]["arch"] == "sm_86"
    assert doc["service"]["python"] == "/opt/sglang/venv/bin/python"

    rendered = tool(lab, profiles, "render", seeded, "--mode", "nextn", "--what", "argv")
    assert rendered.returncode == 0, rendered.stderr
    assert shlex.split(rendered.stdout) == before

    pf = tool(lab, profiles, "preflight", seeded)
    assert pf.returncode == 0, pf.stderr

    dep = tool(lab, profiles, "deploy", seeded, "--mode", "ddtree-shadow", "--yes", *FAST)
    assert dep.returncode == 0, dep.stderr
    assert "adopted the running sglang.service as known-good baseline baseline-" in dep.stderr
    after = running_argv(lab, seeded)
    assert after[after.index("--speculative-algorithm") + 1] == "DDTREE"
    with lab.connect(seeded) as h:
        releases = h.run(["ls", "/var/lib/ddtree-ops/sglang/releases"]).stdout.split()
    assert any(r.startswith("baseline-") for r in releases) and any(r.startswith("ddtree-shadow-") for r in releases)


@pytest.mark.hosts("ct200")
def test_init_on_a_fresh_host_with_model_and_draft(lab: Any, profiles: Path, fresh: str) -> None:
    shutil.copytree(REPO / "profiles" / "groups", profiles / "groups")
    init = tool(lab, profiles, "profile", "init", fresh, "--model", "/models/Qwen3-8B",
                "--draft", "/models/Qwen3-8B-DFlash-b16", inventory=True)
    assert init.returncode == 0, init.stderr
    assert "preflight passed" in init.stderr
    text = (profiles / f"{fresh}.yaml").read_text()
    doc = yaml.safe_load(text)
    # the probe saw the card group pro6000 names: the group says it, the file does not repeat it
    assert "gpu" not in doc and "so not repeated here" in text and "gpu.memory_mib" in text, text
    assert "service.python" in text and "service.model_path" in text, text
    shown = tool(lab, profiles, "profile", "show", fresh, "--json", inventory=True)
    resolved = yaml.safe_load(shown.stdout)["profile"]
    assert resolved["gpu"]["arch"] == "sm_120" and resolved["memory"]["attention_backend"] in ("flashinfer", "triton")
    assert resolved["modes"]["ddtree-shadow"]["draft_model_path"] == "/models/Qwen3-8B-DFlash-b16"

    dep = tool(lab, profiles, "deploy", fresh, "--mode", "ddtree-shadow", "--yes", *FAST, inventory=True)
    assert dep.returncode == 0, dep.stderr
    argv = running_argv(lab, fresh)
    assert argv[argv.index("--speculative-algorithm") + 1] == "DDTREE"
