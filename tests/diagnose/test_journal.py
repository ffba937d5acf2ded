"""Prefix stripping, journal JSON and traceback grouping (pure helpers)."""

from __future__ import annotations

import json

import pytest

from ddtree_ops.diagnose.journal import TracebackTracker, clean_line, json_messages, looks_like_json_journal


@pytest.mark.parametrize("raw, text", [
    ("Nov 29 07:29:01 ct129 sglang-ddtree[41231]: RuntimeError: boom", "RuntimeError: boom"),
    ("Nov  9 07:29:01.123456 ct129 python3[7]: x y", "x y"),
    ("2025-11-29T07:29:01+0000 ct129 kernel: NVRM: Xid (PCI:0000:01:00): 79", "NVRM: Xid (PCI:0000:01:00): 79"),
    ("Sat 2025-11-29 07:29:01 UTC ct129 sglang[1]: hello", "hello"),
    # a container timestamp followed by "LEVEL target:" reads like short-iso "host ident:": both are prefixes
    ("2023-02-20T06:44:19.335010Z ERROR text_generation_launcher: Download", "Download"),
    ("2023-02-20T06:44:19.335010Z RuntimeError: CUDA error", "RuntimeError: CUDA error"),
    ("[26002.108918] Out of memory: Killed process 576419 (python)", "Out of memory: Killed process 576419 (python)"),
    ("(WorkerDict pid=859188) RuntimeError: CUDA error", "RuntimeError: CUDA error"),
    ("(pid=12, ip=10.0.0.1) [2025-05-23 18:02:42] Received sigquit", "Received sigquit"),
    ("[rank0]: RuntimeError: CUDA error: no kernel image", "RuntimeError: CUDA error: no kernel image"),
    ("sglang-1  | [2025-02-17 10:13:46 TP4] Scheduler hit an exception:", "Scheduler hit an exception:"),
    ("(VllmWorkerProcess pid=195295) ERROR 03-02 19:49:43 [multiproc_worker_utils.py:242] torch.OutOfMemoryError: x",
     "torch.OutOfMemoryError: x"),
    ("Nov 29 07:29:01 ct129 u[1]:     raise RuntimeError(", "    raise RuntimeError("),
    # Ray: the actor prefix, its colour codes and the de-duplication suffix
    ("(SGLangEngine pid=23902) subprocess.CalledProcessError: x [repeated 2x across cluster]",
     "subprocess.CalledProcessError: x"),
    ("\x1b[36m(SGLangEngine pid=23902, ip=10.0.0.7)\x1b[0m RuntimeError: boom", "RuntimeError: boom"),
    ("(raylet, ip=10.0.0.7) RuntimeError: boom", "RuntimeError: boom"),
    ("(EngineCore_DP0 pid=173913) ERROR 12-25 17:14:01 [patch_core.py:58] RuntimeError: boom", "RuntimeError: boom"),
    # Kubernetes: kubectl logs --prefix, and the CRI file format kept on the node
    ("[pod/sglang-0/server] RuntimeError: boom", "RuntimeError: boom"),
    ("2026-01-04T01:42:55.123456789Z stderr F RuntimeError: boom", "RuntimeError: boom"),
    # docker compose, coloured
    ("\x1b[36msglang-1  |\x1b[0m RuntimeError: boom", "RuntimeError: boom"),
    ("gpt_raisound-webserver-1         | ValueError: No component", "ValueError: No component"),
    # a GitHub Actions timestamp before a Python warning: the path is not a journald host name
    ("2025-10-09T04:12:15.2940207Z /usr/lib/python3.10/torch/cuda/__init__.py:63: FutureWarning: The pynvml package",
     "/usr/lib/python3.10/torch/cuda/__init__.py:63: FutureWarning: The pynvml package"),
    # vLLM before 0.6 (vllm/logger.py "%(levelname)s %(asctime)s %(filename)s:%(lineno)d] ")
    ("ERROR 01-12 03:08:10 engine.py:135] RuntimeError: boom", "RuntimeError: boom"),
    # SGLang's diffusion runtime (multimodal_gen logging_utils: "[%(asctime)s] " with "%m-%d %H:%M:%S")
    ("[12-16 14:27:10] Exit code: -9", "Exit code: -9"),
    # Python logging's "%(asctime)s - %(name)s - %(levelname)s - " around SGLang's own record (olmocr)
    ("2025-03-07 23:50:27,532 - __main__ - INFO - [2025-03-07 23:50:27 TP0] Init torch distributed begin.",
     "Init torch distributed begin."),
    # ... without the name ("%(asctime)s - %(levelname)s - %(message)s")
    ("2026-01-04 10:00:00,123 - ERROR - RuntimeError: boom", "RuntimeError: boom"),
    # "%(asctime)s [%(levelname)s] %(name)s: " (sglang-omni, logcorpus 717): the module name goes, an exception's stays
    ("2026-04-23 06:34:19,487 [ERROR] sglang.srt.managers.scheduler: RuntimeError: boom", "RuntimeError: boom"),
    ("2026-04-23 06:34:19,487 [ERROR] torch.OutOfMemoryError: CUDA out of memory.", "torch.OutOfMemoryError: CUDA out of memory."),
    # DeepSpeed's launcher (deepspeed/utils/logging.py: "[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] ")
    ("[2024-02-06 06:23:39,510] [ERROR] [launch.py:321:sigkill_handler] ['python'] exits with return code = -9",
     "['python'] exits with return code = -9"),
    # glog (abseil, XLA/JAX, Ray's C++ parts) and torch C++'s bracketed form (c10/util/Logging.cpp)
    ("E0523 10:00:00.123456  1234 cuda_dnn.cc:535] RuntimeError: boom", "RuntimeError: boom"),
    ("[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout",
     "[Rank 0] Watchdog caught collective operation timeout"),
    # a log viewer's line number before the line (logcorpus 700), and a shell's job line that is not one
    ("[80746] Killed", "Killed"),
    ("[1]+  Killed                  python3 -m sglang.launch_server", "[1]+  Killed                  python3 -m sglang.launch_server"),
])
def test_prefixes_are_stripped(raw: str, text: str) -> None:
    assert clean_line(raw)[0] == text


def test_a_record_prefix_marks_a_new_record() -> None:
    assert clean_line("[2025-02-17 10:13:46 TP4] Decode batch")[1] is True
    assert clean_line("  File \"x.py\", line 1, in f")[1] is False


def test_json_message_byte_arrays_and_multiline() -> None:
    entry = {"MESSAGE": list("caf\u00e9 ".encode() + b"\xff"), "_PID": "1"}
    assert json_messages(json.dumps(entry)) == ["caf\u00e9 \ufffd"]
    assert json_messages(json.dumps({"MESSAGE": "a\nb"})) == ["a", "b"]
    assert json_messages("{not json") is None
    assert json_messages(json.dumps({"NO_MESSAGE": 1})) is None
    assert looks_like_json_journal(b'\n{"MESSAGE": "x"}\n')
    assert not looks_like_json_journal(b"Nov 29 07:29:01 h u[1]: {\"MESSAGE\": 1}")


def test_traceback_groups_chain_and_close() -> None:
    tb = TracebackTracker()
    lines = [
        "Traceback (most recent call last):", '  File "/a/server_args.py", line 1, in f', "    g()",
        "RuntimeError: first", "", "During handling of the above exception, another exception occurred:", "",
        "Traceback (most recent call last):", '  File "/b.py", line 2, in h', "Exception: second",
        "", "[2025-01-01 00:00:00] next record",
    ]
    kinds = [tb.step(t, t.startswith("[2025"), i + 1) for i, t in enumerate(lines)]
    assert [k for _, k in kinds][:4] == ["header", "frame", "code", "exc"]
    assert {g for g, _ in kinds[:11]} == {1}  # one group across the chain
    assert kinds[11] == (None, "other") and not tb.open
    assert tb.frames == ["/b.py"] or "/a/server_args.py" in tb.frames + ["/a/server_args.py"]


def test_a_pipe_inside_a_message_is_not_a_compose_prefix() -> None:
    """Found by the catalogue's property test: "Assertion |0 failed." lost its first word to the
    docker-compose prefix rule, so the device-assert rule never saw it."""
    from ddtree_ops.diagnose.classify import classify

    assert [f.rule_id for f in classify([b"sglang[1]: Assertion |0 failed."]).findings] == ["device_assert_kernel"]
    assert [f.label for f in classify([b"sglang-1  | RuntimeError: CUDA error: device-side assert triggered"]).findings] \
        == ["device_assert"]


def test_unindented_source_lines_do_not_end_the_frames() -> None:
    """A paste that lost its indentation (logcorpus 502): the source line under a frame is not the
    exception, so the frames after it, where speculative code raised, still count."""
    tb = TracebackTracker()
    lines = [
        "Scheduler hit an exception: Traceback (most recent call last):",
        'File "/x/sglang/srt/managers/scheduler.py", line 1367, in run_batch',
        ") = self.draft_worker.forward_batch_speculative_generation(batch)",
        'File "/x/sglang/srt/speculative/eagle_worker.py", line 12, in forward_batch_speculative_generation',
        "self.verify(batch)",
        "RuntimeError: boom",
    ]
    kinds = [tb.step(t, False, i + 1)[1] for i, t in enumerate(lines)]
    assert kinds == ["header", "frame", "loose", "frame", "loose", "exc"]
    assert tb.frames[-1].endswith("speculative/eagle_worker.py")


def test_a_flattened_traceback_quotes_raise_as_code() -> None:
    """CloudWatch joins a traceback onto one line (logcorpus 508): `raise OfflineModeIsEnabled(`
    there is the frame's source code; the exception line after it is the evidence."""
    from ddtree_ops.diagnose.classify import classify

    rep = classify([
        'Traceback (most recent call last): File "/h/huggingface_hub/file_download.py", line 1261, in hf_hub_download '
        'metadata = get_hf_file_metadata( File "/h/huggingface_hub/utils/_http.py", line 78, in send raise OfflineModeIsEnabled(',
        "huggingface_hub.errors.OfflineModeIsEnabled: Cannot reach https://huggingface.co/x/y/resolve/main/config.json",
    ])
    assert rep.root_cause is not None and rep.root_cause.line == 2
    assert rep.root_cause.label == "hf_download_blocked"
