"""Preflight refuses cards that are present but not usable (issue 21): MIG mode, a compute mode that
shuts the service out, another process holding what the service needs, a driver too old for the
host's torch. Each refusal names the card and what to change; the tool changes no card setting."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ddtree_ops.gpu import Gpu, GpuApp, GpuSnapshot
from ddtree_ops.preflight import FAIL, OK, WARN, Check, Preflight, check_gpu, check_models
from ddtree_ops.profile import load_profile

FIX = Path(__file__).resolve().parents[2] / "ddtree_ops" / "lab" / "fixtures"
PRO = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
TOTAL = 97887


def card(i: int, free: int = TOTAL, **modes: Any) -> Gpu:
    g = Gpu(i, f"GPU-{i}", PRO, TOTAL, TOTAL - free, free, "12.0", bus_id=f"00000000:{0x17 + i:02X}:00.0")
    return replace(g, **modes)


def run(cards: list[Gpu], apps: list[GpuApp] = (), *, two: bool = False, driver: str = "580.95.05",
        torch_cuda: str = "12.8") -> Preflight:
    sets = ["parallel.tp_size=2", "gpus=[0, 1]", "gpu.count=2"] if two else []
    p = load_profile("ct200", overrides=sets)
    pf = Preflight()
    check_gpu(pf, p, GpuSnapshot("nvml", cards, list(apps), [], driver, "13.0", torch_cuda, "2.9.1+cu128"))
    s = p.service
    check_models(pf, p, "nextn", {f"{s.model_path}/config.json": (FIX / "Qwen3-8B/config.json").read_bytes(),
                                  f"{p.modes.nextn.draft_model_path}/config.json":
                                      (FIX / "Qwen3-8B-NextN/config.json").read_bytes()})
    return pf


def line(pf: Preflight, name: str) -> Check:
    return next(c for c in pf.checks if c.name == name)


def test_usable_cards_pass_and_say_what_was_read() -> None:
    pf = run([card(0, mig_mode="Disabled", compute_mode="Default")])
    assert pf.ok
    assert line(pf, "gpu-cards").status == OK
    assert "card 0 (NVIDIA RTX PRO 6000" in line(pf, "gpu-cards").detail and "MIG Disabled" in line(pf, "gpu-cards").detail
    assert line(pf, "driver").status == OK


def test_mig_enabled_on_the_second_card_is_refused_naming_it_and_the_command() -> None:
    pf = run([card(0, mig_mode="Disabled"), card(1, mig_mode="Enabled", mig_pending="Enabled")], two=True)
    check = line(pf, "gpu-cards")
    assert check.status == FAIL and not pf.ok
    assert f"card 1 ({PRO}, 00000000:18:00.0) has MIG mode enabled" in check.detail
    assert "`nvidia-smi -i 1 -mig 0`" in check.detail and "gpus" in check.detail
    assert "card 0" not in check.detail


def test_mig_pending_only_warns() -> None:
    check = line(run([card(0, mig_mode="Disabled", mig_pending="Enabled")]), "gpu-cards")
    assert check.status == WARN and "pending a GPU reset" in check.detail


def test_compute_mode_prohibited_is_refused() -> None:
    pf = run([card(0, compute_mode="Prohibited")])
    check = line(pf, "gpu-cards")
    assert check.status == FAIL and "compute mode Prohibited" in check.detail
    assert "`nvidia-smi -i 0 -c DEFAULT`" in check.detail


def test_exclusive_process_taken_by_another_process_is_refused_naming_it() -> None:
    other = GpuApp("GPU-0", 4242, 2000, "python3", "jupyter.service")
    pf = run([card(0, free=TOTAL - 2000, compute_mode="Exclusive_Process")], [other])
    check = line(pf, "gpu-cards")
    assert check.status == FAIL
    assert "compute mode Exclusive_Process and pid 4242 python3 (jupyter.service) holds its one context" in check.detail


def test_exclusive_process_with_nobody_else_only_warns() -> None:
    pf = run([card(0, compute_mode="Exclusive_Process")])
    assert line(pf, "gpu-cards").status == WARN and pf.ok


def test_another_process_holding_what_the_pool_needs_is_refused_naming_it() -> None:
    """Qwen3-8B at 0.84 on 96 GB: 65,536 x 4 tokens fit on an empty card, not beside 40 GB."""
    stray = GpuApp("GPU-0", 3131, 40000, "python", None)
    pf = run([card(0, free=TOTAL - 40000)], [stray])
    check = line(pf, "gpu-processes")
    assert check.status == FAIL and not pf.ok
    assert f"card 0 ({PRO}, 00000000:17:00.0): pid 3131 python holds 40,000 MiB (no unit)" in check.detail
    assert "kill 3131" in check.detail and "other cards in gpus" in check.detail
    assert line(pf, "memory").status == FAIL


def test_a_small_stray_that_leaves_the_fit_stays_a_warning() -> None:
    pf = run([card(0, free=TOTAL - 2000)], [GpuApp("GPU-0", 77, 2000, "python", None)])
    assert line(pf, "gpu-processes").status == WARN and pf.ok


def test_a_driver_too_old_for_the_hosts_torch_is_refused() -> None:
    pf = run([card(0)], driver="470.82.01", torch_cuda="12.8")
    check = line(pf, "driver")
    assert check.status == FAIL and "driver 470.82.01 is too old" in check.detail
    assert "torch 2.9.1+cu128 (service.python) is built for CUDA 12.8" in check.detail


def test_a_cpu_torch_is_not_judged() -> None:
    pf = run([card(0)], torch_cuda="")
    assert not [c for c in pf.checks if c.name == "driver"]


def test_tp2_on_a_one_card_host_names_gpus_and_the_parallel_sizes() -> None:
    """Issue 21's second refusal on the H200: parallel.tp_size 2 with gpus [0, 1] on one card."""
    p = load_profile("ct200", overrides=["parallel.tp_size=2", "gpus=[0, 1]"])
    pf = Preflight()
    check_gpu(pf, p, GpuSnapshot("nvml", [card(0)], [], [], "580.95.05"))
    check = line(pf, "gpu")
    assert check.status == FAIL
    assert "card 1 of gpus is not on the host (it has 1: 0)" in check.detail
    assert "parallel.tp_size 2 x pp_size 1 x dp_size 1 puts 2 ranks on this node" in check.detail
