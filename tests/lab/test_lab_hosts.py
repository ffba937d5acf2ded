"""The lab hosts themselves: real systemd as PID 1, journald, sshd (host key pinned), the seeded NEXTN
service, the simulated GPU, all reached through the tool's own Host interface over SSH."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ddtree_ops import gpu
from ddtree_ops.host import HostKeyError
from ddtree_ops.lab.standin import behaviour, memory
from labkit import PORT, UNIT, generate, one_host, show, wait_journal

pytestmark = pytest.mark.lab
FIX = Path(__file__).resolve().parents[2] / "ddtree_ops" / "lab" / "fixtures"
CARDS = {"ct129": (49140, "8.6", "NVIDIA RTX A6000"),
         "ct200": (97887, "12.0", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition")}


@pytest.mark.parametrize("name", [one_host("ct129"), one_host("ct200")])
def test_systemd_is_pid1_and_the_system_is_running(lab: Any, name: str) -> None:
    with lab.connect(name) as h:
        assert h.run(["cat", "/proc/1/comm"]).stdout.strip() == "systemd"
        state = h.run(["systemctl", "is-system-running"]).stdout.strip()
        failed = h.run(["systemctl", "--failed", "--no-legend"]).stdout
        assert state == "running", failed
        assert h.run(["hostname"]).stdout.strip() == name
        assert h.run(["ip", "-4", "-o", "addr", "show", "eth0"]).stdout.split()[3] == f"{lab.address(name)}/32"


def test_exec_and_file_transfer(lab: Any) -> None:
    with lab.connect("ct129") as h:
        res = h.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
        assert (res.rc, res.stdout, res.stderr) == (3, "out\n", "err\n")
        data = bytes(range(256)) * 64
        h.put("/tmp/lab-roundtrip.bin", data, mode=0o600)
        assert h.get("/tmp/lab-roundtrip.bin") == data
        assert h.run(["stat", "-c", "%a", "/tmp/lab-roundtrip.bin"]).stdout.strip() == "600"
        assert h.get("/tmp/no-such-file") is None
        h.run(["rm", "-f", "/tmp/lab-roundtrip.bin"])


def test_a_wrong_host_key_is_refused(lab: Any, tmp_path: Path) -> None:
    from ddtree_ops.ssh import connect

    known = lab.known_hosts.read_text().splitlines()
    ct200_key = next(line for line in known if line.startswith("ct200,")).split(" ", 1)[1]
    (tmp_path / "known_hosts").write_text(f"ct129,{lab.address('ct129')} {ct200_key}\n")
    (tmp_path / "ssh_config").write_text(lab.ssh_config.read_text().replace(str(lab.known_hosts),
                                                                            str(tmp_path / "known_hosts")))
    with pytest.raises(HostKeyError, match="HOST KEY CHANGED"):
        connect("ct129", ssh_config=str(tmp_path / "ssh_config"))


def test_openssh_reaches_the_service_by_name(lab: Any) -> None:
    """The issue's done-when, with the operator's own ssh client and the lab's ssh_config."""
    ssh = ["ssh", "-F", str(lab.ssh_config), "-o", "BatchMode=yes"]
    for name in lab.hosts:
        active = subprocess.run([*ssh, name, "systemctl", "is-active", UNIT], capture_output=True, text=True, timeout=30)
        assert active.stdout.strip() == "active", active.stderr
        code = subprocess.run([*ssh, name, f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{PORT}/health_generate"],
                              capture_output=True, text=True, timeout=30)
        assert code.stdout.strip() == "200", code.stderr


@pytest.mark.parametrize("name", [one_host("ct129"), one_host("ct200")])
def test_nextn_service_is_seeded_and_journald_has_its_output(lab: Any, name: str) -> None:
    with lab.connect(name) as h:
        props = show(h, "ActiveState", "UnitFileState", "NRestarts", "InvocationID", "FragmentPath")
        assert (props["ActiveState"], props["UnitFileState"], props["NRestarts"]) == ("active", "enabled", "0")
        assert "mode=nextn" in (h.get(props["FragmentPath"]) or b"").decode().splitlines()[0]
        # journald reads the service's stdout stream asynchronously: give it a moment to catch up
        log = wait_journal(h, props["InvocationID"], "The server is fired up and ready to roll!", timeout=15)
        assert "LAB STAND-IN" in log
        info = h.http("GET", PORT, "/server_info").json()
        assert info["speculative_algorithm"] == "NEXTN" and "LAB STAND-IN" in info["ddtree_lab_standin"]
        assert 2.5 <= generate(h)["meta_info"]["spec_accept_length"] <= 4


@pytest.mark.parametrize("name", [one_host("ct129"), one_host("ct200")])
def test_gpu_facts_through_the_tools_probe(lab: Any, name: str) -> None:
    total, cap, model = CARDS[name]
    with lab.connect(name) as h:
        snap = gpu.snapshot(h, "/opt/sglang/venv/bin/python")
        assert snap.source == "nvidia-smi"  # NVML is not simulated: pynvml finds no driver, as on a driverless host
        assert any("NVMLError_LibraryNotFound" in e for e in snap.errors)
        (g,) = snap.gpus
        assert (g.memory_total_mib, g.compute_cap, g.name) == (total, cap, model)
        (app,) = snap.apps
        assert app.unit == UNIT and app.used_mib == g.memory_used_mib and not snap.strays(UNIT)
        bad = h.run(["nvidia-smi", "--query-gpu=index,cuda_version", "--format=csv"])
        assert (bad.rc, bad.stdout) == (2, 'Field "cuda_version" is not a valid field to query.\n\n')
        assert h.run(["nvidia-smi", "-L"]).stdout.startswith(f"GPU 0: {model} (UUID: GPU-")


def test_memory_lines_carry_the_formulas_numbers(lab: Any) -> None:
    """ct129's NEXTN service: the numbers in its log are SGLang's formula on the simulated 48 GB card."""
    from ddtree_ops.profile import load_profile

    p = load_profile("ct129")
    cfg = {n: json.loads((FIX / n / "config.json").read_text()) for n in ("Qwen3-8B", "Qwen3-8B-NextN")}
    plan = behaviour.plan(behaviour.Inputs(
        algorithm="NEXTN", kind="eagle", target_cfg=cfg["Qwen3-8B"],
        target_index=json.loads((FIX / "Qwen3-8B" / "model.safetensors.index.json").read_text()),
        draft_cfg=cfg["Qwen3-8B-NextN"], total_mib=p.gpu.memory_mib, others_mib=0,
        mem_fraction_static=p.memory.mem_fraction_static, context_length=p.memory.context_length,
        max_running_requests=p.memory.max_running_requests, cuda_graph_max_bs=p.memory.cuda_graph_max_bs,
        num_steps=3, eagle_topk=1, num_draft_tokens=4))
    with lab.connect("ct129") as h:
        log = wait_journal(h, show(h, "InvocationID")["InvocationID"], "max_total_num_tokens=", timeout=15)
    assert f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {plan.pool.tokens}, " in log
    assert f"max_total_num_tokens={plan.pool.tokens}, " in log
    assert f"mem usage={plan.pool.target_weights / memory.GIB:.2f} GB." in log
