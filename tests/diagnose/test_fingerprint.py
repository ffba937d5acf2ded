"""A failure no rule names is still described: its component, its exception and a remedy that says
which profile key to try or where to look; `diagnose GROUP` puts hosts that fail the same unnamed way
on one line (issue 31 item 2). Fixed logs, and the group path through the CLI with the fake Host."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from ddtree_ops.diagnose.catalogue import parse_catalogue
from ddtree_ops.diagnose.classify import CatalogueError, classify, load_catalogue
from ddtree_ops.diagnose.fingerprint import describe, split_exception
from ddtree_ops.diagnose.journal import Frame
from diagnose_helpers import REPO

SITE = "/opt/venv/lib/python3.12/site-packages"


def _tb(*frames: str, exc: str, head: str = "[2026-01-10 09:00:20 TP0] Scheduler hit an exception: ") -> list[str]:
    out = [head + "Traceback (most recent call last):"]
    for path_func in frames:
        path, func = path_func.split(":")
        out += [f'  File "{SITE}/{path}", line 42, in {func}', "    x = f()"]
    return out + [exc]


def _root(lines: list[str]) -> Any:
    rc = classify(lines).root_cause
    assert rc is not None and rc.label == "unclassified_crash" and rc.description is not None, rc
    return rc


def _frames(*path_funcs: str) -> list[Frame]:
    return [Frame(f"{SITE}/{pf.split(':')[0]}", 42, pf.split(":")[1]) for pf in path_funcs]


@pytest.mark.parametrize("frames, component, key", [
    (("sglang/srt/managers/scheduler.py:run_batch", "sglang/srt/layers/sampler.py:forward",
      "torch/nn/functional.py:softmax"), "scheduler", None),  # the innermost frame of a component, not torch's
    (("sglang/srt/managers/scheduler.py:run_batch", "sglang/srt/speculative/eagle_worker.py:draft",
      "torch/nn/functional.py:linear"), "speculative_worker", "modes.<mode>.draft_model_path"),
    (("sglang/srt/managers/scheduler.py:run_batch", "sglang/srt/layers/attention/flashinfer_backend.py:forward_decode"),
     "attention_backend", "memory.attention_backend"),
    (("sglang/srt/model_executor/cuda_graph_runner.py:capture", "sglang/srt/models/qwen3.py:forward"),
     "scheduler", None),  # innermost first: the model's forward, inside the capture
    (("sglang/srt/model_executor/model_runner.py:init", "sglang/srt/model_executor/cuda_graph_runner.py:capture"),
     "cuda_graph", "memory.cuda_graph"),
    (("sglang/srt/layers/attention/triton_backend.py:forward", "triton/runtime/jit.py:run"),
     "triton_jit", "memory.attention_backend"),
    (("flashinfer/decode.py:plan", "flashinfer/jit/core.py:build"), "flashinfer_jit", "memory.attention_backend"),
    (("sglang/srt/model_executor/model_runner.py:load_model", "sglang/srt/model_loader/loader.py:load_model"),
     "model_loader", "service.model_path"),
    (("sglang/srt/managers/scheduler.py:init", "torch/distributed/distributed_c10d.py:barrier"), "nccl", "service.env"),
    (("sglang/srt/entrypoints/http_server.py:generate_request",), "http_server", None),
    (("sglang/srt/utils/common.py:helper",), "sglang", None),
])
def test_the_component_is_the_innermost_raising_frame_that_belongs_to_one(frames: tuple[str, ...], component: str,
                                                                         key: str | None) -> None:
    d = describe("KeyError: 'req_pool_idx 1234 not found'", _frames(*frames), "", load_catalogue().components)
    assert d.component.id == component and d.named_by.startswith("frame "), d
    assert (d.exception, d.message) == ("KeyError", "'req_pool_idx 1234 not found'")
    # the remedy names the profile key to try where the component has one, otherwise where to look
    assert d.component.profile_key == key and (key is None or key in d.component.remedy)


@pytest.mark.parametrize("frames, component, key", [
    (("sglang/srt/managers/scheduler.py:run_batch", "sglang/srt/layers/sampler.py:forward",
      "torch/nn/functional.py:softmax"), "scheduler", None),
    (("sglang/srt/managers/scheduler.py:run_batch", "sglang/srt/layers/attention/flashinfer_backend.py:forward_decode"),
     "attention_backend", "memory.attention_backend"),
    (("sglang/srt/model_executor/model_runner.py:init", "sglang/srt/model_executor/cuda_graph_runner.py:capture"),
     "cuda_graph", "memory.cuda_graph"),
    (("sglang/srt/model_executor/model_runner.py:load_model", "sglang/srt/model_loader/loader.py:load_model"),
     "model_loader", "service.model_path"),
])
def test_an_unnamed_crash_carries_its_component_and_its_remedy(frames: tuple[str, ...], component: str,
                                                              key: str | None) -> None:
    rc = _root(_tb(*frames, exc="KeyError: 'req_pool_idx 1234 not found'"))
    assert rc.description.component.id == component, rc.description
    assert rc.profile_key == key and rc.remedy == rc.description.component.remedy
    assert "add a rule" not in rc.remedy  # not the generic backstop's words any more
    assert rc.to_json()["fingerprint"]["exception"] == "KeyError"


@pytest.mark.parametrize("exc, component", [
    ("RuntimeError: CUDA error: misaligned address", "cuda_runtime"),
    ("RuntimeError: CUBLAS_STATUS_EXECUTION_FAILED when calling cublasGemmEx", "cuda_runtime"),
    ("torch.distributed.DistStoreError: Socket Timeout", "nccl"),
])
def test_the_message_names_its_layer_before_the_frames(exc: str, component: str) -> None:
    rc = _root(_tb("sglang/srt/managers/scheduler.py:run_batch", exc=exc))
    assert rc.description.component.id == component and rc.description.named_by == "the message"


def test_without_frames_the_logger_prefix_names_the_component() -> None:
    # a death at the end of a log whose last record is torch C++'s glog line from ProcessGroupNCCL
    lines = ["[2026-01-10 09:00:01 TP0] Load weight end. type=Qwen3ForCausalLM, mem usage=15.36 GB.",
             "[E1120 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 1] Some process failed: exiting with exit code 6"]
    rep = classify(lines)
    rc = rep.root_cause
    assert rc is not None and rc.rule_id == "process_died_at_end" and rc.line == 2, rep.findings
    assert rc.description.component.id == "nccl" and "ProcessGroupNCCL.cpp" in rc.description.named_by
    assert rc.profile_key == "service.env" and "NCCL_DEBUG=INFO" in rc.remedy
    # SGLang's own record prefix (TPn: a scheduler process) when nothing else names it
    rc = _root(["[2026-01-10 09:00:07 DP1 TP3] KeyError: 'cached_tokens'"])
    assert rc.description.component.id == "scheduler" and "TP3" in rc.description.named_by


def test_nothing_known_says_where_to_look() -> None:
    rc = _root(["Traceback (most recent call last):", '  File "/srv/app/run.py", line 3, in main', "    go()",
                "ZeroDivisionError: division by zero"])
    assert rc.description.component.id == "unknown" and rc.profile_key is None
    assert "lines just above" in rc.remedy


def test_the_fingerprint_keeps_the_kind_and_drops_numbers_addresses_and_paths() -> None:
    def key(exc: str, *frames: str) -> str:
        return _root(_tb(*(frames or ("sglang/srt/layers/sampler.py:forward",)), exc=exc)).description.key

    same = key("KeyError: 'req_pool_idx 1234 not found in 0x7f3a9c'")
    assert key("KeyError: 'req_pool_idx 77 not found in 0x55aa01'") == same
    assert key("IndexError: 'req_pool_idx 77 not found in 0x55aa01'") != same  # another class
    assert key("KeyError: 'req_pool_idx 77 not found in 0x55aa01'", "sglang/srt/model_loader/loader.py:load") != same
    assert key("KeyError: 'page 3 missing'") != same
    assert key("KeyError: '/opt/a/b/c.json'") == key("KeyError: '/srv/x/y/c.json'")  # paths out


def test_exception_class_and_message_are_split_as_cpython_and_libstdcxx_print_them() -> None:
    assert split_exception("torch.OutOfMemoryError: CUDA out of memory.") == ("torch.OutOfMemoryError", "CUDA out of memory.")
    assert split_exception("ray.exceptions.RayTaskError(ValueError): boom") == ("ray.exceptions.RayTaskError(ValueError)", "boom")
    assert split_exception("terminate called after throwing an instance of 'c10::DistBackendError'") == (
        "c10::DistBackendError", "")
    assert split_exception("Received sigquit from a child process.") == ("", "Received sigquit from a child process.")


def test_the_shipped_components_each_have_a_remedy_and_a_way_to_be_found() -> None:
    comps = load_catalogue().components
    assert [c.id for c in comps][:3] == ["cuda_runtime", "nccl", "cpp_abort"]  # the message's words first
    assert {"scheduler", "model_loader", "speculative_worker", "attention_backend", "flashinfer_jit", "triton_jit",
            "nccl", "cuda_runtime", "cpp_abort"} <= {c.id for c in comps}
    keyed = {c.id: c.profile_key for c in comps if c.profile_key}
    assert keyed["attention_backend"] == "memory.attention_backend" and keyed["cuda_graph"] == "memory.cuda_graph"
    assert keyed["speculative_worker"] == "modes.<mode>.draft_model_path" and keyed["nccl"] == "service.env"
    shipped = (REPO / "ddtree_ops" / "diagnose" / "catalogue.yaml").read_text("utf-8")
    for bad, why in (("{id: x, name: X, paths: [/x/]}", "remedy"), ("{id: x, name: X, remedy: {text: look}}", "found by"),
                     ("{id: x, name: X, logger: ['(('], remedy: {text: look}}", "does not compile")):
        with pytest.raises(CatalogueError, match=why):
            parse_catalogue(shipped.replace("components:\n", f"components:\n  - {bad}\n", 1))


def test_the_human_report_shows_component_and_exception(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ddtree_ops.cli.app import main

    log = tmp_path / "u.log"
    log.write_text("\n".join(_tb("sglang/srt/managers/scheduler.py:run_batch",
                                 "sglang/srt/layers/attention/flashinfer_backend.py:forward_decode",
                                 exc="AssertionError: page table out of range")) + "\n")
    with pytest.raises(SystemExit) as done:
        main(["diagnose", "--log", str(log)])
    err = capsys.readouterr().err
    assert done.value.code == 2
    assert "component SGLang's attention backend (named by frame sglang/srt/layers/attention/flashinfer_backend.py" in err
    assert "exception AssertionError: page table out of range" in err
    assert "change memory.attention_backend" in err


# ------------------------------------------------------------------ diagnose GROUP, through the CLI

sys.path.insert(0, str(REPO / "tests" / "unit"))  # the contract tests' fake Host (tests/unit/fakehost.py)
from fakehost import FakeHost, Unit, factory  # noqa: E402


class DiagnosableHost(FakeHost):
    """The contract tests' fake GPU host, answering what `diagnose HOST` asks as well: the journal
    as `journalctl -o json` (by invocation, or the unit's recent lines), an empty kernel log, and
    no nvidia-smi (a missing binary, which diagnose reports as a check)."""

    def _dispatch(self, argv: list[str], stdin: bytes) -> tuple[str, int]:
        if argv[0] == "journalctl":
            if "-k" in argv:
                return "", 0
            inv = next((a.split("=", 1)[1] for a in argv if a.startswith("_SYSTEMD_INVOCATION_ID=")), None)
            return "\n".join(json.dumps({"MESSAGE": m, "_SYSTEMD_INVOCATION_ID": i, "__REALTIME_TIMESTAMP":
                                         str(1_767_000_000_000_000 + n * 1000)})
                             for n, (i, m) in enumerate(self.journal) if inv is None or i == inv), 0
        if argv[0] == "nvidia-smi":
            return "", 127
        return super()._dispatch(argv, stdin)

    def crash(self, lines: list[str]) -> None:
        """This start died with these lines (the unit failed)."""
        self.unit = Unit(active="failed", sub="failed", result="exit-code", invocation="inv-crash")
        self.journal += [("inv-crash", ln) for ln in lines]


def test_a_group_puts_hosts_that_fail_the_same_unnamed_way_on_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from ddtree_ops.cli.app import main
    from ddtree_ops.profile import load_profile

    for var in ("DDTREE_OPS_INVENTORY", "DDTREE_OPS_PROFILES", "DDTREE_OPS_SSH_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    profiles = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", profiles)
    group = profiles / "groups" / "a6000.yaml"
    group.write_text(group.read_text().replace("gpu:\n", "hosts: [g01, g02, g03, g04]\n\ngpu:\n", 1))
    hosts = {n: DiagnosableHost.serving(load_profile(n, directory=profiles).model_copy(update={"name": n}), "nextn")
             for n in ("g01", "g02", "g03", "g04")}
    # the same unnamed failure on g01 and g03 (only its numbers differ), another on g02; g04 serves
    hosts["g01"].crash(_tb("sglang/srt/layers/attention/flashinfer_backend.py:forward_decode",
                           exc="AssertionError: kv index 4181 out of range 4096"))
    hosts["g03"].crash(_tb("sglang/srt/layers/attention/flashinfer_backend.py:forward_decode",
                           exc="AssertionError: kv index 77 out of range 2048"))
    hosts["g02"].crash(_tb("sglang/srt/configs/model_config.py:__init__", exc="KeyError: 'rope_scaling'"))

    def run(*args: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as done:
            main(["diagnose", "a6000", *args, "--profiles", str(profiles)], obj=factory(hosts))
        out = capsys.readouterr()
        return int(done.value.code), out.out, out.err

    rc, out, err = run("--json")
    doc = json.loads(out)
    assert rc == 2 and (doc["command"], doc["exit_code"], doc["schema_version"]) == ("diagnose", 2, 1)
    causes = {tuple(c["hosts"]): c for c in doc["causes"]}
    assert set(causes) == {("g01", "g03"), ("g02",), ("g04",)}, doc["causes"]
    attn, spec = causes[("g01", "g03")], causes[("g02",)]
    assert attn["verdict"] == spec["verdict"] == "failed" and attn["fingerprint"] != spec["fingerprint"]
    assert attn["cause"].startswith("unclassified_crash: SGLang's attention backend: AssertionError: kv index")
    assert "memory.attention_backend" in attn["remedy"] and "service.model_path" in spec["remedy"]
    assert causes[("g04",)]["verdict"] == "healthy"  # the fake answers /health_generate: serving
    assert {h["host"]: h["exit_code"] for h in doc["hosts"]} == {"g01": 2, "g02": 2, "g03": 2, "g04": 0}
    rc, out, err = run()
    rows = out.splitlines()[1:]
    assert rc == 2 and len(rows) == 3, out  # one line per way of failing, not per host or per label
    assert rows[0].startswith("failed   unclassified_crash: SGLang's attention backend") and rows[0].endswith("2  g01 g03")
    assert "memory.attention_backend" in err  # each line's remedy, once
