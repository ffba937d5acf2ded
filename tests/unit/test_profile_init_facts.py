"""The facts `profile init` asks a host for (ddtree_ops/hostfacts.py): the script itself, run here on
model directories this test makes, and the pure parsers on answers written by hand from what
systemd and the script print. The parts of the script that read this machine's own units and
processes are not asserted here (they differ per machine); the lab runs them on real hosts."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ddtree_ops.hostfacts import FACTS, facts_argv, gather, parse_facts, unit_facts
from ddtree_ops.host import Result

FIXTURES = Path(__file__).resolve().parents[2] / "ddtree_ops" / "lab" / "fixtures"
UNIT_TEXT = ("# /etc/systemd/system/sglang.service\n[Service]\nEnvironmentFile=/etc/sglang.env\n"
             "ExecStart=/opt/v/bin/python -m sglang.launch_server --model-path ${MODEL} --port 30000\n")
SHOW = ("Id=sglang.service\nActiveState=active\nSubState=running\nMainPID={pid}\nUser=svc\n"
        "Environment=A=1 \"B=two words\"\nEnvironmentFiles=/etc/sglang.env (ignore_errors=no)\n")


def answer(**over: Any) -> str:
    doc: dict[str, Any] = {"processes": [], "units": {}, "pythons": [], "looked": [], "models": {}, "siblings": {},
                           "capture": {}, "errors": [], "gpu": "", "gpu_error": "no nvidia-smi"}
    doc.update(over)
    return "some noise\n\x1d" + json.dumps(doc)


def test_the_script_reads_models_drafts_and_the_checkpoints_beside_them(tmp_path: Path) -> None:
    pytest.importorskip("sglang", reason="the interpreter with SGLang 0.5.23 is the one the script chooses")
    models = tmp_path / "models"
    for name in ("Qwen3-8B", "Qwen3-8B-NextN", "Qwen3-8B-DFlash-b16"):
        shutil.copytree(FIXTURES / name, models / name)
    (models / "Qwen3-8B" / "model-00001.safetensors").write_bytes(b"\0" * 1000)
    (models / "notes").mkdir()
    target, missing = str(models / "Qwen3-8B"), str(models / "nope")
    res = subprocess.run(facts_argv([target, missing], [str(models / "Qwen3-8B-NextN")], [sys.executable]),
                         capture_output=True, text=True, timeout=600)
    facts = parse_facts(res.stdout)
    assert facts.python is not None and facts.python.path == sys.executable and facts.python.sglang == "0.5.23"
    assert facts.spec and any(s.dest == "mem_fraction_static" for s in facts.spec)
    m = facts.models[target]
    assert m.config and m.config["architectures"] == ["Qwen3ForCausalLM"] and m.index is not None
    assert (m.weight_files, m.weight_bytes) == (1, 1000)
    assert facts.models[missing].error == "does not exist"
    assert [s.path for s in facts.siblings[target]] == [str(models / "Qwen3-8B-DFlash-b16"),
                                                        str(models / "Qwen3-8B-NextN")]
    assert facts.capture[target]["methods"]["set_dflash_layers_to_capture"] == "qwen3.py:Qwen3ForCausalLM"
    assert "/opt/sglang/venv/bin/python" in facts.looked


def test_a_serving_unit_runs_what_its_process_runs() -> None:
    argv = ["/opt/v/bin/python", "-m", "sglang.launch_server", "--model-path", "/m/Q", "--port", "30000"]
    raw = {"show": SHOW.format(pid=42), "cat": UNIT_TEXT, "env_files": {"/etc/sglang.env": "MODEL=/m/Q\nB=file\n"},
           "procs": [{"pid": 40, "argv": ["/bin/sh", "-c", "wrapper"]}, {"pid": 42, "argv": argv},
                     {"pid": 50, "argv": ["/opt/v/bin/python", "-c", "from multiprocessing.spawn import spawn_main"]}]}
    u = unit_facts("sglang.service", raw, [])
    assert u.serving and u.argv == argv and u.argv_from == "process 42" and u.user == "svc"
    assert u.env == {"A": "1", "B": "file", "MODEL": "/m/Q"}


def test_a_unit_that_does_not_run_is_read_from_its_exec_start() -> None:
    raw = {"show": SHOW.format(pid=0).replace("active", "failed"), "cat": UNIT_TEXT,
           "env_files": {"/etc/sglang.env": "MODEL=/m/Q\n"}, "procs": []}
    u = unit_facts("sglang.service", raw, [])
    assert not u.serving and u.argv_from == "ExecStart"
    assert u.argv == ["/opt/v/bin/python", "-m", "sglang.launch_server", "--model-path", "/m/Q", "--port", "30000"]


def test_parse_facts_orders_the_serving_unit_first_and_reads_every_part() -> None:
    argv = ["/opt/v/bin/python", "-m", "sglang.launch_server"]
    units = {"old.service": {"show": SHOW.format(pid=0).replace("active", "inactive"), "cat": UNIT_TEXT,
                             "env_files": {}, "procs": []},
             "sglang.service": {"show": SHOW.format(pid=7), "cat": UNIT_TEXT, "env_files": {}, "procs": []}}
    spec = {"sglang": "0.5.23", "flags": [{"options": ["--port"], "dest": "port", "nargs": None, "choices": None}]}
    facts = parse_facts(answer(units=units, processes=[{"pid": 7, "argv": argv, "unit": "sglang.service"}],
                               pythons=[{"path": "/usr/bin/python3", "sglang": None},
                                        {"path": "/opt/v/bin/python", "sglang": "0.5.23"}],
                               spec=json.dumps(spec), models={"/m/Q": {"exists": True, "is_dir": True,
                                                                      "config": "[1]", "config_error": None}}))
    assert [u.name for u in facts.units] == ["sglang.service", "old.service"]
    assert facts.serving() is facts.units[0]
    assert facts.python is not None and facts.python.path == "/opt/v/bin/python"
    assert facts.spec is not None and facts.spec[0].options == ("--port",)
    assert facts.models["/m/Q"].error == "config.json is not a JSON object"
    assert facts.gpu.errors == ["GPU probe printed nothing: no nvidia-smi"]


class _Once:
    name = "h"

    def __init__(self, result: Result) -> None:
        self.result, self.calls = result, []

    def run(self, argv: Any, **kw: Any) -> Result:
        self.calls.append((list(argv), kw))
        return self.result


def test_gather_is_one_command_and_says_when_the_host_has_no_python() -> None:
    host = _Once(Result(("sh",), 127, "", "no python3 on the host"))
    facts = gather(host, models=["/m"], drafts=[], pythons=[])  # type: ignore[arg-type]
    assert len(host.calls) == 1 and host.calls[0][0][4] == FACTS and host.calls[0][1]["sudo"] is True
    assert any("no python3" in e for e in facts.errors)
    assert parse_facts("Traceback ...").errors[0].startswith("the facts script printed no answer")
