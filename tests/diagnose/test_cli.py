"""`ddtree-ops diagnose` as users run it: exit codes, stdout/stderr split, JSON contract."""

from __future__ import annotations

import io
import json
import sys

import pytest

from ddtree_ops.cli.app import main
from diagnose_helpers import CORPUS, FIXTURES


def run(argv: list[str], capsys: pytest.CaptureFixture[str], stdin: bytes | None = None,
        monkeypatch: pytest.MonkeyPatch | None = None) -> tuple[int, str, str]:
    if stdin is not None and monkeypatch is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_failure_exits_2_with_cause_and_remedy(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(["diagnose", "--log", str(CORPUS / "043-kv_pool_too_small.log")], capsys)
    assert rc == 2
    assert out == ""  # people's text goes to stderr
    assert "kv_pool_too_small" in err and "line 14" in err and "RAISE memory.mem_fraction_static" in err


def test_healthy_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(["diagnose", "--log", str(FIXTURES / "synthetic-healthy-full-startup.log")], capsys)
    assert rc == 0 and "HEALTHY" in err


DECODE = ("[2026-01-10 09:00:19 TP0] Decode batch, #running-req: 4, #token: 9000, token usage: 0.98, "
          "cuda graph: True, gen throughput (token/s): 310.2, #queue-req: 12, \n")
RETRACT = "[2026-01-10 09:00:20 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 1\n"


def test_serving_with_warnings_exits_1(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "w.log"
    log.write_text(DECODE + RETRACT)
    rc, _, err = run(["diagnose", "--log", str(log)], capsys)
    assert rc == 1 and "DEGRADED" in err


@pytest.mark.parametrize("text", [RETRACT, "hello\n",
                                  # a library's failure printed at warning level, after no sign of a
                                  # server that started (issue 31's two failures called healthy)
                                  "NCCL WARN NET/Socket : peer 10.0.0.2<51234> closed the connection\n"])
def test_no_failure_and_no_sign_of_serving_is_inconclusive_exit_3(text: str, tmp_path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "i.log"
    log.write_text(text)
    rc, out, err = run(["diagnose", "--log", str(log)], capsys)
    assert rc == 3 and out == "" and "INCONCLUSIVE" in err and "HEALTHY" not in err
    assert "no sign that this start served" in err  # what it did not find
    rc, out, _ = run(["diagnose", "--log", str(log), "--json"], capsys)
    doc = json.loads(out)
    assert (rc, doc["verdict"], doc["exit_code"], doc["root_cause"], doc["serving"]) == (3, "inconclusive", 3, None, None)
    assert "1 line(s)" in doc["inconclusive"]


@pytest.mark.parametrize("evidence, what", [
    (DECODE, "decode batch"),
    ('[2026-01-10 09:00:21] INFO:     127.0.0.1:38000 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n', "served request"),
    ("[2026-01-10 09:00:21] The server is fired up and ready to roll!\n", "ready"),
])
def test_healthy_needs_evidence_of_serving_and_says_which(evidence: str, what: str, tmp_path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "h.log"
    log.write_text("[2026-01-10 09:00:18 TP0] Load weight end. type=Qwen3ForCausalLM, mem usage=15.36 GB.\n" + evidence)
    rc, out, _ = run(["diagnose", "--log", str(log), "--json"], capsys)
    doc = json.loads(out)
    assert (rc, doc["verdict"], doc["serving"]) == (0, "healthy", {"line": 2, "evidence": what})


def test_a_later_start_that_never_served_is_not_healthy(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """Evidence counts for the last start in the log: a new server_args line after it opens a start
    that has shown nothing yet."""
    log = tmp_path / "two.log"
    log.write_text(DECODE + "[2026-01-10 09:05:00] server_args=ServerArgs(model_path='/models/Qwen3-8B', tp_size=1)\n"
                   "[2026-01-10 09:05:02 TP0] Load weight begin. avail mem=47.10 GB\n")
    rc, out, _ = run(["diagnose", "--log", str(log), "--json"], capsys)
    assert (rc, json.loads(out)["verdict"]) == (3, "inconclusive")


def test_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(["diagnose", "--log", str(CORPUS / "016-cuda_oom.log"), "--json"], capsys)
    doc = json.loads(out)
    assert rc == 2
    assert doc["schema_version"] == 1 and doc["verdict"] == "failed"
    assert doc["command"] == "diagnose" and doc["exit_code"] == rc == 2
    rcause = doc["root_cause"]
    assert {"label", "line", "evidence", "remedy"} <= rcause.keys()
    assert rcause["label"] == "cuda_oom" and rcause["line"] == 1 and rcause["direction"] == "lower"
    assert isinstance(doc["findings"], list) and doc["findings"]


def test_json_healthy_has_null_root_cause(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(["diagnose", "--log", str(CORPUS / "032-benign_warning.log"), "--json"], capsys)
    doc = json.loads(out)
    assert rc == 0 and doc["root_cause"] is None and doc["verdict"] == "healthy" and doc["exit_code"] == 0


def test_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    data = (CORPUS / "030-port_bind_error.log").read_bytes()
    rc, out, _ = run(["diagnose", "--log", "-", "--json"], capsys, stdin=data, monkeypatch=monkeypatch)
    assert rc == 2 and json.loads(out)["root_cause"]["label"] == "port_bind_error"


@pytest.mark.parametrize("make", ["missing", "directory", "empty"])
def test_unreadable_exits_3_without_traceback(make: str, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    path = {"missing": tmp_path / "nope.log", "directory": tmp_path, "empty": tmp_path / "empty.log"}[make]
    if make == "empty":
        path.write_bytes(b"")
    rc, out, err = run(["diagnose", "--log", str(path)], capsys)
    assert rc == 3 and out == "" and "Traceback" not in err and "error:" in err


@pytest.mark.parametrize("argv", [["diagnose"], ["diagnose", "ct129", "--log", "x.log"]])
def test_usage_errors_are_64(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(argv, capsys)
    assert rc == 64 and "exactly one of HOST or --log" in err


def test_binary_junk_file_is_read(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "junk.bin"
    log.write_bytes(bytes(range(256)) * 4000 + b"\nRuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    rc, _, err = run(["diagnose", "--log", str(log)], capsys)
    assert rc == 2 and "cuda_oom" in err


def test_module_level_imports_stay_light() -> None:
    import subprocess

    code = ("import sys, ddtree_ops.cli.diagnose; "
            "print(','.join(m for m in ('rich', 'yaml', 'ddtree_ops.diagnose.classify', 'paramiko') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_shadow_accounting_off_is_degraded_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    """DDTREE serves, but the plugin says its shadow accounting never ran: a warning, not a rollback."""
    rc, out, _ = run(["diagnose", "--log", str(FIXTURES / "synthetic-shadow_accounting_off-no-round.log"), "--json"], capsys)
    doc = json.loads(out)
    assert rc == 1 and doc["verdict"] == "degraded" and doc["root_cause"] is None
    warn = [f for f in doc["findings"] if f["severity"] == "warning"]
    assert [f["label"] for f in warn] == ["shadow_accounting_off"]
    assert "plugin-check" in warn[0]["remedy"] and "DDTREE_SHADOW_SHARE" in warn[0]["remedy"]


def test_unclassified_crash_shows_exception_frames_and_signature(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "u.log"
    log.write_text(
        "[2026-01-10 09:00:20 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/opt/venv/lib/python3.12/site-packages/sglang/srt/managers/scheduler.py", line 3594, in run_batch\n'
        "    batch_result = self.model_worker.forward_batch_generation(\n"
        '  File "/opt/venv/lib/python3.12/site-packages/ddtree_ops/engine/sglang_worker.py", line 88, in forward_batch_generation\n'
        "    out = self._tree.build(scores)\n"
        '  File "/opt/venv/lib/python3.12/site-packages/sglang/srt/layers/sampler.py", line 121, in forward\n'
        "    probs = logits.softmax(-1)\n"
        '  File "/opt/venv/lib/python3.12/site-packages/torch/nn/functional.py", line 2140, in softmax\n'
        "    ret = input.softmax(dim)\n"
        "KeyError: 'req_pool_idx 1234 not found in 0x7f3a9c'\n")
    rc, out, _ = run(["diagnose", "--log", str(log), "--json"], capsys)
    rc_doc = json.loads(out)["root_cause"]
    assert rc == 2 and rc_doc["label"] == "unclassified_crash"
    assert rc_doc["text"].startswith("KeyError:")
    frames = rc_doc["frames"]
    assert frames[0].startswith("torch/nn/functional.py:2140 in softmax")
    assert any(f.startswith("ddtree_ops/engine/sglang_worker.py:88") for f in frames)
    assert any(f.startswith("sglang/srt/layers/sampler.py:121") for f in frames)
    # numbers and addresses out, the engine's file and function in: a string to search trackers with
    assert rc_doc["signature"] == "KeyError: 'req_pool_idx N not found in N' (sglang/srt/layers/sampler.py in forward)"


def test_diagnose_log_starts_without_pydantic(tmp_path) -> None:
    """Start-up (issue 31): `diagnose --log` reads no profile, its string options need no coercion,
    and the catalogue comes parsed from the disk cache once a run has stored it, so neither pydantic
    nor yaml is imported on the way to the first line (they cost more than the rest of the start
    together). The options still arrive as typed."""
    import subprocess

    log = tmp_path / "one.log"
    log.write_text("[2026-01-10 09:00:20 TP0] Decode batch, #running-req: 1, #token: 5, \n")
    code = ("import sys, json\nfrom ddtree_ops.cli.app import main\n"
            "try:\n    main(['diagnose', '--log', sys.argv[1], '--json'])\nexcept SystemExit as e:\n    rc = e.code\n"
            "print(json.dumps({'rc': rc, 'heavy': [m for m in ('pydantic', 'yaml', 'paramiko') if m in sys.modules]}),"
            " file=sys.stderr)")
    subprocess.run([sys.executable, "-c", code, str(log)], capture_output=True, check=True)  # the disk cache filled
    res = subprocess.run([sys.executable, "-c", code, str(log)], capture_output=True, text=True, check=True)
    assert json.loads(res.stdout)["verdict"] == "healthy"  # the file given to --log was read
    assert json.loads(res.stderr.strip().splitlines()[-1]) == {"rc": 0, "heavy": []}, res.stderr
