"""`diagnose HOST` against a lab host: real journald invocations, real systemd unit state."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.lab, pytest.mark.hosts("ct129")]
REPO = Path(__file__).resolve().parents[2]


def cli(lab: Any, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DDTREE_OPS_SSH_CONFIG": str(lab.ssh_config), "DDTREE_OPS_PROFILES": str(REPO / "profiles")}
    return subprocess.run([sys.executable, "-m", "ddtree_ops", *args], capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.fixture
def ct129(lab: Any) -> Any:
    lab.clear("ct129")
    assert cli(lab, "deploy", "ct129", "--mode", "nextn", "--yes", "--set", "gate.stay_healthy_s=2").returncode == 0
    yield "ct129"
    lab.clear("ct129")
    res = cli(lab, "deploy", "ct129", "--mode", "nextn", "--yes", "--force-restart", "--set", "gate.stay_healthy_s=2")
    assert res.returncode == 0, res.stderr[-2000:]


def test_healthy_host_reports_memory_against_the_prediction(lab: Any, ct129: str) -> None:
    res = cli(lab, "diagnose", ct129, "--json")
    doc = json.loads(res.stdout)
    # healthy, exit 0, whatever the start before this one did (a failed one is a note since issue 32),
    # so the answer does not depend on which test ran before (issue 29)
    assert (res.returncode, doc["exit_code"], doc["verdict"]) == (0, 0, "healthy"), res.stderr
    assert doc["schema_version"] == 1 and doc["command"] == "diagnose" and doc["unit"]["name"] == "sglang.service"
    assert doc["serving"] is not None  # the stand-in's own ready line and requests (or its health endpoint)
    mem = next(c for c in doc["checks"] if c["name"] == "KV pool vs preflight")
    assert mem["status"] == "ok", mem  # SGLang's own sizing and the preflight formula agree


def test_a_failed_start_is_named_with_evidence_and_remedy(lab: Any, ct129: str) -> None:
    lab.fault(ct129, "libcuda-missing", every_start=True)
    with lab.connect(ct129) as h:
        h.run(["systemctl", "stop", "sglang.service"], timeout=60)
        h.run(["systemctl", "start", "--no-block", "sglang.service"], timeout=60)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = h.run(["systemctl", "show", "-p", "ActiveState,SubState", "sglang.service"]).stdout
            if "failed" in state or "auto-restart" in state:
                break
            time.sleep(0.5)
    res = cli(lab, "diagnose", ct129, "--json")
    assert res.returncode == 2, res.stderr
    doc = json.loads(res.stdout)
    assert doc["verdict"] == "failed"
    rc = doc["root_cause"]
    assert rc["label"] == "cuda_lib_load" and "libcuda.so.1" in rc["evidence"] and rc["remedy"]
    human = cli(lab, "diagnose", ct129)
    assert human.returncode == 2 and "cause     cuda_lib_load" in human.stderr and "remedy" in human.stderr


def test_a_host_serving_healthy_after_a_failed_start_is_healthy_and_names_that_start(lab: Any, ct129: str) -> None:
    """Issue 32: after a rolled-back deploy the host serves its known-good release. HEALTHY, exit 0,
    and it says why the start before failed; DEGRADED is the deploy contract's word for "not serving"."""
    lab.fault(ct129, "libcuda-missing")
    assert cli(lab, "deploy", ct129, "--mode", "dflash", "--yes", "--set", "gate.stay_healthy_s=2").returncode == 1
    res = cli(lab, "diagnose", ct129, "--json")
    doc = json.loads(res.stdout)
    assert (res.returncode, doc["exit_code"], doc["verdict"], doc["root_cause"]) == (0, 0, "healthy", None), res.stderr
    prev = doc["previous_start_failed"]
    assert prev["label"] == "cuda_lib_load" and "libcuda.so.1" in prev["evidence"]
    # the driver's library: the remedy says where it comes from (the driver, the container toolkit,
    # cuda-compat), and offers no pip wheel to install
    remedy = prev["remedy"]
    assert "driver is installed" in remedy and "NVIDIA Container Toolkit" in remedy and "cuda-compat" in remedy
    assert "nvidia-cuda" not in remedy and "pip install" not in remedy and "wheel in service.python" not in remedy
    human = cli(lab, "diagnose", ct129)
    assert human.returncode == 0, human.stderr
    assert "HEALTHY: the previous start failed: cuda_lib_load" in human.stderr and "DEGRADED" not in human.stderr
