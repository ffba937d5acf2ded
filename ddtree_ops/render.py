"""Profile + mode -> systemd unit, EnvironmentFile and the exact SGLang argv. Pure: no I/O
beyond reading the unit template and resolving secret references.

The release id is derived from the rendered content, so the same settings give the same bytes
and a re-deploy of an unchanged, healthy service is a no-op.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ddtree_ops.errors import ProfileError
from ddtree_ops.profile import DDTreeMode, DDTreeShadowMode, DflashMode, NextnMode, Profile, shipped_dir

TEMPLATE = "sglang.service.tmpl"
_PLAIN = re.compile(r"[A-Za-z0-9_@+=:,./-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Rendered:
    host: str
    mode: str
    release_id: str
    inputs_sha: str  # sha256 (16 hex) of the profile keys this mode renders from: the unit header's inputs_sha256
    unit_name: str
    unit_path: str
    unit_text: str
    env_path: str
    env_text: str  # holds secret values: install it, never print it
    env_redacted: str  # what humans, logs and diffs see
    argv: tuple[str, ...]
    digest: str = ""  # of everything that reaches the host; a multi-node release hashes every node's
    service: str | None = None  # the multi-node service this node's unit belongs to
    node_rank: int = 0

    def manifest(self) -> dict[str, object]:
        """What a release record keeps about itself (no secret values)."""
        doc: dict[str, object] = {"release_id": self.release_id, "host": self.host, "mode": self.mode,
                                  "inputs_sha256": self.inputs_sha, "unit_name": self.unit_name,
                                  "unit_path": self.unit_path, "env_path": self.env_path, "argv": list(self.argv)}
        if self.service is not None:
            doc.update(service=self.service, node_rank=self.node_rank)
        return doc


# --------------------------------------------------------------------------- quoting


def systemd_quote(word: str, *, what: str = "value") -> str:
    """Quote one argv word for a systemd command line (systemd.service(5), "Command lines").

    Specifiers (`%`) and variable expansion (`$`) are doubled so the word reaches the process
    unchanged; anything with spaces, quotes or backslashes goes in double quotes with C escapes.
    Control characters have no faithful spelling there and are refused.
    """
    if _CONTROL.search(word):
        raise ProfileError([f"{what}: {word!r} contains a control character (newline, tab, ...); "
                            "systemd command lines cannot carry it"])
    if word == ";":
        return "\\;"
    if word and _PLAIN.fullmatch(word):
        return word
    body = word.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{body}"'.replace("%", "%%").replace("$", "$$")


def systemd_command(argv: list[str] | tuple[str, ...], *, what: str = "ExecStart") -> str:
    return " ".join(systemd_quote(w, what=f"{what} argument") for w in argv)


def env_quote(key: str, value: str) -> str:
    """One EnvironmentFile line that systemd parses back to exactly `value`."""
    if "\n" in value or "\r" in value or "\x00" in value:
        raise ProfileError([f"service.env.{key}: values with line breaks are refused "
                            "(an EnvironmentFile line cannot carry them unambiguously)"])
    if value == "" or _PLAIN.fullmatch(value):
        return f"{key}={value}"
    if "'" not in value:
        return f"{key}='{value}'"
    escaped = re.sub(r'([\\"`$])', r"\\\1", value)
    return f'{key}="{escaped}"'


# --------------------------------------------------------------------------- secrets


def resolve_secret(name: str, ref: str, environ: Mapping[str, str]) -> str:
    if ref.startswith("env:"):
        var = ref[4:]
        if var not in environ:
            raise ProfileError([f"service.secrets.{name}: environment variable {var} is not set "
                                "on this machine"])
        return environ[var]
    if ref.startswith("file:"):
        try:
            return Path(ref[5:]).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ProfileError([f"service.secrets.{name}: cannot read {ref[5:]} ({exc.strerror})"]) from None
    return ref


def redact(value: str) -> str:
    """Stable and non-reversible: a changed secret shows up in a diff without its value."""
    return f"<redacted sha256:{hashlib.sha256(value.encode()).hexdigest()[:8]}>"


# --------------------------------------------------------------------------- argv


def launch_argv(p: Profile, mode: str) -> list[str]:
    """The exact `python -m sglang.launch_server` argv (flags as in sglang 0.5.23)."""
    m, s = p.memory, p.service
    argv = [s.python, "-m", "sglang.launch_server",
            "--model-path", s.model_path,
            "--host", s.listen_host, "--port", str(s.port),
            "--mem-fraction-static", _num(m.mem_fraction_static),
            "--context-length", str(m.context_length),
            "--max-running-requests", str(m.max_running_requests),
            "--attention-backend", m.attention_backend,
            "--enable-metrics"]
    if s.served_model_name:
        argv += ["--served-model-name", s.served_model_name]
    if m.dtype != "auto":
        argv += ["--dtype", m.dtype]
    if m.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", m.kv_cache_dtype]
    if m.page_size != 1:
        argv += ["--page-size", str(m.page_size)]
    if m.quantization:
        argv += ["--quantization", m.quantization]
    if m.chunked_prefill_size:
        argv += ["--chunked-prefill-size", str(m.chunked_prefill_size)]
    if not m.cuda_graph:
        argv += ["--disable-cuda-graph"]
    elif m.cuda_graph_max_bs:
        argv += ["--cuda-graph-max-bs-decode", str(m.cuda_graph_max_bs)]
    cfg = p.mode(mode)
    if isinstance(cfg, NextnMode):
        argv += ["--speculative-algorithm", "NEXTN"]
        if cfg.draft_model_path:
            argv += ["--speculative-draft-model-path", cfg.draft_model_path]
        argv += ["--speculative-num-steps", str(cfg.num_steps),
                 "--speculative-eagle-topk", str(cfg.eagle_topk),
                 "--speculative-num-draft-tokens", str(cfg.num_draft_tokens)]
    elif isinstance(cfg, (DflashMode, DDTreeShadowMode, DDTreeMode)):
        argv += ["--speculative-algorithm", cfg.algorithm,
                 "--speculative-draft-model-path", cfg.draft_model_path,
                 "--speculative-num-draft-tokens", str(cfg.block_size)]
        if cfg.draft_attention_backend:
            argv += ["--speculative-draft-attention-backend", cfg.draft_attention_backend]
    return argv + parallel_argv(p) + list(s.extra_args)


def parallel_argv(p: Profile) -> list[str]:
    """SGLang's parallel flags: the sizes once the profile has a parallel section (tp always, the
    others when not 1), and for a multi-node service this node's place in it. The same line on
    every node but for --node-rank."""
    out: list[str] = []
    if p.parallel is not None:
        z = p.parallel
        out += ["--tp-size", str(z.tp_size)]
        for flag, value in (("--dp-size", z.dp_size), ("--pp-size", z.pp_size), ("--ep-size", z.ep_size)):
            if value != 1:
                out += [flag, str(value)]
    m = p.multinode
    if m is not None:
        out += ["--nnodes", str(m.nnodes), "--node-rank", str(m.node_rank), "--dist-init-addr", m.dist_init_addr]
        if m.dist_timeout_s is not None:
            out += ["--dist-timeout", str(m.dist_timeout_s)]
    return out


def _num(x: float) -> str:
    return repr(round(x, 6))


def mode_env(p: Profile, mode: str) -> dict[str, str]:
    """Environment the server needs beyond the profile's own service.env."""
    env = {"PYTHONUNBUFFERED": "1"}  # log lines reach journald as they happen: the gate reads them live
    if p.gpus is not None:
        # the cards the service owns, in rank order: SGLang numbers them 0..n-1 from here
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(c.index) for c in p.gpus)
    cfg = p.mode(mode)
    if isinstance(cfg, DDTreeShadowMode):
        # the in-tree engine is an SGLang plugin (entry point group sglang.srt.plugins, name ddtree)
        env.update({"SGLANG_PLUGINS": "ddtree", "DDTREE_BUDGET": str(cfg.budget),
                    "DDTREE_SHADOW_SHARE": _num(cfg.shadow.share),
                    "DDTREE_SHADOW_REPORT_EVERY": str(cfg.shadow.report_every)})
    elif isinstance(cfg, DDTreeMode):
        # the same plugin serving the tree (DDTREE_MODE=tree), with the chain's spine-only share
        env.update({"SGLANG_PLUGINS": "ddtree", "DDTREE_MODE": "tree", "DDTREE_BUDGET": str(cfg.budget),
                    "DDTREE_CHAIN_SHARE": _num(cfg.tree.chain_share),
                    "DDTREE_SHADOW_REPORT_EVERY": str(cfg.tree.report_every)})
    return env


def readiness_argv(p: Profile) -> list[str]:
    """ExecStartPost: wait until /health_generate answers 200, using the host's own Python."""
    url = f"http://{_loopback(p.service.listen_host)}:{p.service.port}/health_generate"
    probe = ("import sys,urllib.request as r; "
             "sys.exit(r.urlopen(sys.argv[1], timeout=5).status != 200)")
    # a server that dies before it is ready must fail the start now, not after TimeoutStartSec
    script = (f"until {_sh(p.service.python)} -c {_sh(probe)} {_sh(url)} 2>/dev/null; "
              'do kill -0 "$MAINPID" 2>/dev/null || exit 1; sleep 1; done')
    return ["/bin/sh", "-c", script]


def _loopback(listen: str) -> str:
    return "127.0.0.1" if listen in ("0.0.0.0", "::", "") else listen


def _sh(word: str) -> str:
    import shlex

    return shlex.quote(word)


# --------------------------------------------------------------------------- render


def template_dir() -> Path:
    env = os.environ.get("DDTREE_OPS_UNITS")
    if env and Path(env).is_dir():
        return Path(env)
    return shipped_dir("units")


def fill_template(template: str, values: Mapping[str, str]) -> str:
    def sub(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in values:
            raise KeyError(f"unit template uses unknown placeholder {{{{{key}}}}}")
        return values[key]

    return re.sub(r"\{\{(\w+)\}\}", sub, template)


def inputs_sha256(p: Profile, mode: str) -> str:
    """The hash of the profile keys a mode's unit renders from (the unit header's inputs_sha256).
    Secrets enter by reference, never by value; keys the unit does not use (gate, smoke) are out,
    so changing them is no new release. `profile show` prints it beside the whole profile's hash."""
    inputs = {"service": p.service.model_dump(mode="json"), "memory": p.memory.model_dump(mode="json"),
              "gpu": p.gpu.model_dump(mode="json"), "mode": p.mode(mode).model_dump(mode="json"),
              "name": mode}
    for key in ("parallel", "gpus", "multinode"):  # only when set: single-GPU units keep their bytes
        if getattr(p, key) is not None:
            inputs[key] = json.loads(json.dumps(getattr(p, key), default=lambda o: o.model_dump(mode="json")))
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def render(p: Profile, mode: str, *, environ: Mapping[str, str] | None = None,
           template: str | None = None, release_id: str | None = None) -> Rendered:
    """`release_id`: the id a multi-node service's release has on every node (`render_service`);
    otherwise it is derived from this host's own content."""
    environ = os.environ if environ is None else environ
    cfg = p.mode(mode)
    s = p.service
    argv = launch_argv(p, mode)

    env_lines, shown_lines = [], []
    for key, value in {**s.env, **mode_env(p, mode)}.items():
        env_lines.append(env_quote(key, value))
        shown_lines.append(env_lines[-1])
    for key, ref in sorted(s.secrets.items()):
        value = resolve_secret(key, ref, environ)
        env_lines.append(env_quote(key, value))
        shown_lines.append(f"{key}={redact(value)}")
    header = f"# ddtree-ops: environment for {s.unit} ({mode}); installed with mode 0600\n"
    env_text = header + "\n".join(env_lines) + "\n"
    env_redacted = header + "\n".join(shown_lines) + "\n"

    inputs_sha = inputs_sha256(p, mode)
    stem = s.unit.removesuffix(".service")
    env_path = f"{s.env_dir}/{stem}.env"
    values = {
        "host": p.name, "mode": mode, "algorithm": cfg.algorithm,
        "model_name": s.served_model_name or Path(s.model_path).name,
        "start_limit_interval": _secs(s.start_limit_interval_s),
        "start_limit_burst": str(s.start_limit_burst),
        "user": s.user, "env_path": systemd_quote(env_path, what="service.env_dir"),
        "exec_start": systemd_command(argv),
        "exec_start_post": systemd_command(readiness_argv(p), what="ExecStartPost"),
        "timeout_start": _secs(s.timeout_start_s), "timeout_stop": _secs(s.timeout_stop_s),
        "restart_sec": _secs(s.restart_sec), "syslog_identifier": stem,
        "inputs_sha": inputs_sha[:16],
    }
    text = template if template is not None else (template_dir() / TEMPLATE).read_text(encoding="utf-8")
    # the release id hashes everything that reaches the host, secrets by their redacted digest
    body = fill_template(text, {**values, "release_id": "-"})
    digest = hashlib.sha256((body + env_redacted).encode()).hexdigest()
    release_id = release_id or f"{mode}-{digest[:12]}"
    unit_text = fill_template(text, {**values, "release_id": release_id})
    m = p.multinode
    return Rendered(host=p.name, mode=mode, release_id=release_id, inputs_sha=inputs_sha[:16],
                    unit_name=s.unit, unit_path=f"/etc/systemd/system/{s.unit}", unit_text=unit_text,
                    env_path=env_path, env_text=env_text, env_redacted=env_redacted, argv=tuple(argv),
                    digest=digest, service=m.service if m else None, node_rank=m.node_rank if m else 0)


def render_service(nodes: list[Profile], mode: str, *, environ: Mapping[str, str] | None = None,
                   template: str | None = None) -> list[Rendered]:
    """Every node of a multi-node service, in rank order, under one release id: the hash of what
    reaches every node, so a change on any node is a new release of the whole service."""
    first = [render(p, mode, environ=environ, template=template) for p in nodes]
    combined = hashlib.sha256("".join(r.digest for r in first).encode()).hexdigest()
    rid = f"{mode}-{combined[:12]}"
    return [render(p, mode, environ=environ, template=template, release_id=rid) for p in nodes]


def _secs(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"

