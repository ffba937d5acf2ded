"""Every command's `--json` is one document on stdout carrying `command`, `schema_version` and the
`exit_code` the process exits with, whatever happened (an error included), so a script never has to
guess from the shape. The commands run through the CLI with the fake host of fakehost.py injected.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from fakehost import FakeHost, factory

from ddtree_ops.cli.app import main
from ddtree_ops.profile import load_profile

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def profiles(tmp_path: Path) -> Path:
    d = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", d)
    with open(d / "ct129.yaml", "a") as fh:
        fh.write("\ngate:\n  stay_healthy_s: 0\n")
    return d


@pytest.fixture(autouse=True)
def quiet_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("DDTREE_OPS_INVENTORY", "DDTREE_OPS_PROFILES", "DDTREE_OPS_SSH_CONFIG"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str], profiles: Path) -> Any:
    host = FakeHost.serving(load_profile("ct129", directory=profiles), "nextn")

    def go(*args: str) -> tuple[int, dict[str, Any]]:
        with pytest.raises(SystemExit) as done:
            main([*args, "--json", "--profiles", str(profiles)], obj=factory({"ct129": host}))
        out = capsys.readouterr().out
        return int(done.value.code), json.loads(out)

    return go


@pytest.mark.parametrize("args, command", [
    (("render", "ct129"), "render"),
    (("profile", "show", "ct129"), "profile show"),
    (("profile", "show", "a6000"), "profile show"),
    (("profile", "validate"), "profile validate"),
    (("preflight", "ct129"), "preflight"),
    (("deploy", "ct129", "--dry-run"), "deploy"),
    (("deploy", "ct129", "--mode", "nextn", "--yes"), "deploy"),
    (("deploy", "ct129"), "deploy"),  # refused off a terminal: exit 3
    (("rollback", "ct129"), "rollback"),  # nothing has passed yet: refused, exit 3
    (("history", "ct129"), "history"),
    (("lock", "status", "ct129"), "lock status"),
    (("deploy", "nowhere"), "deploy"),  # an unknown host: the error's own document, exit 64
])
def test_every_json_document_names_its_command_schema_and_exit_code(run: Any, args: tuple[str, ...],
                                                                   command: str) -> None:
    rc, doc = run(*args)
    assert doc["schema_version"] == 1
    assert doc["command"] == command
    assert doc["exit_code"] == rc


def test_a_deploy_dry_run_document_holds_the_whole_plan(run: Any) -> None:
    rc, doc = run("deploy", "ct129", "--dry-run")
    assert (rc, doc["result"]) == (0, "dry-run")
    plan = doc["plan"]
    # the profile's mode (ct129 runs ddtree-shadow), the release it would install, where a failure goes
    assert (plan["mode"], plan["mode_source"], plan["changes"], plan["restart"]) == ("ddtree-shadow", "profile",
                                                                                     True, True)
    assert plan["release_id"] == doc["release_id"] and plan["release_id"].startswith("ddtree-shadow-")
    assert plan["summary"].startswith("ct129: would change: deploy ddtree-shadow-") and "nextn -> ddtree-shadow" \
        not in plan["summary"]  # nothing recorded yet: the host's mode is unknown, not guessed
    assert plan["adopt"].startswith("baseline-") and plan["rollback_target"]["release_id"] == plan["adopt"]
    assert plan["plugin"] and plan["gate"] == {"deadline_s": 900.0, "stay_healthy_s": 0.0}
    assert "- --speculative-algorithm NEXTN" in plan["launch_diff"]
    assert "+ --speculative-algorithm DDTREE" in plan["launch_diff"]
    assert plan["diff"].startswith("--- /etc/systemd/system/sglang.service (installed)")
