"""A fake of the facts script's answer (ddtree_ops/hostfacts.FACTS), for `profile init`'s unit tests:
`InitHost` is the contract tests' FakeHost (tests/unit/fakehost.py: files, one systemd unit, its
journal, the tool's own preflight commands) that also answers the facts script from its own state,
the way the real script reads a host: the unit that serves and its launch line, the interpreters,
the GPU probe, the model directories under /models and the checkpoints beside the target.

The real script runs on real hosts in the lab (tests/lab/test_profile_init_lab.py) and locally on
the model part (tests/unit/test_profile_init_facts.py).
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass, field
from typing import Any

from fakehost import MIB_TOTAL, FakeHost

from ddtree_ops.hostfacts import FACTS
from ddtree_ops.launchline import exec_start

PYTHON = "/opt/sglang/venv/bin/python"
QWEN_CAPTURE = {"arch": "Qwen3ForCausalLM", "file": "qwen3.py",
                "methods": {"set_dflash_layers_to_capture": "qwen3.py:Qwen3ForCausalLM"},
                "architectures": ["Qwen3ForCausalLM"]}


def gpu_probe(cards: list[dict[str, Any]] | None = None, apps: list[dict[str, Any]] | None = None) -> str:
    cards = cards if cards is not None else [{"index": 0, "uuid": "GPU-fake-0", "name": "NVIDIA RTX A6000",
                                              "memory_total_mib": MIB_TOTAL, "memory_used_mib": 600,
                                              "memory_free_mib": MIB_TOTAL - 600, "compute_cap": "8.6"}]
    return json.dumps({"source": "nvml", "driver": "570.172.08", "errors": [] if cards else ["nvml: no GPU"],
                       "apps": apps or [], "gpus": cards})


@dataclass
class InitHost(FakeHost):
    pythons: list[dict[str, Any]] = field(default_factory=lambda: [{"path": PYTHON, "sglang": "0.5.23",
                                                                   "python": "3.11.2",
                                                                   "sglang_dir": "/opt/sglang/sglang"}])
    probe: str = field(default_factory=gpu_probe)
    spec: list[dict[str, Any]] | None = None  # the flags of the host's SGLang parser (None: could not ask)
    capture: dict[str, Any] = field(default_factory=lambda: dict(QWEN_CAPTURE))
    unit_env: str = ""  # Environment= as `systemctl show` prints it
    payloads: list[dict[str, Any]] = field(default_factory=list)  # what each facts run was asked

    def _dispatch(self, argv: list[str], stdin: bytes) -> tuple[str, int]:
        if argv[:2] == ["sh", "-c"] and len(argv) > 4 and argv[4] == FACTS:
            return "\x1d" + json.dumps(self.facts(json.loads(argv[5]))), 0
        if argv[:2] == ["sh", "-c"] and '"$1" -c "$2" 2>/dev/null || python3 -c "$2"' in argv[2]:  # gpu.snapshot
            return self.probe, 0  # preflight sees the cards the facts script saw
        if argv[1:4] == ["-m", "pip", "install"] or argv[:3] == ["rm", "-f", "--"]:  # the ddtree plugin's install
            return "", 0
        return super()._dispatch(argv, stdin)

    def facts(self, args: dict[str, Any]) -> dict[str, Any]:
        self.payloads.append(args)
        unit_path = f"/etc/systemd/system/{self.unit_name}"
        text = self.text(unit_path)
        out: dict[str, Any] = {"processes": [], "units": {}, "looked": ["/opt/sglang/venv/bin/python"],
                               "pythons": self.pythons, "gpu": self.probe, "gpu_error": "", "models": {},
                               "siblings": {}, "capture": {}, "errors": [],
                               "spec": json.dumps({"sglang": "0.5.23", "flags": self.spec}) if self.spec else None}
        targets, drafts = list(args.get("models") or []), list(args.get("drafts") or [])
        if text is not None:
            env_files = {}
            for line in text.splitlines():
                if line.startswith("EnvironmentFile="):
                    path = line.split("=", 1)[1]
                    env_files[path] = self.text(path)
            show = (f"Id={self.unit_name}\nLoadState=loaded\nActiveState={self.unit.active}\nSubState={self.unit.sub}\n"
                    f"MainPID={self.unit.pid}\nControlGroup=/system.slice/{self.unit_name}\nFragmentPath={unit_path}\n"
                    f"User=root\nUnitFileState=enabled\nEnvironment={self.unit_env}\n"
                    + "".join(f"EnvironmentFiles={p} (ignore_errors=no)\n" for p in env_files))
            argv = exec_start(text) or []
            running = self.unit.running
            out["units"][self.unit_name] = {"show": show, "cat": f"# {unit_path}\n{text}", "env_files": env_files,
                                            "procs": [{"pid": self.unit.pid, "argv": argv}] if running else []}
            if running:
                out["processes"].append({"pid": self.unit.pid, "argv": argv, "unit": self.unit_name})
            for flag, into in (("--model-path", targets), ("--speculative-draft-model-path", drafts)):
                if flag in argv:
                    into.append(argv[argv.index(flag) + 1])
        for path in dict.fromkeys(targets + drafts):
            out["models"][path] = self.model(path)
        for path in dict.fromkeys(targets):
            parent = posixpath.dirname(path.rstrip("/"))
            dirs = sorted({k[len(parent) + 1:].split("/")[0] for k in self.files if k.startswith(parent + "/")})
            out["siblings"][path] = [{"path": f"{parent}/{d}", "config": self.text(f"{parent}/{d}/config.json")}
                                     for d in dirs if f"{parent}/{d}" != path.rstrip("/")
                                     and self.text(f"{parent}/{d}/config.json") is not None]
            if self.text(f"{path}/config.json") is not None:
                out["capture"][path] = self.capture
        return out

    def model(self, path: str) -> dict[str, Any]:
        is_dir = any(k.startswith(path.rstrip("/") + "/") for k in self.files)
        return {"exists": is_dir or path in self.files, "is_dir": is_dir,
                "config": self.text(f"{path}/config.json"), "config_error": None if is_dir else "No such file",
                "index": self.text(f"{path}/model.safetensors.index.json"), "weight_files": 0, "weight_bytes": 0}
