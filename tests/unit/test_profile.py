"""Profiles: typos and bad values are caught with file, line and key path, never a traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ddtree_ops.cli.app import main
from ddtree_ops.errors import ProfileError
from ddtree_ops.profile import MODES, available_hosts, load_profile, parse_override

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def profiles(tmp_path: Path) -> Path:
    d = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", d)
    return d


def _edit(path: Path, old: str, new: str) -> int:
    text = path.read_text()
    assert old in text, old
    line = text[: text.index(old)].count("\n") + 1
    path.write_text(text.replace(old, new, 1))
    return line


def test_shipped_profiles_load_with_every_mode() -> None:
    assert available_hosts(REPO / "profiles") == ["ct129", "ct200"]
    for host in ("ct129", "ct200"):
        p = load_profile(host, directory=REPO / "profiles")
        assert p.configured_modes() == list(MODES)
        assert p.known_good_mode == "nextn"
    assert load_profile("ct129", directory=REPO / "profiles").gpu.arch == "sm_86"
    assert load_profile("ct200", directory=REPO / "profiles").gpu.arch == "sm_120"


def test_out_of_range_value_names_file_line_and_key(profiles: Path) -> None:
    line = _edit(profiles / "ct129.yaml", "mem_fraction_static: 0.81", "mem_fraction_static: 1.4")
    with pytest.raises(ProfileError) as exc:
        load_profile("ct129", directory=profiles)
    (msg,) = exc.value.problems
    assert msg.endswith(f"ct129.yaml:{line} memory.mem_fraction_static: 1.4 is not in (0, 1)")


def test_unknown_key_suggests_the_right_one(profiles: Path) -> None:
    line = _edit(profiles / "ct200.yaml", "  context_length:", "  context_lenght:")
    with pytest.raises(ProfileError) as exc:
        load_profile("ct200", directory=profiles)
    assert any(f"ct200.yaml:{line} memory.context_lenght: unknown key (did you mean 'context_length'?)" in m
               for m in exc.value.problems)


def test_wrong_type_and_missing_field(profiles: Path) -> None:
    _edit(profiles / "ct129.yaml", "  model_path: /models/Qwen3-8B\n", "")
    line = _edit(profiles / "ct129.yaml", "max_running_requests: 4", 'max_running_requests: "four"')
    with pytest.raises(ProfileError) as exc:
        load_profile("ct129", directory=profiles)
    problems = "\n".join(exc.value.problems)
    assert f"ct129.yaml:{line} memory.max_running_requests: expected int, got str 'four'" in problems
    assert "service.model_path: required but missing" in problems


def test_defaults_value_errors_point_into_defaults(profiles: Path) -> None:
    line = _edit(profiles / "defaults.yaml", "poll_interval_s: 0.25", "poll_interval_s: -1")
    with pytest.raises(ProfileError, match=rf"defaults.yaml:{line} gate.poll_interval_s: -1 is not in \(0, 60\]"):
        load_profile("ct129", directory=profiles)


def test_arch_rules_from_the_facts() -> None:
    with pytest.raises(ProfileError, match="memory.attention_backend: 'fa3' needs sm_80..sm_90; this host is sm_120"):
        load_profile("ct200", overrides=["memory.attention_backend=fa3"], directory=REPO / "profiles")
    with pytest.raises(ProfileError, match="modes.ddtree-shadow.draft_attention_backend: 'trtllm_mha'"):
        load_profile("ct200", overrides=["modes.ddtree-shadow.draft_attention_backend=trtllm_mha"],
                     directory=REPO / "profiles")
    with pytest.raises(ProfileError, match="memory.quantization: 'w8a8_fp8' needs sm_89"):
        load_profile("ct129", overrides=["memory.quantization=w8a8_fp8"], directory=REPO / "profiles")
    # FP8 weight-only (Marlin) is fine on the A6000; FA3 is allowed on sm_86 for non-MLA models
    load_profile("ct129", overrides=["memory.quantization=fp8", "memory.attention_backend=fa3"],
                 directory=REPO / "profiles")


def test_set_overrides_parse_yaml_scalars_and_are_blamed() -> None:
    assert parse_override("memory.cuda_graph=false") == (("memory", "cuda_graph"), False)
    assert parse_override("memory.context_length=131072") == (("memory", "context_length"), 131072)
    p = load_profile("ct129", overrides=["memory.context_length=131072"], directory=REPO / "profiles")
    assert p.memory.context_length == 131072
    with pytest.raises(ProfileError, match=r"--set gate.stay_healthy_s=5000 gate.stay_healthy_s: must be shorter"):
        load_profile("ct129", overrides=["gate.stay_healthy_s=5000"], directory=REPO / "profiles")
    with pytest.raises(ProfileError, match="expected key.path=value"):
        load_profile("ct129", overrides=["memory.context_length"], directory=REPO / "profiles")


def test_yaml_syntax_and_duplicate_keys(profiles: Path) -> None:
    line = _edit(profiles / "ct129.yaml", "  arch: sm_86", "  arch: sm_86\n  arch: sm_80")
    with pytest.raises(ProfileError, match=rf"ct129.yaml:{line + 1} gpu.arch: duplicate key"):
        load_profile("ct129", directory=profiles)
    (profiles / "ct200.yaml").write_text("gpu: [unclosed\n")
    with pytest.raises(ProfileError, match=r"ct200.yaml:\d+ YAML syntax error"):
        load_profile("ct200", directory=profiles)


def test_cli_reports_problems_and_exits_64_without_traceback(profiles: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _edit(profiles / "ct129.yaml", "mem_fraction_static: 0.81", "mem_fraction_static: 1.4")
    with pytest.raises(SystemExit) as exc:
        main(["profile", "validate", "--profiles", str(profiles)])
    assert exc.value.code == 64
    err = capsys.readouterr().err
    assert "memory.mem_fraction_static: 1.4 is not in (0, 1)" in err
    assert "ok    ct200" in err
    assert "Traceback" not in err


def test_profile_show_redacts_secrets(tmp_path: Path, profiles: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (profiles / "ct129.yaml").write_text((profiles / "ct129.yaml").read_text().replace(
        "  env:\n", "  secrets:\n    HF_TOKEN: env:TEST_HF_TOKEN\n    API_KEY: hunter2-literal\n  env:\n"))
    monkeypatch.setenv("TEST_HF_TOKEN", "hf_supersecret")
    with pytest.raises(SystemExit) as exc:
        main(["profile", "show", "ct129", "--profiles", str(profiles)])
    assert exc.value.code == 0
    out = capsys.readouterr()
    assert "hf_supersecret" not in out.out + out.err
    assert "hunter2" not in out.out + out.err
    assert "HF_TOKEN: <env reference, redacted>" in out.out


def test_profile_show_and_the_unit_header_name_their_two_hashes_alike(
        profiles: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One name per hash: `profile_sha256` is the whole resolved profile's, `inputs_sha256` the keys a
    mode's unit is rendered from, printed by `profile show` and written in the unit header alike."""
    import json

    from ddtree_ops.render import render

    with pytest.raises(SystemExit):
        main(["profile", "show", "ct129", "--profiles", str(profiles), "--json"])
    doc = json.loads(capsys.readouterr().out)["profile"]
    p = load_profile("ct129", directory=profiles)
    assert doc["profile_sha256"] == p.sha256()
    for mode in p.configured_modes():
        header = render(p, mode).unit_text.splitlines()[0]
        assert f" inputs_sha256={doc['inputs_sha256'][mode]} " in header
        assert "profile_sha256" not in header
    # a gate setting is part of the profile, not of any unit
    with pytest.raises(SystemExit):
        main(["profile", "show", "ct129", "--profiles", str(profiles), "--json", "--set", "gate.stay_healthy_s=5"])
    changed = json.loads(capsys.readouterr().out)["profile"]
    assert changed["profile_sha256"] != doc["profile_sha256"] and changed["inputs_sha256"] == doc["inputs_sha256"]
