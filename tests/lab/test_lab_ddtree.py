"""DDTREE on a lab host, with the unit the tool renders for `ddtree-shadow`: without a plugin SGLang
does not know the name; registered as a plain CustomSpecAlgo (not DFlash-family, and not saying its draft
runs TARGET_VERIFY graphs) it dies capturing the draft's CUDA graph, as real SGLang 0.5.17 did
(tests/data/real-sglang/0.5.17/1_neg_nonfamily_graph_layers13.log); a DFlash-family plugin serves.
Throwaway plugins stand in for the real engine plugin, installed the way a deploy installs a wheel
(`pip install --no-deps`)."""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest

from ddtree_ops.profile import load_profile
from ddtree_ops.render import render
from ddtree_ops.wheel import pack
from labkit import PORT, generate, restart, show, wait_for, wait_journal
from standin_proc import plugin_source

pytestmark = [pytest.mark.lab, pytest.mark.hosts("ct129")]
PIP = "/opt/sglang/venv/bin/pip"


def wheel(name: str, family: bool) -> bytes:
    """A real wheel whose entry point `ddtree` in group sglang.srt.plugins registers DDTREE."""
    return pack(name, name, "0.1", [(f"{name}.py", plugin_source(family).encode())],
                f"[sglang.srt.plugins]\nddtree = {name}:register\n").data


def install(h: Any, name: str, family: bool) -> None:
    path = f"/tmp/{name}-0.1-py3-none-any.whl"
    h.put(path, wheel(name, family))
    h.run([PIP, "install", "--no-deps", "--no-index", "--quiet", path], timeout=120).check("pip install")


def deploy(h: Any, mode: str, overrides: list[str] | None = None) -> str:
    r = render(load_profile(h.name, overrides=overrides), mode)
    h.put(r.env_path, r.env_text.encode(), mode=0o600)
    h.put(r.unit_path, r.unit_text.encode())
    h.run(["systemctl", "daemon-reload"]).check()
    return restart(h)


@pytest.fixture()
def ct129(lab: Any) -> Iterator[Any]:
    def clean(h: Any) -> None:
        # A deploy test run earlier may have installed the real engine plugin (dist `ddtree-ops`):
        # these cases need a venv whose only DDTREE registrations are their own.
        h.run([PIP, "uninstall", "-y", "--quiet", "labplug_plain", "labplug_family", "ddtree-ops"],
              timeout=120)
        h.run(["rm", "-rf", "/models/Qwen3-8B-DFlash-nolayers"])

    with lab.connect("ct129") as h:
        clean(h)
        try:
            yield h
        finally:
            clean(h)
            lab.restore("ct129")


def test_ddtree_without_a_plugin_is_an_unknown_algorithm(ct129: Any) -> None:
    inv = deploy(ct129, "ddtree-shadow")
    log = wait_journal(ct129, inv, "ValueError: Unknown speculative algorithm name: DDTREE")
    assert "Traceback (most recent call last):" in log
    wait_for("exit 1", lambda: show(ct129, "ExecMainCode", "ExecMainStatus") == {"ExecMainCode": "1", "ExecMainStatus": "1"})


def test_ddtree_plugin_without_dflash_family_dies_at_the_draft_graph_capture(ct129: Any) -> None:
    install(ct129, "labplug_plain", family=False)
    inv = deploy(ct129, "ddtree-shadow")
    log = wait_journal(ct129, inv, "Received sigquit from a child process. It usually means the child failed.")
    assert "Capture draft verify CUDA graph begin." in log and "Uvicorn running on" not in log
    assert "Scheduler hit an exception: Traceback (most recent call last):" in log
    assert 'decode_cuda_graph_runner.py", line 277, in __init__' in log  # 0.5.17's frame
    assert "\nRuntimeError: This should not happen\n" in log
    wait_for("SIGKILL", lambda: show(ct129, "ExecMainStatus")["ExecMainStatus"] == "9")


def test_ddtree_plugin_with_dflash_family_serves(lab: Any, ct129: Any) -> None:
    install(ct129, "labplug_family", family=True)
    inv = deploy(ct129, "ddtree-shadow")
    wait_journal(ct129, inv, "The server is fired up and ready to roll!")
    meta = generate(ct129, "Explain speculative decoding", 64)["meta_info"]
    assert 3.5 <= meta["spec_accept_length"] <= 5.5
    info = ct129.http("GET", PORT, "/server_info").json()
    assert info["speculative_algorithm"] == "DDTREE" and 130_000 <= info["max_total_num_tokens"] <= 140_000  # mfs 0.81 + the draft pool
    # the shared venv is byte-compiled as far as a serving host imports it (ddtree_ops.lab.tree.WARM_IMPORTS):
    # a module left out is compiled again by every host into its own overlay at every boot
    site = next((lab.paths.host_dir("ct129") / "upper" / "opt" / "sglang" / "venv" / "lib").glob("python3.*"))
    own = ("site-packages/sglang_standin/", "site-packages/sglang/__pycache__/launch_server.",
           "site-packages/labplug_", "site-packages/__pycache__/labplug_", "site-packages/ddtree_ops/")
    compiled_here = [str(f.relative_to(site)) for f in site.rglob("*.pyc")]
    assert [f for f in compiled_here if not f.startswith(own)] == []


def test_dflash_draft_without_target_layer_ids_collapses_acceptance(ct129: Any) -> None:
    draft = json.loads(ct129.get("/models/Qwen3-8B-DFlash-b16/config.json") or b"{}")
    draft.pop("dflash_config")
    ct129.run(["mkdir", "-p", "/models/Qwen3-8B-DFlash-nolayers"]).check()
    ct129.put("/models/Qwen3-8B-DFlash-nolayers/config.json", json.dumps(draft).encode())
    inv = deploy(ct129, "dflash", ["modes.dflash.draft_model_path=/models/Qwen3-8B-DFlash-nolayers"])
    wait_journal(ct129, inv, "The server is fired up and ready to roll!")
    meta = generate(ct129, "Explain speculative decoding", 32)["meta_info"]
    assert meta["spec_accept_length"] == 1.0
