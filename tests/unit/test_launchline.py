"""launchline without SGLang: systemd's words read back what render writes, a launch line's
interpreter and launcher, its environment and cards as profile keys, refusals that name the flag,
and two lines compared flag by flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtree_ops.launchline import (compare, environment, exec_start, is_launch_line, parse_env_file, split_launch,
                                   split_words, to_profile)
from ddtree_ops.profile import MODES, load_profile
from ddtree_ops.render import env_quote, render, systemd_command

REPO = Path(__file__).resolve().parents[2]
AWKWARD = ["plain", "with space", 'a "quoted" word', "it's", "100%", "$HOME", "${X}", "back\\slash", ";", "", "é"]


@pytest.mark.parametrize("host", ["ct129", "ct200"])
@pytest.mark.parametrize("mode", MODES)
def test_exec_start_reads_back_every_rendered_unit(host: str, mode: str) -> None:
    r = render(load_profile(host, directory=REPO / "profiles"), mode, environ={})
    assert exec_start(r.unit_text) == list(r.argv)


def test_systemd_words_read_back_what_render_quotes() -> None:
    assert split_words(systemd_command(AWKWARD)) == AWKWARD


@pytest.mark.parametrize("value", ["1", "", "a b", "it's", 'say "hi"', "$PATH", "back\\slash", "a`b`", "x=y"])
def test_env_files_read_back_what_render_writes(value: str) -> None:
    assert parse_env_file(env_quote("K", value)) == {"K": value}


def test_exec_start_takes_the_last_assignment_and_expands_variables() -> None:
    unit = ("[Unit]\nDescription=x\n[Service]\nExecStart=/bin/false\n"
            "# /etc/systemd/system/x.service.d/override.conf\n[Service]\nExecStart=\n"
            "ExecStart=-/opt/v/bin/python -m sglang.launch_server \\\n  --model-path ${MODEL} $EXTRA --port=1\n")
    assert exec_start(unit, {"MODEL": "/m/Q", "EXTRA": "--enable-metrics --page-size 16"}) == [
        "/opt/v/bin/python", "-m", "sglang.launch_server", "--model-path", "/m/Q", "--enable-metrics",
        "--page-size", "16", "--port=1"]
    assert exec_start("[Service]\nType=exec\n") is None


def test_environment_files_win_over_environment_lines() -> None:
    env = environment(['A=1 "B=two words" C=3'], ["# comment\nA=file\n; also\nexport D='x y'\n"])
    assert env == {"A": "file", "B": "two words", "C": "3", "D": "x y"}


@pytest.mark.parametrize("argv, python, launcher", [
    (["/opt/v/bin/python3", "-u", "-m", "sglang.launch_server", "--port", "1"], "/opt/v/bin/python3",
     "python -m sglang.launch_server"),
    (["/opt/v/bin/sglang", "serve", "--port", "1"], "/opt/v/bin/python", "sglang serve"),
    (["/usr/bin/env", "FOO=1", "python3", "-m", "sglang.launch_server", "--port", "1"], None,
     "python -m sglang.launch_server"),
])
def test_the_interpreter_and_launcher(argv: list[str], python: str | None, launcher: str) -> None:
    launch = split_launch(argv)
    assert (launch.python, launch.launcher, launch.problems) == (python, launcher, ())
    assert to_profile(launch).values[("service", "port")] == 1
    assert is_launch_line(argv)


def test_a_line_that_does_not_start_sglang_is_no_launch_line() -> None:
    assert not is_launch_line(["/usr/bin/vllm", "serve", "m"])
    assert to_profile(split_launch(["/usr/bin/vllm", "serve", "m"])).problems


def test_environment_and_cards_map_to_keys_and_secrets_by_reference() -> None:
    argv = ["/p/python", "-m", "sglang.launch_server", "--speculative-algorithm", "DDTREE",
            "--speculative-draft-model-path", "/m/D", "--tp-size", "2"]
    env = {"CUDA_VISIBLE_DEVICES": "2,3", "HF_TOKEN": "hf_secret_value", "PYTHONUNBUFFERED": "1",
           "SGLANG_PLUGINS": "ddtree", "DDTREE_BUDGET": "32", "DDTREE_SHADOW_SHARE": "0.5", "NCCL_DEBUG": "WARN"}
    m = to_profile(split_launch(argv), env)
    assert m.mode == "ddtree-shadow" and not m.problems
    assert m.values[("gpus",)] == [2, 3]
    assert m.values[("modes", "ddtree-shadow", "budget")] == 32
    assert m.values[("modes", "ddtree-shadow", "shadow", "share")] == 0.5
    assert m.env == {"NCCL_DEBUG": "WARN"}
    assert m.secrets == {"HF_TOKEN": "env:HF_TOKEN"}
    assert "hf_secret_value" not in repr(m)


def test_base_gpu_id_becomes_the_card() -> None:
    m = to_profile(split_launch(["/p/python", "-m", "sglang.launch_server", "--base-gpu-id", "1"]),
                   {"CUDA_VISIBLE_DEVICES": "0,3"})
    assert m.values[("gpus",)] == [3]
    assert any("--base-gpu-id" in n.what for n in m.notes)


@pytest.mark.parametrize("words, named", [
    (["--nnodes", "2"], "--nnodes 2"),
    (["--attention-backend", "aiter"], "--attention-backend aiter"),
    (["--port", "http"], "--port http"),
])
def test_what_the_profile_cannot_say_is_refused_naming_the_flag(words: list[str], named: str) -> None:
    m = to_profile(split_launch(["/p/python", "-m", "sglang.launch_server", *words]))
    assert any(named in p for p in m.problems), m.problems


def test_cards_by_uuid_are_refused() -> None:
    m = to_profile(split_launch(["/p/python", "-m", "sglang.launch_server"]), {"CUDA_VISIBLE_DEVICES": "GPU-1a2b"})
    assert any("CUDA_VISIBLE_DEVICES=GPU-1a2b" in p for p in m.problems)


def test_an_algorithm_no_mode_runs_is_noted_not_lost() -> None:
    m = to_profile(split_launch(["/p/python", "-m", "sglang.launch_server", "--speculative-algorithm", "EAGLE3",
                                 "--speculative-num-steps", "5"]))
    assert m.mode is None and not m.problems
    assert {n.what for n in m.notes} == {"--speculative-algorithm EAGLE3", "--speculative-num-steps 5"}


def test_compare_names_each_flag_that_differs() -> None:
    a = ["/p/python", "-m", "sglang.launch_server", "--port", "1", "--page-size", "16", "--foo"]
    b = ["/p/python", "-m", "sglang.launch_server", "--port=2", "--foo", "--enable-metrics"]
    assert compare(a, b) == ["~ --port 1  ->  --port 2", "- --page-size 16", "+ --enable-metrics"]
    assert compare(a, list(a)) == []
    assert compare(a, ["/q/python", *a[1:]])[0].startswith("~ /p/python")
