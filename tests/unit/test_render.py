"""Rendering: golden units, what the unit means (SGLang's own parser, systemd's reading), systemd quoting,
systemd-analyze verify."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
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
    assert "SGLANG_PLUGINS=ddtree" in r.env_text and "DDTREE_BUDGET=32" in r.env_text
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


# --------------------------------------------------------------------------- what the unit means
# The golden files above hold the renderer to its own earlier output, and `make golden` rewrites them:
# a wrong unit, regenerated, passes there. The tests below read the rendered unit the way systemd and
# SGLang read it and hold it to the profile it came from: ExecStart split by systemd's rules and parsed
# by SGLang 0.5.23's own argument parser (installed in the venv), the EnvironmentFile as systemd reads
# it, the restart policy and limits, and the readiness probe run for real.

# what each mode means to SGLang, written down here, not taken from the renderer
ALGORITHM = {"nextn": "NEXTN", "dflash": "DFLASH", "ddtree-shadow": "DDTREE", "ddtree": "DDTREE"}


def unit_sections(text: str) -> dict[str, list[tuple[str, str]]]:
    """A unit file as systemd reads it: [Section] headers, Key=Value lines (a key may repeat),
    comments (#, ;) and blank lines skipped."""
    out: dict[str, list[tuple[str, str]]] = {}
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            out.setdefault(section, [])
            continue
        key, sep, value = line.partition("=")
        assert sep and section, f"not a unit file line: {line!r}"
        out[section].append((key.strip(), value.strip()))
    return out


def one(sections: dict[str, list[tuple[str, str]]], section: str, key: str) -> str:
    values = [v for k, v in sections.get(section, []) if k == key]
    assert len(values) == 1, f"[{section}] {key}: {values}"
    return values[0]


C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"',
             "'": "'", "s": " "}


def systemd_words(line: str) -> list[str]:
    """An ExecStart= line as the argv systemd runs (systemd.service(5), "COMMAND LINES"): specifiers
    first (only %% occurs in a rendered unit: a literal %), then words split on whitespace, in double or
    single quotes or bare, with C escapes; then $$ is a literal $ (a rendered unit expands no variable)."""
    assert re.search(r"%[^%]", line.replace("%%", "")) is None, f"a specifier in {line!r}"
    line = line.replace("%%", "%")
    words, i = [], 0
    while i < len(line):
        if line[i].isspace():
            i += 1
            continue
        word, quote = "", None
        while i < len(line) and (quote or not line[i].isspace()):
            c = line[i]
            if c == "\\" and i + 1 < len(line):
                assert line[i + 1] in C_ESCAPES, f"escape \\{line[i + 1]} in {line!r}"
                word, i = word + C_ESCAPES[line[i + 1]], i + 2
                continue
            if quote is None and c in "\"'" and word == "":
                quote = c
            elif c == quote:
                quote = None
            else:
                word += c
            i += 1
        assert quote is None, f"unterminated quote in {line!r}"
        assert re.search(r"\$[^$]", word.replace("$$", "")) is None, f"a variable in {word!r}"
        words.append(word.replace("$$", "$"))
    return words


def environment_file(text: str) -> dict[str, str]:
    """An EnvironmentFile as systemd reads it (systemd.exec(5)): KEY=VALUE lines, # comments, a value
    in single quotes taken as it is, in double quotes with \\ escapes of \\ " ` $."""
    env = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith(("#", ";")):
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key), line
        if value[:1] == "'" and value[-1:] == "'" and len(value) > 1:
            value = value[1:-1]
        elif value[:1] == '"' and value[-1:] == '"' and len(value) > 1:
            value = re.sub(r'\\([\\"`$])', r"\1", value[1:-1])
        env[key] = value
    return env


SGLANG_PARSE = r'''
import argparse, contextlib, io, json, sys
from sglang.srt.server_args import ServerArgs
out = []
for argv in json.loads(sys.stdin.read()):
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(argv)
        ServerArgs.from_cli_args(ns)  # its own checks past the parser, as prepare_server_args runs them
        out.append({k: v for k, v in vars(ns).items() if isinstance(v, (str, int, float, bool, type(None)))})
    except SystemExit:
        out.append({"error": err.getvalue().strip().splitlines()[-1]})
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def sglang_reads() -> dict[tuple[str, str], dict]:
    """SGLang 0.5.23's parser over the argv of each rendered unit's ExecStart (one interpreter for all)."""
    pytest.importorskip("sglang", reason="sglang 0.5.23 (installed --no-deps) reads the argv")
    argvs = {case: systemd_words(one(unit_sections(render(_profile(case[0]), case[1], environ={}).unit_text),
                                     "Service", "ExecStart")) for case in CASES}
    res = subprocess.run([sys.executable, "-c", SGLANG_PARSE], input=json.dumps([a[3:] for a in argvs.values()]),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return dict(zip(argvs, json.loads(res.stdout.strip().splitlines()[-1])))


@pytest.mark.parametrize("host,mode", CASES)
def test_the_unit_launches_what_the_profile_says(host: str, mode: str, sglang_reads: dict) -> None:
    p = _profile(host)
    argv = systemd_words(one(unit_sections(render(p, mode, environ={}).unit_text), "Service", "ExecStart"))
    assert argv[:3] == [p.service.python, "-m", "sglang.launch_server"]
    got = sglang_reads[(host, mode)]
    assert "error" not in got, got
    m, s, cfg = p.memory, p.service, p.mode(mode)
    assert mode in ALGORITHM, f"mode {mode}: write down what it means to SGLang in ALGORITHM and below"
    expected = {
        "model_path": s.model_path, "host": s.listen_host, "port": s.port, "served_model_name": s.served_model_name,
        "mem_fraction_static": m.mem_fraction_static, "context_length": m.context_length,
        "max_running_requests": m.max_running_requests, "attention_backend": m.attention_backend,
        "dtype": m.dtype, "kv_cache_dtype": m.kv_cache_dtype, "page_size": m.page_size,
        "chunked_prefill_size": m.chunked_prefill_size, "quantization": m.quantization,
        "disable_cuda_graph": not m.cuda_graph, "cuda_graph_max_bs_decode": m.cuda_graph_max_bs if m.cuda_graph else None,
        "enable_metrics": True,  # smoke and promote read /metrics
        "tp_size": p.parallel.tp_size if p.parallel else 1,
        "speculative_algorithm": ALGORITHM[mode], "speculative_draft_model_path": cfg.draft_model_path,
    }
    if mode == "nextn":
        expected.update(speculative_num_steps=cfg.num_steps, speculative_eagle_topk=cfg.eagle_topk,
                        speculative_num_draft_tokens=cfg.num_draft_tokens)
    else:  # DFlash and DDTree: one verify block of block_size tokens
        expected.update(speculative_num_draft_tokens=cfg.block_size,
                        speculative_draft_attention_backend=cfg.draft_attention_backend)
    got = {**got, "page_size": got["page_size"] or 1}  # SGLang's None is a page of one token
    assert {k: got[k] for k in expected} == expected


@pytest.mark.parametrize("host,mode", CASES)
def test_the_environment_file_is_what_the_server_needs(host: str, mode: str) -> None:
    p = _profile(host, "service.secrets.HF_TOKEN=env:HF_TOKEN_FOR_TEST")
    r = render(p, mode, environ={"HF_TOKEN_FOR_TEST": "hf_x"})
    assert one(unit_sections(r.unit_text), "Service", "EnvironmentFile") == r.env_path == f"{p.service.env_dir}/sglang.env"
    expected = {**p.service.env, "PYTHONUNBUFFERED": "1", "HF_TOKEN": "hf_x"}  # log lines reach the gate as they happen
    if mode == "ddtree-shadow":  # the engine's plugin, and the shadow's settings it reads at start
        cfg = p.mode(mode)
        expected.update(SGLANG_PLUGINS="ddtree", DDTREE_BUDGET=str(cfg.budget),
                        DDTREE_SHADOW_SHARE=str(cfg.shadow.share), DDTREE_SHADOW_REPORT_EVERY=str(cfg.shadow.report_every))
    if mode == "ddtree":  # the same plugin serving the tree, the chain measured on a share of its rounds
        cfg = p.mode(mode)
        expected.update(SGLANG_PLUGINS="ddtree", DDTREE_MODE="tree", DDTREE_BUDGET=str(cfg.budget),
                        DDTREE_CHAIN_SHARE=str(cfg.tree.chain_share), DDTREE_SHADOW_REPORT_EVERY=str(cfg.tree.report_every))
    assert environment_file(r.env_text) == expected


@pytest.mark.parametrize("host,mode", CASES)
def test_the_restart_policy_and_limits(host: str, mode: str) -> None:
    p = _profile(host)
    s = p.service
    u = unit_sections(render(p, mode, environ={}).unit_text)
    assert one(u, "Service", "Type") == "exec" and one(u, "Service", "User") == s.user
    assert one(u, "Service", "Restart") == "on-failure"
    restart, burst, interval = (float(one(u, "Service", "RestartSec")), int(one(u, "Unit", "StartLimitBurst")),
                                float(one(u, "Unit", "StartLimitIntervalSec")))
    assert (restart, burst, interval) == (s.restart_sec, s.start_limit_burst, s.start_limit_interval_s)
    assert burst * restart < interval  # a crash loop trips the start limit instead of restarting forever
    assert float(one(u, "Service", "TimeoutStartSec")) == s.timeout_start_s  # load + graph capture bound
    assert float(one(u, "Service", "TimeoutStopSec")) == s.timeout_stop_s
    assert one(u, "Service", "KillMode") == "control-group"  # no worker left holding GPU memory
    assert one(u, "Service", "LimitNOFILE") == "65536"
    assert not [k for k, _ in u["Service"] if k in ("PrivateDevices", "DeviceAllow", "DevicePolicy")]  # /dev/nvidia*
    assert one(u, "Install", "WantedBy") == "multi-user.target"


def _probe(p, port_answer: int | None, mainpid: int, wait: float) -> int | None:
    """Run the unit's ExecStartPost as systemd would (its argv, MAINPID in the environment) beside a
    server answering /health_generate with `port_answer` (None: nothing listens); its exit code, or
    None if it is still waiting after `wait` seconds."""
    import http.server
    import threading

    hits: list[str] = []

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            self.send_response(port_answer if self.path == "/health_generate" else 404)
            self.end_headers()

        def log_message(self, *_a: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", p.service.port), Answer) if port_answer else None
    if server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        argv = systemd_words(one(unit_sections(render(p, "nextn", environ={}).unit_text), "Service", "ExecStartPost"))
        proc = subprocess.Popen(argv, env={"PATH": "/usr/bin:/bin", "MAINPID": str(mainpid)})
        try:
            return proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return None
    finally:
        if server:
            server.shutdown()
            server.server_close()
            assert hits and set(hits) == {"/health_generate"}, hits


def test_the_readiness_probe_waits_for_health_generate_and_gives_up_when_the_server_dies() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # the host's interpreter runs the probe: here, this one
    p = _profile("ct200", f"service.python={sys.executable}", f"service.port={port}")
    alive = subprocess.Popen(["sleep", "60"])
    try:
        assert _probe(p, 200, alive.pid, wait=30) == 0  # ready: the start is done
        assert _probe(p, 503, alive.pid, wait=3) is None  # loading: "activating", it keeps asking
    finally:
        alive.kill()
        alive.wait()
    assert _probe(p, None, alive.pid, wait=30) == 1  # the server died first: the start fails now
