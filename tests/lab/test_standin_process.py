"""The stand-in as a local process (no lab): SGLang's real parser and plugin loader, the endpoints, and
each failure with SGLang's own text and exit status."""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path
from typing import Iterator

import pytest

from ddtree_ops.lab.standin import simgpu

from standin_proc import Standin, ddtree_argv, free_port, nextn_argv, start

pytest.importorskip("sglang.srt.server_args")
pytestmark = pytest.mark.slow
KILLED = -signal.SIGKILL  # SGLang's launcher kills itself when the scheduler dies (SIGQUIT handler)


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
    log = nextn.log()
    for line in ("Load weight end. elapsed=", "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 161446, ",
                 "Capture target verify CUDA graph end. bs=[1, 2, 4]", "max_total_num_tokens=161446, chunked_prefill_size=4096",
                 "Uvicorn running on http://127.0.0.1:", "LAB STAND-IN", "accept len: "):
        assert line in log, line


def test_it_holds_gpu_memory_while_alive(nextn: Standin) -> None:
    held = simgpu.holders(nextn.dir / "reg")
    assert [h.pid for h in held] == [nextn.proc.pid] and 38_000 < held[0].used_mib < 42_000


CASES = {
    "unknown-flag": lambda port: dict(argv=nextn_argv(port) + ["--speculative-ddtree-budget", "8"]),
    "ddtree-no-plugin": lambda port: dict(argv=ddtree_argv(port)),
    "ddtree-plain-plugin": lambda port: dict(argv=ddtree_argv(port), plugin="plain"),
    "ddtree-family-plugin": lambda port: dict(argv=ddtree_argv(port), plugin="family"),
    "stray-memory": lambda port: dict(argv=ddtree_argv(port), plugin="family"),
    "libcuda": lambda port: dict(argv=nextn_argv(port), faults=("libcuda-missing",)),
    "hang": lambda port: dict(argv=nextn_argv(port), faults=("hang",)),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Standin]]:
    """Every case launched at once (each pays SGLang's ~5 s import; in parallel they share the wait)."""
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


def test_ddtree_plugin_that_is_not_dflash_family_dies_at_warmup(runs: dict[str, Standin]) -> None:
    s = runs["ddtree-plain-plugin"]
    assert s.wait_exit() == KILLED
    log = s.log()
    assert "Uvicorn running on" in log and "The server is fired up" not in log
    for text in ("Scheduler hit an exception: Traceback (most recent call last):",
                 "RuntimeError: DFLASH requires target aux hidden capture for prefill, but got None. Make sure the "
                 "target model has DFlash layers-to-capture configured.",
                 "Received sigquit from a child process. It usually means the child failed."):
        assert text in log, text


def test_ddtree_plugin_that_declares_dflash_family_serves(runs: dict[str, Standin]) -> None:
    s = runs["ddtree-family-plugin"]
    s.wait_log("The server is fired up and ready to roll!")
    _, doc = s.post("/generate", {"text": "Tell me a story", "sampling_params": {"max_new_tokens": 64}})
    assert 3.5 <= doc["meta_info"]["spec_accept_length"] <= 5.5
    assert "Initialized DFLASH draft runner." in s.log()


def test_stray_memory_is_sglangs_not_enough_memory(runs: dict[str, Standin]) -> None:
    s = runs["stray-memory"]
    assert s.wait_exit() == KILLED
    assert ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            "Current value: mem_fraction_static=0.85") in s.log()
    assert "pool_configurator.py" in s.log()


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
