"""The SGLang plugin against sglang 0.5.23 itself (installed --no-deps, CPU torch).

Checked here: SGLang's own loader finds and filters the entry point; DDTREE resolves and answers
every predicate as DFLASH; the conditions in SGLang's source that set up hidden capture, the
draft KV pool and the DFlash verify graphs are taken for DDTREE (evaluated from SGLang's own
source) and not for a plain CustomSpecAlgo (the trap); the validator accepts and refuses the
right flag sets; DFLASH's server-args hook runs for DDTREE through SGLang's recorder."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest
from needs import SGLANG

pytestmark = [SGLANG, pytest.mark.engine]

_SGLANG = importlib.util.find_spec("sglang")
# where SGLang is installed, without importing it (the tests import it in processes of their own)
SRT = pathlib.Path(_SGLANG.origin).parent / "srt" if _SGLANG and _SGLANG.origin else pathlib.Path("/nonexistent")
FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "ddtree_ops" / "lab" / "fixtures"
TARGET, DRAFT = str(FIXTURES / "Qwen3-8B"), str(FIXTURES / "Qwen3-8B-DFlash-b16")


@pytest.fixture(scope="module")
def algos() -> dict[str, Any]:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo, get_spec

    from ddtree_ops.engine.sglang_plugin import register

    register()
    if get_spec("PLAINTRAP") is None:       # the trap: what a plugin gets without the fix
        SpeculativeAlgorithm.register("PLAINTRAP", spec_class=CustomSpecAlgo)(lambda server_args: object)
    return {"DDTREE": SpeculativeAlgorithm.from_string("DDTREE"), "DFLASH": SpeculativeAlgorithm.DFLASH,
            "PLAINTRAP": SpeculativeAlgorithm.from_string("PLAINTRAP")}


def run_py(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=180)


def test_sglang_loader_runs_the_entry_point_and_respects_the_filter() -> None:
    code = """
import json
from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group
import os
os.environ["SGLANG_PLUGINS"] = "someone_else"
skipped = sorted(load_plugins_by_group(GENERAL_PLUGINS_GROUP))
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
try:
    SpeculativeAlgorithm.from_string("DDTREE"); before = "resolved"
except ValueError as e:
    before = str(e)
os.environ["SGLANG_PLUGINS"] = "ddtree"
from sglang.srt.plugins import load_plugins
load_plugins(); load_plugins()
a = SpeculativeAlgorithm.from_string("ddtree")
print(json.dumps({"skipped": skipped, "before": before, "cls": type(a).__name__, "family": a.is_dflash_family(),
                  "dflash": a.is_dflash(), "torch_cuda": __import__("torch").cuda.is_available()}))
"""
    proc = run_py(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "ddtree" not in doc["skipped"]
    assert "Unknown speculative algorithm" in doc["before"]        # filtered out: DDTREE does not exist
    assert doc["cls"] == "DDTreeSpecAlgo" and doc["family"] and doc["dflash"]
    assert doc["torch_cuda"] is False


def test_check_is_what_the_lab_standin_calls() -> None:
    proc = run_py("import json; from ddtree_ops.engine.sglang_plugin import check; print(json.dumps(check()))")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["is_dflash_family"] is True and doc["sglang"] == "0.5.23" and "error" not in doc


def test_register_is_idempotent_and_answers_as_dflash(algos: dict[str, Any]) -> None:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from ddtree_ops.engine.sglang_plugin import register

    register()
    register()
    ddtree, dflash, plain = algos["DDTREE"], algos["DFLASH"], algos["PLAINTRAP"]
    predicates = [n for n in vars(SpeculativeAlgorithm)
                  if n.startswith(("is_", "supports_", "has_", "need_", "carries_"))]
    assert "is_dflash_family" in predicates and len(predicates) > 15
    for name in predicates:
        assert getattr(ddtree, name)() == getattr(dflash, name)(), name
    assert ddtree.is_dflash_family() and not plain.is_dflash_family() and not plain.is_dflash()
    # methods 0.5.23's scheduler calls on every algorithm: present on DDTREE, missing on the plain one
    for name in ("create_future_map", "carries_draft_hidden_states", "need_topk"):
        assert callable(getattr(ddtree, name))
        assert not hasattr(plain, name), f"sglang now defines {name} on CustomSpecAlgo: revisit the plugin"
    assert ddtree.supports_overlap and ddtree.validate_server_args is not None


class _Anything:
    """Stands for `self`, `kvc`, `model_runner`...: any attribute is another _Anything, except the
    algorithm and the draft-worker flag, which are what the conditions test."""

    def __init__(self, algo: Any) -> None:
        self._algo = algo

    def __getattr__(self, name: str) -> Any:
        if name == "spec_algorithm":
            return self._algo
        if name == "is_draft_worker":
            return False
        return _Anything(self._algo)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _Anything(self._algo)


def _decisions(root: ast.AST) -> list[ast.expr]:
    """Expressions that decide something: branch tests, returned and passed values, assignments."""
    found: list[ast.expr] = []
    for n in ast.walk(root):
        if isinstance(n, (ast.If, ast.IfExp, ast.While)):
            found.append(n.test)
        elif isinstance(n, (ast.Return, ast.Assign)) and n.value is not None:
            found.append(n.value)
        elif isinstance(n, ast.keyword):
            found.append(n.value)
    return [e for e in found if "is_dflash" in ast.unparse(e) and len(ast.unparse(e)) < 400]


def gate_conditions(relpath: str, function: str) -> list[ast.expr]:
    tree = ast.parse((SRT / relpath).read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == function)
    return _decisions(fn)


def evaluate(test: ast.expr, algo: Any) -> bool:
    names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
    # local flags such as `is_eagle` are other algorithms' answers: False here; anything else
    # (objects, enable_* switches) is a truthy stand-in so the algorithm's part decides
    scope: dict[str, Any] = {name: False if name.startswith("is_") else _Anything(algo) for name in names}
    scope.update(spec_algorithm=algo, is_draft_worker=False)
    return bool(eval(compile(ast.Expression(test), "<sglang-gate>", "eval"), {}, scope))


# (file under sglang/srt, function): the conditions that set up DFlash-family serving
GATES = [
    ("model_executor/model_runner_components/spec_aux_hidden_state.py", "_resolve_dflash_aux_hidden_state"),
    ("model_executor/model_runner_components/misc_utils.py", "resolve_aux_hidden_states_width"),
    ("model_executor/model_runner_components/kv_pool_runtime.py", None),
    ("model_executor/pool_configurator.py", None),
    ("model_executor/runner/decode_cuda_graph_runner.py", None),
    ("model_executor/runner/prefill_cuda_graph_runner.py", None),
    ("managers/scheduler.py", None),
    ("mem_cache/kv_cache_configurator.py", None),
    ("speculative/base_spec_worker.py", None),
]


def all_gate_conditions(relpath: str) -> list[ast.expr]:
    return _decisions(ast.parse((SRT / relpath).read_text()))


@pytest.mark.parametrize("relpath,function", GATES)
def test_sglang_gates_are_taken_for_ddtree_not_for_a_plain_plugin(algos: dict[str, Any], relpath: str,
                                                                    function: str | None) -> None:
    conds = gate_conditions(relpath, function) if function else all_gate_conditions(relpath)
    assert conds, f"no is_dflash condition left in {relpath}: sglang changed, revisit the plugin"
    differs = evaluated = 0
    for cond in conds:
        try:
            want = evaluate(cond, algos["DFLASH"])
        except Exception:         # needs real objects (tensors, configs) beyond the algorithm: not a gate
            continue
        evaluated += 1
        assert evaluate(cond, algos["DDTREE"]) == want, ast.unparse(cond)
        differs += evaluate(cond, algos["PLAINTRAP"]) != want
    assert evaluated, f"no is_dflash decision in {relpath} could be evaluated"
    assert differs, f"a plain CustomSpecAlgo takes every branch of {relpath} like DFLASH: no trap here?"


def test_hidden_capture_condition_specifically(algos: dict[str, Any]) -> None:
    (cond, *_) = gate_conditions("model_executor/model_runner_components/spec_aux_hidden_state.py",
                                 "_resolve_dflash_aux_hidden_state")
    assert ast.unparse(cond) == "spec_algorithm.is_dflash_family() and (not is_draft_worker)"
    assert evaluate(cond, algos["DDTREE"]) is True          # target_layer_ids get configured
    assert evaluate(cond, algos["PLAINTRAP"]) is False      # the story: no capture, dead at serving time


def test_min_free_slots_real_function(algos: dict[str, Any]) -> None:
    """SGLang's own threshold, fed each algorithm's family answer as the scheduler feeds it. With 48
    running requests and no user value a DFlash-family algorithm delays admissions until
    min(4, max(2, (48 + 5) // 6)) = 4 slots are free (the formula in min_free_slots_delayer.py, worked
    by hand); a plain CustomSpecAlgo gets no delay at all (None), the trap's quieter face."""
    from sglang.srt.managers.min_free_slots_delayer import resolve_min_free_slots

    got = {name: resolve_min_free_slots(None, 48, is_dflash_family=algo.is_dflash_family())
           for name, algo in algos.items()}
    assert got == {"DDTREE": 4, "DFLASH": 4, "PLAINTRAP": None}
    # below 8 running requests DFlash's delay is off for every algorithm
    assert resolve_min_free_slots(None, 4, is_dflash_family=algos["DDTREE"].is_dflash_family()) is None


def server_args(*extra: str) -> Any:
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args(["--model-path", TARGET, "--device", "cuda", "--speculative-algorithm", "DDTREE", *extra])


def validate(sa: Any) -> None:
    from sglang.srt.arg_groups.overrides import record_foreign_defaults
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algo = SpeculativeAlgorithm.from_string("DDTREE")
    record_foreign_defaults(sa, "handle_speculative_decoding.custom_validate", algo.validate_server_args)


GOOD = ("--speculative-draft-model-path", DRAFT, "--speculative-num-draft-tokens", "16")


def test_validator_accepts_the_profile_flags(algos: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDTREE_BUDGET", "64")
    monkeypatch.setenv("DDTREE_SHADOW_SHARE", "0.25")
    monkeypatch.setenv("DDTREE_SHADOW_REPORT_EVERY", "100")
    validate(server_args(*GOOD))
    validate(server_args("--speculative-draft-model-path", DRAFT))           # block size from the draft config


@pytest.mark.parametrize("extra,env,message", [
    ((), {}, "--speculative-draft-model-path is required"),
    (GOOD + ("--speculative-dflash-block-size", "8"), {}, "differ"),
    (GOOD + ("--speculative-use-rejection-sampling",), {}, "rejection-sampling is refused"),
    (("--speculative-draft-model-path", DRAFT, "--speculative-num-draft-tokens", "1"), {}, "no draft position"),
    (GOOD, {"DDTREE_BUDGET": "8"}, "below the draft horizon 15"),
    (GOOD, {"DDTREE_BUDGET": "lots"}, "not an integer"),
    (GOOD, {"DDTREE_SHADOW_SHARE": "1.5"}, "out of range"),
    (GOOD, {"DDTREE_MODE": "tree"}, "DDTREE_MODE=tree: no tree verify backend for sglang 0.5.23"),
    (GOOD, {"DDTREE_MODE": "linear"}, "DDTREE_MODE='linear' is not a mode: one of shadow, tree"),
    (GOOD, {"DDTREE_MODE": "tree", "DDTREE_CHAIN_SHARE": "0.9"}, "DDTREE_CHAIN_SHARE=0.9 is out of range [0, 0.5]"),
    (GOOD, {"DDTREE_COST_PROBE_SHARE": "-1"}, "DDTREE_COST_PROBE_SHARE=-1 is out of range"),
    (GOOD + ("--speculative-eagle-topk", "4"), {}, "leave --speculative-eagle-topk unset"),
    (GOOD + ("--pp-size", "2"), {}, "pipeline parallelism"),
    (GOOD + ("--enable-lora",), {}, "--enable-lora is refused"),
    (GOOD + ("--disaggregation-mode", "decode"), {}, "--disaggregation-mode is refused"),
])
def test_validator_refuses_with_a_clear_message(algos: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                                                extra: tuple[str, ...], env: dict[str, str], message: str) -> None:
    for key in list(os.environ):
        if key.startswith("DDTREE_"):
            monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match="DDTREE launch refused") as err:
        validate(server_args(*extra))
    assert message in str(err.value)


def test_dflash_server_args_hook_runs_for_ddtree(algos: dict[str, Any]) -> None:
    """SGLang hands a plugin's handle_server_args its write recorder; DFLASH's own hook must still
    declare block size, num_steps/topk = 1, the draft attention backend and max running requests."""
    from sglang.srt.arg_groups.overrides import record_foreign_defaults, resolving_view

    sa = server_args(*GOOD)
    record_foreign_defaults(sa, "handle_speculative_decoding.custom_algo", algos["DDTREE"].handle_server_args)
    cfg = resolving_view(sa)
    assert (cfg.speculative_num_draft_tokens, cfg.speculative_num_steps, cfg.speculative_eagle_topk) == (16, 1, 1)
    assert cfg.max_running_requests == 48
    assert cfg.speculative_draft_attention_backend is not None
    # the plain plugin algorithm's hook does nothing: none of this would be set up
    sa2 = server_args(*GOOD)
    record_foreign_defaults(sa2, "x", algos["PLAINTRAP"].handle_server_args)
    assert resolving_view(sa2).speculative_num_steps is None


def test_launch_flags_parse_with_sglangs_real_parser() -> None:
    sa = server_args(*GOOD)
    assert sa.speculative_algorithm == "DDTREE" and sa.speculative_draft_model_path == DRAFT


def test_worker_factory_is_lazy() -> None:
    """register() must not import SGLang's GPU worker: only the factory does, at server start."""
    proc = run_py("import sys; from ddtree_ops.engine.sglang_plugin import register; register(); "
                  "print('dflash_worker_v2' in ' '.join(sys.modules))")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "False"


def test_registration_is_announced_on_stderr_before_logging_exists() -> None:
    """SGLang loads plugins before it configures logging: the line must not depend on it."""
    proc = run_py("from sglang.srt.plugins import load_plugins; load_plugins()", SGLANG_PLUGINS="ddtree")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "DDTREE plugin: registered DDTREE as a DFlash-family algorithm (sglang 0.5.23, shadow-linear)" in proc.stderr


@pytest.mark.parametrize("version,refused", [("0.5.17", False), ("0.5.23.post1", False), ("0.5.24", True),
                                             ("0.5.23rc1", True), ("0.4.10", True)])
def test_unsupported_sglang_is_refused_with_the_releases_that_work(algos: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                                                                   version: str, refused: bool) -> None:
    from ddtree_ops.engine import sglang_plugin

    for key in ("DDTREE_BUDGET", "DDTREE_SHADOW_SHARE", "DDTREE_MODE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr("sglang.__version__", version)
    sa = server_args(*GOOD)
    if refused:
        with pytest.raises(ValueError, match=f"sglang {version} is not supported \\(supported: 0.5.17, 0.5.23\\)"):
            validate(sa)
        assert "not supported" in sglang_plugin.check()["error"]
    else:
        validate(sa)
        assert "error" not in sglang_plugin.check()
