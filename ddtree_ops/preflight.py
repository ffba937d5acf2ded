"""Preflight: everything that can be known before a restart, checked before anything changes.

Each check returns a `Check` (ok / warn / fail, with the numbers behind it); any `fail` refuses
the deploy with exit 3 and nothing on the host touched. Reads are batched so the whole
preflight is a handful of SSH round trips.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from ddtree_ops import memory, remote
from ddtree_ops.gpu import GpuSnapshot, snapshot
from ddtree_ops.host import Host, Result
from ddtree_ops.observe import read_files
from ddtree_ops.profile import DDTreeShadowMode, DflashMode, Profile
from ddtree_ops.releases import Layout
from ddtree_ops.render import Rendered

OK, WARN, FAIL = "ok", "warn", "fail"

# Runs in the host's SGLang venv: its real argument parser, its real plugin loader.
SGLANG_CHECK = r'''
import contextlib, io, json, sys
out = {}
from importlib.metadata import version, PackageNotFoundError
for dist in ("sglang", "ddtree-ops"):
    try:
        out[dist] = version(dist)
    except PackageNotFoundError:
        out[dist] = None
argv, algo = json.loads(sys.argv[1]), sys.argv[2]
err = io.StringIO()
try:
    with contextlib.redirect_stderr(err):
        from sglang.srt.server_args import prepare_server_args
        prepare_server_args(argv)
    out["parse"] = "ok"
except SystemExit:
    out["parse"] = (err.getvalue().strip().splitlines() or ["argument error"])[-1]
except BaseException as exc:
    out["parse"] = "%s: %s" % (type(exc).__name__, exc)
if algo:
    try:
        from sglang.srt.plugins import load_plugins
        load_plugins()
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        a = SpeculativeAlgorithm.from_string(algo)
        out["algorithm"] = {"resolved": repr(a), "dflash": bool(a.is_dflash()),
                            "dflash_family": bool(a.is_dflash_family())}
    except BaseException as exc:
        out["algorithm"] = {"error": "%s: %s" % (type(exc).__name__, exc)}
print("\x1d" + json.dumps(out))
'''


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Preflight:
    checks: list[Check] = field(default_factory=list)
    memory: memory.MemoryPlan | None = None
    gpu: GpuSnapshot | None = None
    installed_unit: str | None = None
    installed_env: str | None = None
    plugin_needed: bool = False  # the ddtree plugin must be (re)installed in the host venv
    sglang_version: str | None = None

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    @property
    def ok(self) -> bool:
        return not self.failed

    def add(self, name: str, status: str, detail: str, **data: Any) -> Check:
        check = Check(name, status, detail, data)
        self.checks.append(check)
        return check

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": [c.__dict__ for c in self.checks],
                "memory": None if self.memory is None else {
                    k: v for k, v in self.memory.__dict__.items()},
                "gpu": None if self.gpu is None else self.gpu.to_json()}


def _json(data: bytes | None) -> dict[str, Any] | None:
    if data is None:
        return None
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def _draft_path(p: Profile, mode: str) -> str | None:
    return p.mode(mode).draft_model_path


def check_gpu(pf: Preflight, p: Profile, snap: GpuSnapshot) -> None:
    pf.gpu = snap
    if not snap.gpus:
        pf.add("gpu", FAIL, "no GPU visible on the host: " + "; ".join(snap.errors or ["probe returned nothing"]))
        return
    gpu = snap.gpus[0]
    if len(snap.gpus) < p.gpu.count:
        pf.add("gpu", FAIL, f"{len(snap.gpus)} GPU(s) visible, the profile expects {p.gpu.count}")
    elif gpu.arch != p.gpu.arch:
        pf.add("gpu", FAIL, f"{gpu.name} is {gpu.arch}, the profile says {p.gpu.arch}: backend rules "
                            "(facts 7.3) were checked for the wrong architecture")
    else:
        drift = abs(gpu.memory_total_mib - p.gpu.memory_mib) / p.gpu.memory_mib
        status = WARN if drift > 0.05 or gpu.name != p.gpu.model else OK
        pf.add("gpu", status, f"{len(snap.gpus)} x {gpu.name} ({gpu.arch}), {gpu.memory_free_mib:,} of "
                              f"{gpu.memory_total_mib:,} MiB free (via {snap.source})"
                              + ("" if status == OK else f"; profile says {p.gpu.model}, {p.gpu.memory_mib:,} MiB"))
    strays = snap.strays(p.service.unit)
    if strays:
        listing = ", ".join(f"pid {a.pid} {a.name or ''} {a.used_mib:,} MiB ({a.unit or 'no unit'})".replace("  ", " ")
                            for a in strays)
        pf.add("gpu-processes", WARN, f"processes outside {p.service.unit} hold GPU memory: {listing}; "
                                      "stray workers of an earlier run cause false 'Not enough memory' failures",
               strays=[a.__dict__ for a in strays])
    else:
        pf.add("gpu-processes", OK, "no process outside the service holds GPU memory")


def check_models(pf: Preflight, p: Profile, mode: str, files: dict[str, bytes | None]) -> None:
    s = p.service
    target_cfg = _json(files.get(f"{s.model_path}/config.json"))
    if target_cfg is None:
        pf.add("model", FAIL, f"{s.model_path}/config.json is missing or unreadable on the host "
                              "(SGLang would treat the path as a Hub repo id and fail)")
        return
    try:
        target = memory.model_shape(target_cfg)
    except ValueError as exc:
        pf.add("model", FAIL, f"{s.model_path}/config.json: {exc}")
        return
    index = _json(files.get(f"{s.model_path}/model.safetensors.index.json"))
    weights = memory.weights_bytes(target_cfg, index)
    pf.add("model", OK, f"{target.architecture or 'model'}: {target.layers} layers, {target.kv_heads} KV heads x "
                        f"{target.head_dim}, {weights / memory.GIB:.1f} GiB weights")
    cfg = p.mode(mode)
    draft_cfg, draft_cell, draft_weights = None, 0, 0
    draft = _draft_path(p, mode)
    if draft:
        draft_cfg = _json(files.get(f"{draft}/config.json"))
        if draft_cfg is None:
            pf.add("draft", FAIL, f"{draft}/config.json is missing or unreadable on the host")
            return
        draft_weights = memory.draft_weights_bytes(draft_cfg, target)
        # the draft's own KV pool has the target's token capacity (EAGLE/NEXTN and DFlash alike)
        draft_cell = memory.model_shape(draft_cfg).cell_bytes(p.memory.kv_cache_dtype)
        if isinstance(cfg, (DflashMode, DDTreeShadowMode)):
            _check_dflash_draft(pf, cfg, draft, draft_cfg, target_cfg)
        else:
            pf.add("draft", OK, f"{draft}: {memory.model_shape(draft_cfg).layers}-layer draft")
    pf.memory = memory.plan(
        gpu_total_mib=pf.gpu.gpus[0].memory_total_mib if pf.gpu and pf.gpu.gpus else p.gpu.memory_mib,
        free_mib=_free_for_service(pf, p), target=target, weights=weights, draft_cell=draft_cell,
        draft_weights=draft_weights, mem_fraction_static=p.memory.mem_fraction_static,
        context_length=p.memory.context_length, concurrency=p.memory.max_running_requests,
        kv_cache_dtype=p.memory.kv_cache_dtype, page_size=p.memory.page_size,
        speculative=True, cuda_graph_max_bs=p.memory.cuda_graph_max_bs or 0,
        chunked_prefill=p.memory.chunked_prefill_size)
    plan = pf.memory
    if plan.problems:
        fixes = "; or ".join(plan.suggestions) if plan.suggestions else "a smaller model, quantization or more GPUs"
        why = plan.problems[0] if plan.tokens <= 0 else "that does not fit"
        pf.add("memory", FAIL, f"{plan.summary()}: {why}. Would fit: {fixes}",
               tokens=plan.tokens, needed=plan.needed_tokens, suggestions=plan.suggestions)
    else:
        pf.add("memory", WARN if plan.warnings else OK, plan.summary() + ("; " + " ".join(plan.warnings) if plan.warnings else ""),
               tokens=plan.tokens, needed=plan.needed_tokens)


def _free_for_service(pf: Preflight, p: Profile) -> int:
    """Free memory the new server will find: today's free plus what the service itself holds
    (it is stopped by the restart); memory held by anything else stays taken."""
    if not pf.gpu or not pf.gpu.gpus:
        return p.gpu.memory_mib
    gpu = pf.gpu.gpus[0]
    ours = sum(a.used_mib for a in pf.gpu.apps if a.unit == p.service.unit)
    return min(gpu.memory_total_mib, gpu.memory_free_mib + ours)


def _check_dflash_draft(pf: Preflight, cfg: DflashMode | DDTreeShadowMode, draft: str, draft_cfg: dict[str, Any],
                        target_cfg: dict[str, Any]) -> None:
    """The draft's captured layers against what the target architecture captures (one rule with
    `diagnose HOST`: `draftcheck`), then its trained block size against the profile's."""
    from ddtree_ops.draftcheck import check_target_layer_ids

    layers = check_target_layer_ids(draft_cfg, target_cfg)
    dflash = draft_cfg.get("dflash_config") or {}
    block = draft_cfg.get("block_size") or dflash.get("block_size")
    if layers.status == "fail":
        pf.add("draft", FAIL, f"{draft}: {layers.detail} (a draft asking for them dies at the first request with "
                              "'DFLASH target_hidden feature dim mismatch')")
    elif block and int(block) != cfg.block_size:
        pf.add("draft", FAIL, f"{draft}: the draft was trained with block_size {block}, the profile sets "
                              f"{cfg.block_size} (--speculative-num-draft-tokens)")
    elif layers.status == "warn":
        pf.add("draft", WARN, f"{draft}: {layers.detail}")
    else:
        ids = list(layers.layer_ids or ())
        pf.add("draft", OK, f"{draft}: DFlash draft, {len(ids)} captured target layers {ids}, block {block or cfg.block_size}")


def sglang_check(host: Host, p: Profile, mode: str, rendered: Rendered, layout: Layout,
                 plugin_version: str) -> tuple[dict[str, Any] | None, str]:
    """The launch flags through the host's own SGLang parser; the algorithm through its plugin loader.
    A pass is cached on the host per (argv, sglang and plugin install) since importing SGLang takes
    seconds. Returns the check's report, or None and why it could not run."""
    cfg = p.mode(mode)
    algo = cfg.algorithm if isinstance(cfg, DDTreeShadowMode) else ""
    env = {"SGLANG_PLUGINS": "ddtree"} if algo else {}
    args = list(rendered.argv[3:])
    key = hashlib.sha256(json.dumps([args, algo, plugin_version if algo else ""]).encode()).hexdigest()[:16]
    python = p.service.python
    cache = f"{layout.root}/parser-ok"
    check = shlex.join(remote.env_run(env, remote.python_run(python, SGLANG_CHECK, json.dumps(args), algo)))
    # the cache key names the installed sglang and ddtree-ops dist-info directories, so a changed
    # install (or the plugin deployed a moment ago) is checked afresh
    script = (f'py={shlex.quote(python)}; sp="$(dirname "$py")"/../lib/python3*/site-packages; '
              'd=$(ls -d $sp/sglang-*.dist-info 2>/dev/null | head -n1); '
              'e=$(ls -d $sp/ddtree_ops-*.dist-info 2>/dev/null | head -n1); '
              f'c={shlex.quote(cache)}/{key}-$(basename "$d" 2>/dev/null)-$(basename "$e" 2>/dev/null); '
              'if [ -n "$d" ] && [ -f "$c" ]; then cat "$c"; exit 0; fi; '
              f'out=$({check} 2>/dev/null); rc=$?; printf "%s\\n" "$out"; '
              'case "$out" in *\'"parse": "ok"\'*) if [ -n "$d" ]; then mkdir -p "$(dirname "$c")" && '
              'printf "%s\\n" "$out" > "$c"; fi;; esac; exit $rc')
    res = host.run(["sh", "-c", script], sudo=True, timeout=180)
    payload = res.stdout.rpartition("\x1d")[2].strip()
    try:
        return json.loads(payload), ""
    except json.JSONDecodeError:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
        return None, f"{python} could not run SGLang's argument parser: {tail[0][:300]}"


def check_sglang(pf: Preflight, p: Profile, mode: str, found: tuple[dict[str, Any] | None, str],
                 plugin_version: str) -> None:
    doc, error = found
    python = p.service.python
    algo = p.mode(mode).algorithm if isinstance(p.mode(mode), DDTreeShadowMode) else ""
    if doc is None:
        pf.add("sglang", FAIL, error)
        return
    pf.sglang_version = doc.get("sglang")
    if not doc.get("sglang"):
        pf.add("sglang", FAIL, f"sglang is not installed for {python}")
        return
    if doc.get("parse") != "ok":
        pf.add("launch-flags", FAIL, f"sglang {doc['sglang']} refuses the launch flags: {doc.get('parse')}")
    else:
        pf.add("launch-flags", OK, f"accepted by sglang {doc['sglang']}'s own parser on the host")
    if algo:
        from ddtree_ops.engine.sglang_settings import version_problem

        installed = doc.get("ddtree-ops")
        alg = doc.get("algorithm") or {}
        unsupported = version_problem(doc["sglang"])
        if unsupported:
            pf.add("plugin", FAIL, f"{unsupported}: the DFlash worker the shadow hooks into differs between "
                                   "releases; install a supported sglang in the host venv, or a ddtree-ops that "
                                   "lists this one")
        elif installed != plugin_version:
            pf.plugin_needed = True
            pf.add("plugin", OK, f"ddtree plugin {installed or 'not installed'} in {python}: this deploy installs "
                                 f"{plugin_version}")
        elif "error" in alg:
            pf.add("plugin", FAIL, f"DDTREE does not resolve on the host: {alg['error']}")
        elif not alg.get("dflash_family"):
            pf.add("plugin", FAIL, "DDTREE resolves but is not DFlash-family: SGLang will not set up target "
                                   "hidden-state capture (the failure this tool exists for)")
        else:
            pf.add("plugin", OK, f"ddtree plugin {installed} registers DDTREE as DFlash-family ({alg.get('resolved')})")


VERIFY_IGNORE = ("Unit sysinit.target not found",)


def verify_unit(host: Host, rendered: Rendered) -> Result:
    """systemd-analyze verify on the host, on a staged copy under the unit's real file name."""
    script = ('d=$(mktemp -d /tmp/ddtree-ops-verify.XXXXXX) || exit 1; f="$d/$1"; cat > "$f"; '
              'systemd-analyze verify -- "$f" 2>&1; rc=$?; rm -rf -- "$d"; exit $rc')
    return host.run(["sh", "-c", script, "sh", rendered.unit_name], stdin=rendered.unit_text.encode(), timeout=60)


def check_unit(pf: Preflight, res: Result, rendered: Rendered) -> None:
    lines = [ln for ln in res.stdout.splitlines()
             if rendered.unit_name in ln and not any(i in ln for i in VERIFY_IGNORE)]
    if lines or (res.rc != 0 and not res.stdout.strip()):
        pf.add("unit", FAIL, "systemd-analyze verify: " + ("; ".join(lines) or res.stderr.strip()[:300]))
    else:
        pf.add("unit", OK, f"systemd-analyze verify passes for {rendered.unit_name} on the host")


def run_preflight(host: Host, p: Profile, mode: str, rendered: Rendered, layout: Layout,
                  plugin_version: str) -> Preflight:
    """The four reads run side by side on the one SSH connection (each is a round trip, one
    imports SGLang on the host); the checks then judge what came back, in a fixed order."""
    from concurrent.futures import ThreadPoolExecutor

    pf = Preflight()
    s = p.service
    paths = [f"{s.model_path}/config.json", f"{s.model_path}/model.safetensors.index.json",
             rendered.unit_path, rendered.env_path]
    draft = _draft_path(p, mode)
    if draft:
        paths.append(f"{draft}/config.json")
    with ThreadPoolExecutor(4) as pool:
        f_files = pool.submit(read_files, host, paths)
        f_gpu = pool.submit(snapshot, host, s.python)
        f_sglang = pool.submit(sglang_check, host, p, mode, rendered, layout, plugin_version)
        f_unit = pool.submit(verify_unit, host, rendered)
        files = f_files.result()
    installed_unit, installed_env = files.get(rendered.unit_path), files.get(rendered.env_path)
    pf.installed_unit = installed_unit.decode() if installed_unit is not None else None
    pf.installed_env = installed_env.decode() if installed_env is not None else None
    check_gpu(pf, p, f_gpu.result())
    check_models(pf, p, mode, files)
    check_sglang(pf, p, mode, f_sglang.result(), plugin_version)
    check_unit(pf, f_unit.result(), rendered)
    return pf
