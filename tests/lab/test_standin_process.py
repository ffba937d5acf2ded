"""The stand-in as a local process (no lab): SGLang's real parser and plugin loader, the endpoints, the
ddtree plugin's shadow accounting, each failure with SGLang 0.5.17's own text and exit status, and the
stop."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
from pathlib import Path
from typing import Iterator

import pytest

from ddtree_ops.lab.standin import simgpu

from ports import free_port
from standin_proc import Standin, ddtree_argv, nextn_argv, start

if importlib.util.find_spec("sglang") is None:  # found, not imported: only the stand-ins' forkserver imports it
    pytest.skip("needs sglang (the stand-in runs its parser)", allow_module_level=True)
pytestmark = pytest.mark.slow
KILLED = -signal.SIGKILL  # SGLang's launcher ends in kill_process_tree, which SIGKILLs the launcher itself
STORY = "Tell me a story about a lighthouse keeper"


@pytest.fixture(scope="module")
def nextn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standin]:
    port = free_port()
    s = start(tmp_path_factory.mktemp("nextn"), nextn_argv(port), port=port)
    try:
        s.wait_log("The server is fired up and ready to roll!")
        yield s
    finally:
        s.stop()


def test_health_and_generate(nextn: Standin) -> None:
    assert nextn.get("/health")[0] == 200 and nextn.get("/health_generate")[0] == 200
    status, doc = nextn.post("/generate", {"text": "The capital of France is",
                                           "sampling_params": {"temperature": 0, "max_new_tokens": 16}})
    meta = doc["meta_info"]
    assert status == 200 and doc["text"].startswith(" Paris.")
    assert meta["completion_tokens"] == 16 and meta["finish_reason"] == {"type": "length", "length": 16}
    assert {"id", "prompt_tokens", "e2e_latency", "spec_verify_ct", "spec_accept_length"} <= set(meta)
    assert 2.5 <= meta["spec_accept_length"] <= 4
    assert meta["spec_accept_length"] == pytest.approx(16 / meta["spec_verify_ct"], abs=1e-3)


def test_openai_and_info_endpoints(nextn: Standin) -> None:
    assert json.loads(nextn.get("/v1/models")[1])["data"][0]["id"] == "qwen3-8b"
    _, chat = nextn.post("/v1/chat/completions", {"model": "qwen3-8b", "max_tokens": 8,
                                                  "messages": [{"role": "user", "content": "hi"}]})
    assert chat["object"] == "chat.completion" and chat["usage"]["completion_tokens"] == 8
    info = json.loads(nextn.get("/server_info")[1])
    assert info["speculative_algorithm"] == "NEXTN" and info["mem_fraction_static"] == 0.81
    assert info["max_total_num_tokens"] > 131072 and info["version"] == "0.5.23"
    assert "LAB STAND-IN" in info["ddtree_lab_standin"]
    assert info["internal_states"][0]["avg_spec_accept_length"] > 1.5
    assert json.loads(nextn.get("/model_info")[1])["architectures"] == ["Qwen3ForCausalLM"]
    assert nextn.get("/nope")[0] == 404


def test_metrics_and_log_lines(nextn: Standin) -> None:
    metrics = nextn.get("/metrics")[1].decode()
    assert "sglang:spec_accept_length{" in metrics and "sglang:num_requests_total{" in metrics
    assert "ddtree_shadow_" not in metrics  # NEXTN has no shadow
    # SGLang logs a decode batch every --decode-log-interval (40) forward steps: ~55 steps here
    nextn.post("/generate", {"text": STORY, "sampling_params": {"max_new_tokens": 160}})
    log = nextn.log()
    for line in ("Load weight end. elapsed=", "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 161446, ",
                 "Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4, bs=[1, 2, 3, 4], ",
                 "Capture draft extend CUDA graph end. elapsed=",
                 "max_total_num_tokens=161446, chunked_prefill_size=4096",
                 "Uvicorn running on http://127.0.0.1:", "LAB STAND-IN", "accept len: "):
        assert line in log, line


def test_it_holds_gpu_memory_while_alive(nextn: Standin) -> None:
    held = simgpu.holders(nextn.dir / "reg")
    assert [h.pid for h in held] == [nextn.proc.pid] and 38_000 < held[0].used_mib < 42_000


NODRAFT_GRAPHS = ["--disable-cuda-graph"]
SHADOW = {"SGLANG_PLUGINS": "ddtree", "DDTREE_SHADOW_SHARE": "1.0", "DDTREE_SHADOW_REPORT_EVERY": "5"}
CASES = {
    "unknown-flag": lambda port: dict(argv=nextn_argv(port) + ["--speculative-ddtree-budget", "8"]),
    "ddtree-no-plugin": lambda port: dict(argv=ddtree_argv(port)),
    "ddtree-plain-plugin": lambda port: dict(argv=ddtree_argv(port), plugin="plain"),
    "ddtree-plain-plugin-nograph": lambda port: dict(argv=ddtree_argv(port) + NODRAFT_GRAPHS, plugin="plain"),
    "ddtree-family-plugin": lambda port: dict(argv=ddtree_argv(port), plugin="family"),
    "ddtree-shadow": lambda port: dict(argv=ddtree_argv(port), env=SHADOW),
    "ddtree-shadow-off": lambda port: dict(argv=ddtree_argv(port), env={
        "SGLANG_PLUGINS": "ddtree", "DDTREE_SHADOW_SHARE": "0", "DDTREE_SHADOW_WARN_AFTER": "3"}),
    "nextn-stop": lambda port: dict(argv=nextn_argv(port)),
    "stray-memory": lambda port: dict(argv=ddtree_argv(port), plugin="family"),
    "libcuda": lambda port: dict(argv=nextn_argv(port), faults=("libcuda-missing",)),
    "hang": lambda port: dict(argv=nextn_argv(port), faults=("hang",)),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Standin]]:
    """Every case launched at once (forked from one process that imported sglang)."""
    out: dict[str, Standin] = {}
    for name, case in CASES.items():
        port = free_port()
        tmp = tmp_path_factory.mktemp(name)
        if name == "stray-memory":  # this test process "holds" 30 GiB of the simulated card
            simgpu.register(30 * 1024, pid=os.getpid(), registry=tmp / "reg")
        out[name] = start(tmp, port=port, **case(port))
    try:
        yield out
    finally:
        for s in out.values():
            s.stop()


def test_unknown_flag_is_argparses_exit_2(runs: dict[str, Standin]) -> None:
    s = runs["unknown-flag"]
    assert s.wait_exit() == 2
    assert "error: unrecognized arguments: --speculative-ddtree-budget 8" in s.log()


def test_ddtree_without_a_plugin_is_unknown(runs: dict[str, Standin]) -> None:
    s = runs["ddtree-no-plugin"]
    assert s.wait_exit() == 1
    assert "ValueError: Unknown speculative algorithm name: DDTREE" in s.log()


def test_ddtree_plugin_that_is_not_dflash_family_dies_at_the_draft_graph(runs: dict[str, Standin]) -> None:
    """The seed story as real SGLang 0.5.17 tells it (1_neg_nonfamily_graph_layers13): a plain
    CustomSpecAlgo does not say its draft may run TARGET_VERIFY graphs."""
    s = runs["ddtree-plain-plugin"]
    assert s.wait_exit() == KILLED
    log = s.log()
    assert "Capture target verify CUDA graph end." in log and "Uvicorn running on" not in log
    assert "Capture draft verify CUDA graph begin. backend=full, num_tokens_per_req=16" in log
    for text in ("Scheduler hit an exception: Traceback (most recent call last):",
                 'decode_cuda_graph_runner.py", line 277, in __init__\n    raise RuntimeError("This should not happen")',
                 "\nRuntimeError: This should not happen\n",
                 "Received sigquit from a child process. It usually means the child failed.",
                 "kill_process_tree called: parent_pid="):
        assert text in log, text


def test_without_graphs_it_dies_at_the_first_prefill_with_the_dim_mismatch(runs: dict[str, Standin]) -> None:
    """2_neg_nonfamily_nograph: no hidden capture, so the target hands the draft its final hidden state."""
    s = runs["ddtree-plain-plugin-nograph"]
    assert s.wait_exit() == KILLED
    log = s.log()
    assert "Uvicorn running on" in log and "fired up" not in log and "GET /model_info" in log
    assert re.search(r"ValueError: DFLASH target_hidden feature dim mismatch\. Expected shape \[N, 20480\] "
                     r"\(num_context_features=5, hidden_size=4096\), but got shape=\(\d+, 4096\)\.", log)
    tail = log[log.index("ValueError: DFLASH target_hidden"):]
    order = ["SIGQUIT received. signum=None, frame=None. It usually means one child failed.",
             "Sleeping 5 seconds before crash diagnostics", "destroy_process_group() was not called",
             "No live scheduler processes found", "kill_process_tree called:"]
    assert [tail.index(t) for t in order] == sorted(tail.index(t) for t in order)


def test_ddtree_plugin_that_declares_dflash_family_serves(runs: dict[str, Standin]) -> None:
    s = runs["ddtree-family-plugin"]
    s.wait_log("The server is fired up and ready to roll!")
    _, doc = s.post("/generate", {"text": STORY, "sampling_params": {"max_new_tokens": 64}})
    assert 3.5 <= doc["meta_info"]["spec_accept_length"] <= 5.5
    log = s.log()
    assert "Initialized DFLASH draft runner. attention_backend=flashinfer, model=DFlashDraftModel, block_size=16" in log
    assert "DFLASH draft greedy head folded into the draft cuda graph (tp=1)." in log
    assert "DDTREE shadow" not in log  # a plugin of its own, not the ddtree plugin: no shadow accounting


def test_the_ddtree_plugin_shadows_on_simulated_rounds(runs: dict[str, Standin]) -> None:
    """The real plugin's mixin in front of the stand-in's DFlash worker: its lines and its gauges."""
    from ddtree_ops.engine.sglang_shadow import REGISTERED

    s = runs["ddtree-shadow"]
    s.wait_log("The server is fired up and ready to roll!")
    _, doc = s.post("/generate", {"text": STORY, "sampling_params": {"temperature": 0, "max_new_tokens": 96}})
    log = s.log()
    assert log.count("DDTREE plugin: registered DDTREE as a DFlash-family algorithm (sglang 0.5.23, shadow-linear)") == 2
    assert "] " + REGISTERED % [1, 9, 17, 25, 33] in log
    assert "DDTREE shadow: budget 15, horizon 15, share 1.000, cost ratio 1.000 (engine-bench-h200-qwen3-8b)" in log
    # DFlash folds its head into the draft graph, and the plugin its top-K beside it
    assert "greedy head folded" in log and "DDTREE shadow: top-15 taken inside the draft's CUDA graph" in log
    reports = re.findall(r"DDTREE shadow: rounds=(\d+) sampled=(\d+) tau_chain=([\d.]+) tau_tree=([\d.]+|n/a) "
                         r"tau_tree_lower=([\d.]+) cost_ratio=1.00 sibling_hits=\[[\d, ]+\] "
                         r"recommendation=[\w-]+ cost_from=engine-bench-h200-qwen3-8b dropped=\d+", log)
    # one report every DDTREE_SHADOW_REPORT_EVERY=5 verify rounds, this request's and the warmup's
    assert [int(r[0]) for r in reports] == list(range(5, 5 * len(reports) + 1, 5))
    assert int(reports[-1][0]) >= doc["meta_info"]["spec_verify_ct"] // 5 * 5
    assert all(float(lower) >= 1.0 and float(chain) > 1.0 for _, _, chain, _, lower in reports)
    # greedy rounds are decided exactly from the tokens committed after them
    assert int(reports[-1][1]) > 0 and reports[-1][3] != "n/a"
    metrics = s.get("/metrics")[1].decode()
    assert f"ddtree_shadow_rounds {float(reports[-1][0])}" in metrics
    assert f"ddtree_shadow_tau_chain {float(reports[-1][2])}" in metrics or "ddtree_shadow_tau_chain " in metrics
    assert re.search(r'ddtree_shadow_sibling_hits\{depth="1"\} ', metrics)


def test_shadow_off_says_so_after_warn_after_rounds(runs: dict[str, Standin]) -> None:
    from ddtree_ops.engine.sglang_shadow import SILENT

    s = runs["ddtree-shadow-off"]
    s.wait_log("The server is fired up and ready to roll!")
    s.post("/generate", {"text": STORY, "sampling_params": {"max_new_tokens": 32}})
    log = s.log()
    assert "DFLASH draft greedy head folded into the draft cuda graph (tp=1)." in log  # the plugin let DFlash fold it
    assert log.count(SILENT % (3, "DDTREE_SHADOW_SHARE is 0")) == 1
    assert 'ddtree_shadow_silent{reason="DDTREE_SHADOW_SHARE is 0"} 1.0' in s.get("/metrics")[1].decode()


def test_stop_of_a_dflash_worker_drains_then_kills_itself(runs: dict[str, Standin]) -> None:
    """2_dflash, 2_ddtree: the scheduler outlives the process group's SIGTERM; the launcher drains."""
    s = runs["ddtree-shadow"]
    s.wait_log("The server is fired up and ready to roll!")
    s.proc.terminate()  # SIGTERM to the process group, as systemd stops the unit
    assert s.wait_exit(timeout=30) == KILLED
    tail = s.log()[s.log().index("SIGTERM received. signum=None frame=None. Draining requests and shutting down..."):]
    order = ["Gracefully exiting... Remaining number of requests 0. Remaining requests remaining_rids=[].",
             "destroy_process_group() was not called", "kill_process_tree called: "]
    assert [tail.index(t) for t in order] == sorted(tail.index(t) for t in order)
    assert "crashed with exit code" not in tail


def test_stop_without_a_dflash_worker_reads_as_a_crashed_scheduler(runs: dict[str, Standin]) -> None:
    """1_base_*: the scheduler dies of the SIGTERM, the watchdog calls it a crash, SIGQUIT cleans up."""
    s = runs["nextn-stop"]
    s.wait_log("The server is fired up and ready to roll!")
    s.proc.terminate()
    assert s.wait_exit(timeout=30) == KILLED
    tail = s.log()[s.log().index("SIGTERM received."):]
    assert re.search(r"Subprocess scheduler_0 \(pid=\d+\) crashed with exit code -15\. Triggering SIGQUIT for cleanup",
                     tail)
    order = ["SIGQUIT received. signum=None, frame=None.", "Sleeping 5 seconds", "No live scheduler processes found",
             "kill_process_tree called: "]
    assert [tail.index(t) for t in order] == sorted(tail.index(t) for t in order)
    assert not simgpu.holders(s.dir / "reg")  # its GPU memory is gone with it


def test_stray_memory_leaves_the_weights_no_kv(runs: dict[str, Standin]) -> None:
    """What real 0.5.17 printed beside other processes holding the card (3_ddtree_s025_shared_gpu)."""
    s = runs["stray-memory"]
    assert s.wait_exit() == KILLED
    assert "\nValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=" in s.log()
    assert 'kv_cache_configurator.py", line 1647, in _profile_available_bytes' in s.log()
    assert "Received sigquit from a child process. It usually means the child failed." in s.log()


def test_libcuda_fault_is_a_real_ctypes_oserror(runs: dict[str, Standin]) -> None:
    s = runs["libcuda"]
    assert s.wait_exit() == KILLED
    log = s.log()
    assert "OSError: libcuda.so.1: cannot open shared object file: No such file or directory" in log
    assert "ctypes/__init__.py" in log and "Load weight begin" not in log


def test_hang_never_gets_ready(runs: dict[str, Standin]) -> None:
    s = runs["hang"]
    s.wait_log("Uvicorn running on")
    assert s.get("/health")[0] == 503 and s.get("/health_generate")[0] == 503
    assert s.proc.poll() is None and "fired up" not in s.log()


def test_busy_port_is_uvicorns_bind_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        s = start(tmp_path, nextn_argv(port), port=port)
        assert s.wait_exit() == 1
    assert (f"ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): "
            "address already in use") in s.log()
