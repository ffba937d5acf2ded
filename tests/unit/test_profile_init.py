"""`ddtree-ops profile init HOST` through the CLI an operator types, against a fake host (the
contract tests' FakeHost, answering the facts script from its own state: tests/unit/initfake.py).

What a user sees: the profile written (every value with its source), render of it against the
running unit, preflight on it, and the first deploy that adopts the running unit; refusals that
write nothing and name what is wrong; --print, --force, --from.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakehost import FIXTURES, factory, records
from initfake import InitHost, gpu_probe

from ddtree_ops.cli.app import main
from ddtree_ops.config.inventory import Inventory
from ddtree_ops.launchline import exec_start
from ddtree_ops.profile import load_profile
from ddtree_ops.render import render

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("detected", "from the running unit", "given", "derived", "default", "from ")


@pytest.fixture(autouse=True)
def quiet_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("DDTREE_OPS_INVENTORY", "DDTREE_OPS_PROFILES", "DDTREE_OPS_SSH_CONFIG", "HF_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_COLOR", "1")


@pytest.fixture
def profiles(tmp_path: Path) -> Path:
    """A profiles directory with the shipped defaults and groups, and no host files."""
    d = tmp_path / "profiles"
    d.mkdir()
    shutil.copy(REPO / "profiles" / "defaults.yaml", d)
    shutil.copytree(REPO / "profiles" / "groups", d / "groups")
    return d


def with_models(host: InitHost, *names: str) -> InitHost:
    for model in names or ("Qwen3-8B", "Qwen3-8B-NextN", "Qwen3-8B-DFlash-b16"):
        for f in (FIXTURES / model).iterdir():
            host.files[f"/models/{model}/{f.name}"] = f.read_bytes()
    return host


def seeded(name: str = "ct129", mode: str = "nextn", **kw: Any) -> InitHost:
    """A host that runs a hand-made unit: ct129's, as the lab seeds it."""
    h = InitHost.serving(load_profile("ct129", directory=REPO / "profiles"), mode, **kw)
    h.name = name
    return h


def fresh(name: str = "ct300", **kw: Any) -> InitHost:
    return with_models(InitHost(name, **kw))


def cli(capsys: pytest.CaptureFixture[str], host: InitHost, *args: str) -> tuple[int, str, str]:
    try:
        main(list(args), obj=factory({host.name: host}))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def init(capsys: pytest.CaptureFixture[str], host: InitHost, profiles: Path, *extra: str) -> tuple[int, str, str]:
    return cli(capsys, host, "profile", "init", host.name, "--profiles", str(profiles), *extra)


def value_lines(text: str) -> list[tuple[str, str]]:
    """(line, its comment: the same line's, else the comment lines just above) for every `key: value`."""
    out, above = [], []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# "))
            continue
        if re.match(r"^\s*[\w.-]+: \S", line) or re.match(r"^\s+[A-Z_]+: ", line):
            comment = line.split("  # ", 1)[1] if "  # " in line else " ".join(above)
            out.append((line, comment))
        above = [] if stripped else above
    return out


# ------------------------------------------------------------------ a host that runs a hand-made unit


def test_a_serving_host_gets_a_profile_that_renders_its_running_argv(capsys: Any, profiles: Path) -> None:
    host = seeded()
    running = exec_start(host.text("/etc/systemd/system/sglang.service") or "")
    code, out, err = init(capsys, host, profiles)
    assert code == 0, err
    text = (profiles / "ct129.yaml").read_text()
    p = load_profile("ct129", directory=profiles)
    assert p.desired_mode == "nextn" and p.service.python == "/opt/sglang/venv/bin/python"
    r = render(p, "nextn", environ={})
    assert list(r.argv) == running
    # the whole unit and its env file too: a deploy of nextn is then no change at all
    assert r.unit_text == host.text("/etc/systemd/system/sglang.service")
    assert r.env_text == host.text("/etc/ddtree-ops/sglang.env")
    assert "gives the running sglang.service's argv and environment exactly" in err
    assert "preflight passed" in err
    assert [c for c in host.commands if "SCRIPT" in c or c.startswith("s=\"$1\"")][:1], host.commands
    facts_runs = [c for c in host.commands if c.startswith('s="$1"; p="$2"')]
    assert len(facts_runs) == 1  # the host is asked once
    for line, comment in value_lines(text):
        assert comment.startswith(SOURCES), f"no source for {line!r}: {comment!r}"
    assert "from the running unit" in text and "detected" in text


def test_the_first_deploy_adopts_the_running_unit_then_deploys_ddtree_shadow(capsys: Any, profiles: Path) -> None:
    host = seeded()
    assert init(capsys, host, profiles)[0] == 0
    with open(profiles / "ct129.yaml", "a") as fh:
        fh.write("\ngate:\n  stay_healthy_s: 0\n")
    code, out, err = cli(capsys, host, "deploy", "ct129", "--mode", "ddtree-shadow", "--yes", "--json",
                         "--profiles", str(profiles))
    doc = json.loads(out)
    assert code == 0 and doc["result"] == "ok", err
    assert "adopted the running sglang.service as known-good baseline" in err
    rec = records(host)
    # serving the new release; a failure returns to the adopted unit (the last NEXTN release that passed)
    assert rec["current"] == doc["release_id"] and rec["current"].startswith("ddtree-shadow-")
    assert rec["known_good"] and rec["known_good"].startswith("baseline-")


def test_a_running_line_with_flags_the_profile_has_no_key_for(capsys: Any, profiles: Path) -> None:
    """Unmodelled flags pass through as written; credentials become references, their values never shown."""
    host = seeded()
    unit_path = "/etc/systemd/system/sglang.service"
    unit = host.text(unit_path) or ""
    host.files[unit_path] = unit.replace("--speculative-num-draft-tokens 4",
                                         "--speculative-num-draft-tokens 4 --trust-remote-code "
                                         "--lora-paths a b --random-seed -1").encode()
    host.unit_env = '"HF_TOKEN=hf_do_not_print" NCCL_DEBUG=WARN'
    code, out, err = init(capsys, host, profiles, "--json")
    assert code == 0, err
    text = (profiles / "ct129.yaml").read_text()
    p = load_profile("ct129", directory=profiles)
    assert p.service.extra_args == ["--trust-remote-code", "--lora-paths", "a", "b", "--random-seed", "-1"]
    assert p.service.secrets == {"HF_TOKEN": "env:HF_TOKEN"}
    assert p.service.env["NCCL_DEBUG"] == "WARN"
    assert "hf_do_not_print" not in text + out + err
    doc = json.loads(out)
    assert doc["schema_version"] == 1 and doc["argv_identical"] is True
    assert doc["env_differences"] == []
    assert doc["preflight"]["ok"] is True
    assert "HF_TOKEN is not set on this machine" in err


def test_a_running_line_that_differs_from_render_is_shown_flag_by_flag(capsys: Any, profiles: Path) -> None:
    """A hand-written line without --enable-metrics and with its flags in another order: the
    profile reproduces what it can and the difference is printed."""
    host = seeded()
    unit_path = "/etc/systemd/system/sglang.service"
    unit = host.text(unit_path) or ""
    host.files[unit_path] = unit.replace(" --enable-metrics", "").replace(
        "--host 127.0.0.1 --port 30000", "--port 30000 --host 127.0.0.1").encode()
    code, out, err = init(capsys, host, profiles)
    assert code == 0, err
    assert "render --mode nextn against the running sglang.service (argv differs" in err
    assert "+ --enable-metrics" in err
    assert "--port" not in err.split("argv differs")[1].split("preflight")[0]


# ------------------------------------------------------------------ a fresh host


def test_a_fresh_host_with_model_and_draft(capsys: Any, profiles: Path) -> None:
    host = fresh()
    code, out, err = init(capsys, host, profiles, "--model", "/models/Qwen3-8B",
                          "--draft", "/models/Qwen3-8B-DFlash-b16")
    assert code == 0, err
    p = load_profile("ct300", directory=profiles)
    assert p.service.model_path == "/models/Qwen3-8B"
    assert p.modes.dflash and p.modes.dflash.draft_model_path == "/models/Qwen3-8B-DFlash-b16"
    assert p.modes.ddtree_shadow and p.modes.ddtree_shadow.draft_model_path == "/models/Qwen3-8B-DFlash-b16"
    # no MTP layers, no NEXTN draft named: NEXTN cannot serve, so the mode and rollback go to DFLASH
    assert p.modes.nextn.draft_model_path is None
    assert (p.desired_mode, p.known_good_mode) == ("dflash", "dflash")
    # memory from SGLang's formula on the probed card, with the draft: what fits, as the comment says
    assert p.memory.context_length * p.memory.max_running_requests <= 132_870
    assert p.memory.context_length >= 16384 and 0.5 <= p.memory.mem_fraction_static <= 0.93
    text = (profiles / "ct300.yaml").read_text()
    assert re.search(r"mem_fraction_static: [\d.]+\s*$", text, re.M) and "SGLang's KV pool formula" in text
    assert "preflight passed" in err
    assert host.payloads[0]["models"] == ["/models/Qwen3-8B"]
    with open(profiles / "ct300.yaml", "a") as fh:
        fh.write("\ngate:\n  stay_healthy_s: 0\n")
    code, out, err = cli(capsys, host, "deploy", "ct300", "--mode", "dflash", "--yes", "--profiles", str(profiles))
    assert code == 0, err


def test_drafts_beside_the_target_are_found_and_placed(capsys: Any, profiles: Path) -> None:
    host = fresh()
    code, out, err = init(capsys, host, profiles, "--model", "/models/Qwen3-8B", "--print")
    assert code == 0, err
    doc = yaml.safe_load(out)
    assert doc["modes"]["nextn"]["draft_model_path"] == "/models/Qwen3-8B-NextN"
    assert doc["modes"]["dflash"]["draft_model_path"] == "/models/Qwen3-8B-DFlash-b16"
    assert doc["mode"] == "nextn" and "known_good_mode" not in doc
    assert "detected (beside /models/Qwen3-8B)" in out
    assert not (profiles / "ct300.yaml").exists()  # --print writes nothing


def test_the_backend_follows_the_architecture(capsys: Any, profiles: Path) -> None:
    blackwell = [{"index": 0, "uuid": "GPU-b", "name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
                  "memory_total_mib": 97887, "memory_used_mib": 500, "memory_free_mib": 97387, "compute_cap": "12.0"}]
    host = fresh(probe=gpu_probe(blackwell))
    code, out, err = init(capsys, host, profiles, "--model", "/models/Qwen3-8B", "--print", "--from", "a6000")
    assert code == 0, err
    doc = yaml.safe_load(out)
    assert doc["gpu"]["arch"] == "sm_120" and doc["memory"]["attention_backend"] == "flashinfer"
    hopper = [dict(blackwell[0], name="NVIDIA H100 80GB HBM3", memory_total_mib=81559, memory_free_mib=81000,
                   compute_cap="9.0")]
    code, out, err = init(capsys, fresh(probe=gpu_probe(hopper)), profiles, "--model", "/models/Qwen3-8B", "--print")
    assert yaml.safe_load(out)["memory"]["attention_backend"] == "fa3"


# ------------------------------------------------------------------ --from, --force, the group layers


def test_from_a_group_layers_its_settings_under_the_facts(capsys: Any, profiles: Path) -> None:
    host = fresh()
    code, out, err = init(capsys, host, profiles, "--model", "/models/Qwen3-8B", "--from", "a6000")
    assert code == 0, err
    text = (profiles / "ct300.yaml").read_text()
    p = load_profile("ct300", directory=profiles)
    assert p.desired_mode == "ddtree-shadow"  # the group's choice
    assert p.modes.ddtree_shadow and p.modes.ddtree_shadow.budget == 64
    assert p.service.served_model_name == "qwen3-8b"
    # the group's budget (64) is the defaults' since the tree-serving branch: said once, not repeated as a key
    assert "so not repeated here: modes.ddtree-shadow.budget" in text, text
    assert not re.search(r"^\s+budget:", text, re.M), text
    assert re.search(r"context_length: 32768\s+# from a6000", text)


def test_a_group_member_gets_only_what_differs_from_its_group(capsys: Any, profiles: Path, tmp_path: Path) -> None:
    inv = tmp_path / "inventory.yaml"
    inv.write_text("all:\n  children:\n    a6000:\n      hosts:\n        ct300:\n")
    host = fresh()
    code, out, err = init(capsys, host, profiles, "--inventory", str(inv))
    assert code == 0, err
    text = (profiles / "ct300.yaml").read_text()
    assert "mem_fraction_static" not in text.split("# memory fits")[1].split("\n", 1)[1]  # the group's 0.81 fits
    assert "so not repeated here" in text and "a6000" in text
    p = Inventory.load(profiles, inv).profile("ct300")
    assert p.desired_mode == "ddtree-shadow" and p.memory.mem_fraction_static == 0.81
    assert p.gpu.model == "NVIDIA RTX A6000"


def test_a_group_setting_that_does_not_fit_the_card_is_derived_instead(capsys: Any, profiles: Path) -> None:
    host = fresh()  # 48 GB: the pro6000 group's 65536 x 4 at 0.84 is sized for 96 GB
    code, out, err = init(capsys, host, profiles, "--model", "/models/Qwen3-8B", "--from", "pro6000", "--print")
    assert code == 0, err
    doc = yaml.safe_load(out)
    assert doc["memory"]["context_length"] < 65536
    assert "does not fit this card" in err


def test_an_existing_profile_is_kept_without_force(capsys: Any, profiles: Path) -> None:
    (profiles / "ct129.yaml").write_text("# mine\n")
    host = seeded()
    code, out, err = init(capsys, host, profiles)
    assert code == 64 and "--force replaces it" in err
    assert (profiles / "ct129.yaml").read_text() == "# mine\n"
    assert host.commands == []  # refused before the host was asked
    code, out, err = init(capsys, host, profiles, "--force")
    assert code == 0 and "# mine" not in (profiles / "ct129.yaml").read_text()


# ------------------------------------------------------------------ refusals: a clear error, nothing written


def _refused(capsys: Any, profiles: Path, host: InitHost, *args: str) -> tuple[int, str]:
    code, out, err = init(capsys, host, profiles, *args)
    assert not (profiles / f"{host.name}.yaml").exists()
    return code, " ".join(err.split())


def test_no_gpu(capsys: Any, profiles: Path) -> None:
    code, err = _refused(capsys, profiles, fresh(probe=gpu_probe([])), "--model", "/models/Qwen3-8B")
    assert code == 3 and "no GPU visible on the host" in err


def test_no_sglang(capsys: Any, profiles: Path) -> None:
    host = fresh(pythons=[{"path": "/usr/bin/python3", "sglang": None, "python": "3.11.2"}])
    code, err = _refused(capsys, profiles, host, "--model", "/models/Qwen3-8B")
    assert code == 3 and "no SGLang on the host" in err and "/usr/bin/python3: no sglang" in err
    assert "looked in /opt/sglang/venv/bin/python" in err


def test_a_model_path_that_is_not_a_model(capsys: Any, profiles: Path) -> None:
    code, err = _refused(capsys, profiles, fresh(), "--model", "/models/nothing-here")
    assert code == 64 and "/models/nothing-here is not a model" in err


def test_no_model_at_all(capsys: Any, profiles: Path) -> None:
    code, err = _refused(capsys, profiles, fresh())
    assert code == 64 and "give the target with --model PATH" in err


def test_a_draft_that_fits_no_mode(capsys: Any, profiles: Path) -> None:
    host = fresh()
    cfg = json.loads((FIXTURES / "Qwen3-8B-DFlash-b16" / "config.json").read_text())
    host.files["/models/Small-DFlash/config.json"] = json.dumps(dict(cfg, hidden_size=512)).encode()
    code, err = _refused(capsys, profiles, host, "--model", "/models/Qwen3-8B", "--draft", "/models/Small-DFlash")
    assert code == 64 and "--draft /models/Small-DFlash fits no mode" in err and "hidden_size 512" in err


def test_a_target_sglang_cannot_capture_keeps_dflash_drafts_out(capsys: Any, profiles: Path) -> None:
    host = fresh(capture={"arch": "Qwen3ForCausalLM", "file": "qwen3.py", "methods": {},
                          "architectures": ["Qwen3ForCausalLM"]})
    code, err = _refused(capsys, profiles, host, "--model", "/models/Qwen3-8B", "--draft", "/models/Qwen3-8B-DFlash-b16")
    assert code == 64 and "no hidden-state capture for Qwen3ForCausalLM" in err


def test_a_multi_node_unit_is_refused(capsys: Any, profiles: Path) -> None:
    host = seeded()
    unit_path = "/etc/systemd/system/sglang.service"
    host.files[unit_path] = (host.text(unit_path) or "").replace(
        "--enable-metrics", "--enable-metrics --nnodes 2 --node-rank 0").encode()
    code, err = _refused(capsys, profiles, host)
    assert code == 64 and "--nnodes 2: this unit is one node of a multi-node service" in err


# ------------------------------------------------------------------ cards


def test_a_mig_card_0_leaves_the_service_on_the_next_card(capsys: Any, profiles: Path) -> None:
    card = {"uuid": "GPU-0", "name": "NVIDIA RTX A6000", "memory_total_mib": 49140, "memory_used_mib": 500,
            "memory_free_mib": 48640, "compute_cap": "8.6"}
    cards = [dict(card, index=0, mig_mode="Enabled"), dict(card, index=1, uuid="GPU-1")]
    code, out, err = init(capsys, fresh(probe=gpu_probe(cards)), profiles, "--model", "/models/Qwen3-8B", "--print")
    assert code == 0, err
    doc = yaml.safe_load(out)
    assert doc["gpus"] == [1] and doc["gpu"]["count"] == 2
    assert "MIG mode enabled" in err


def test_a_stray_process_is_flagged_and_memory_sized_without_its_share(capsys: Any, profiles: Path) -> None:
    stray = [{"gpu_uuid": "GPU-fake-0", "pid": 777, "used_mib": 20000, "name": "python", "unit": None}]
    cards = json.loads(gpu_probe())["gpus"]
    cards[0].update(memory_used_mib=20600, memory_free_mib=49140 - 20600)
    code, out, err = init(capsys, fresh(probe=gpu_probe(cards, stray)), profiles, "--model", "/models/Qwen3-8B",
                          "--print")
    assert code == 0, err
    assert "pid 777 python (no unit) holds 20,000 MiB" in " ".join(err.split())
    assert yaml.safe_load(out)["memory"]["context_length"] < 32768


def test_a_host_serving_dflash_by_hand_keeps_dflash_as_its_known_good(capsys: Any, profiles: Path) -> None:
    host = seeded(mode="dflash")
    code, out, err = init(capsys, host, profiles)
    assert code == 0, err
    p = load_profile("ct129", directory=profiles)
    assert (p.desired_mode, p.known_good_mode) == ("dflash", "dflash")
    assert list(render(p, "dflash", environ={}).argv) == exec_start(host.text("/etc/systemd/system/sglang.service") or "")


def test_a_checkpoint_with_mtp_layers_serves_nextn_without_a_draft(capsys: Any, profiles: Path) -> None:
    host = fresh()
    cfg = json.loads((FIXTURES / "Qwen3-8B" / "config.json").read_text())
    host.files["/models/MTP-8B/config.json"] = json.dumps(dict(cfg, num_nextn_predict_layers=1)).encode()
    code, out, err = init(capsys, host, profiles, "--model", "/models/MTP-8B", "--print")
    assert code == 0, err
    doc = yaml.safe_load(out)
    assert doc["mode"] == "nextn" and doc["modes"]["nextn"]["draft_model_path"] is None
    assert "the checkpoint has its own MTP layers" in out
    assert "known_good_mode" not in doc
