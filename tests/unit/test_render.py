"""Rendering: golden units, systemd quoting, systemd-analyze verify, SGLang's own parser."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ddtree_ops.errors import ProfileError
from ddtree_ops.profile import MODES, load_profile
from ddtree_ops.render import env_quote, render, systemd_command, systemd_quote

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
CASES = [(h, m) for h in ("ct129", "ct200") for m in MODES]


def _profile(host: str, *overrides: str):
    return load_profile(host, overrides=list(overrides), directory=REPO / "profiles")


@pytest.mark.parametrize("host,mode", CASES)
def test_golden_units(host: str, mode: str, request: pytest.FixtureRequest) -> None:
    r = render(_profile(host), mode, environ={})
    files = {f"{host}-{mode}.service": r.unit_text, f"{host}-{mode}.env": r.env_redacted}
    for name, text in files.items():
        path = GOLDEN / name
        if request.config.getoption("--update-golden"):
            path.write_text(text)
        assert path.exists(), f"no golden file {name}: run `make golden`"
        assert text == path.read_text(), f"{name} changed; review the diff, then `make golden`"


def test_unit_has_the_operational_settings() -> None:
    r = render(_profile("ct200"), "ddtree-shadow", environ={})
    unit = r.unit_text
    unit_section = unit.split("[Service]")[0]
    assert "StartLimitIntervalSec=600" in unit_section and "StartLimitBurst=3" in unit_section
    for line in ("Restart=on-failure", "RestartSec=30", "TimeoutStartSec=1800", "KillMode=control-group",
                 "SyslogIdentifier=sglang", "Type=exec", f"EnvironmentFile={r.env_path}"):
        assert line in unit.splitlines()
    assert "PrivateDevices" not in unit.replace("No PrivateDevices=", "")
    assert unit.startswith(f"# ddtree-ops release={r.release_id} inputs_sha256=")
    assert "SGLANG_PLUGINS=ddtree" in r.env_text and "DDTREE_BUDGET=64" in r.env_text
    assert r.argv[r.argv.index("--speculative-algorithm") + 1] == "DDTREE"


def test_release_id_is_stable_and_tracks_content() -> None:
    a = render(_profile("ct129"), "dflash", environ={})
    b = render(_profile("ct129"), "dflash", environ={})
    c = render(_profile("ct129", "memory.context_length=16384"), "dflash", environ={})
    d = render(_profile("ct129", "smoke.max_new_tokens=8"), "dflash", environ={})
    assert a.release_id == b.release_id and a.unit_text == b.unit_text
    assert c.release_id != a.release_id
    assert d.unit_text == a.unit_text  # gate/smoke settings do not restart the service


def test_systemd_quoting_rules() -> None:
    assert systemd_quote("/models/Qwen3-8B") == "/models/Qwen3-8B"
    assert systemd_quote("/models/Qwen 3 (8B)/%v") == '"/models/Qwen 3 (8B)/%%v"'
    assert systemd_quote('say "hi" $HOME \\n') == '"say \\"hi\\" $$HOME \\\\n"'
    assert systemd_quote("") == '""'
    assert systemd_quote(";") == "\\;"
    with pytest.raises(ProfileError, match="control character"):
        systemd_quote("two\nlines")
    assert systemd_command(["/bin/echo", "a b", "100%"]) == '/bin/echo "a b" "100%%"'


def test_env_file_quoting() -> None:
    assert env_quote("A", "plain-1.0") == "A=plain-1.0"
    assert env_quote("A", "has space $X") == "A='has space $X'"
    assert env_quote("A", "it's \"q\" $X") == 'A="it\'s \\"q\\" \\$X"'
    with pytest.raises(ProfileError, match="service.env.A: values with line breaks"):
        env_quote("A", "x\ny")


def test_secrets_reach_only_the_env_file(monkeypatch: pytest.MonkeyPatch) -> None:
    p = _profile("ct129", "service.secrets.HF_TOKEN=env:HF_TOKEN_FOR_TEST")
    with pytest.raises(ProfileError, match="service.secrets.HF_TOKEN: environment variable HF_TOKEN_FOR_TEST"):
        render(p, "nextn", environ={})
    r = render(p, "nextn", environ={"HF_TOKEN_FOR_TEST": "hf_abc123secret"})
    assert "HF_TOKEN=hf_abc123secret" in r.env_text
    assert "hf_abc123secret" not in r.env_redacted + r.unit_text + repr(r.manifest())
    assert "HF_TOKEN=<redacted sha256:" in r.env_redacted


SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze missing: apt-get install systemd")
@pytest.mark.parametrize("host,mode", CASES)
def test_units_pass_systemd_analyze_verify(host: str, mode: str, tmp_path: Path) -> None:
    # the interpreter lives on the GPU host; preflight verifies it there. Here it must exist locally.
    p = _profile(host, "service.python=/bin/true")
    r = render(p, mode, environ={})
    path = tmp_path / r.unit_name  # systemd derives the unit type from the real file name
    path.write_text(r.unit_text)
    res = subprocess.run([SYSTEMD_ANALYZE, "verify", str(path)], capture_output=True, text=True, timeout=60)
    about_us = [ln for ln in (res.stdout + res.stderr).splitlines() if r.unit_name in ln]
    assert res.returncode == 0 and not about_us, about_us


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze missing")
def test_awkward_paths_verify_too(tmp_path: Path) -> None:
    p = _profile("ct129", "service.python=/bin/true", "service.model_path=/models/Qwen 3 (8B)/%v",
                 "service.env.WEIRD=it's $HOME \"quoted\"")
    r = render(p, "dflash", environ={})
    path = tmp_path / r.unit_name
    path.write_text(r.unit_text)
    res = subprocess.run([SYSTEMD_ANALYZE, "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and r.unit_name not in res.stdout + res.stderr
    assert '"/models/Qwen 3 (8B)/%%v"' in r.unit_text
