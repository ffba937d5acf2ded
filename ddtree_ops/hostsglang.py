"""What the host's own SGLang says about a launch line, asked on the host in one round trip: its
real argument parser, its real plugin loader, and for a DFlash-family algorithm its own model files
(does the target's class capture hidden states?). Preflight judges the answer (`check_sglang`).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from typing import Any

from ddtree_ops import remote
from ddtree_ops.draftcheck import CAPTURE_SCAN
from ddtree_ops.host import Host
from ddtree_ops.profile import DDTreeMode, DDTreeShadowMode, Profile
from ddtree_ops.releases import Layout
from ddtree_ops.render import Rendered

# Runs in the host's SGLang venv: its real argument parser, its real plugin loader, and for a
# DFlash-family algorithm its own model files (does the target's class capture hidden states?).
SGLANG_CHECK = remote.QUIET_GC + CAPTURE_SCAN + r'''
import contextlib, io, json, os, sys
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
    # tree verify backends declared on this host (the plugin's DDTREE_MODE=tree serves through one)
    try:
        from importlib.metadata import entry_points
        out["tree_backends"] = {ep.name: ep.value for ep in entry_points(group="ddtree_ops.tree_verify")}
    except BaseException as exc:
        out["tree_backends"] = {"error": "%s: %s" % (type(exc).__name__, exc)}
spec = argv[argv.index("--speculative-algorithm") + 1] if "--speculative-algorithm" in argv[:-1] else ""
if spec in ("DFLASH", "DDTREE") and "--model-path" in argv[:-1]:
    try:
        import sglang
        with open(os.path.join(argv[argv.index("--model-path") + 1], "config.json")) as fh:
            archs = json.load(fh).get("architectures") or []
        out["capture"] = dict(capture_scan(os.path.join(os.path.dirname(sglang.__file__), "srt", "models"), archs),
                              architectures=archs)
    except BaseException as exc:
        out["capture"] = {"error": "%s: %s" % (type(exc).__name__, exc)}
print("\x1d" + json.dumps(out))
'''



def sglang_check(host: Host, p: Profile, mode: str, rendered: Rendered, layout: Layout,
                 plugin_version: str) -> tuple[dict[str, Any] | None, str]:
    """The launch flags through the host's own SGLang parser; the algorithm through its plugin loader.
    A pass is cached on the host per (argv, sglang and plugin install) since importing SGLang takes
    seconds: under /var/cache (`Layout.parser_cache`), never beside the state a refusal must leave
    as it was, and written beside and renamed. Returns the check's report, or None and why it could
    not run."""
    cfg = p.mode(mode)
    algo = cfg.algorithm if isinstance(cfg, (DDTreeShadowMode, DDTreeMode)) else ""
    env = {"SGLANG_PLUGINS": "ddtree"} if algo else {}
    args = list(rendered.argv[3:])
    # the tree and the shadow share a launch line; a pass is kept per mode (the tree also needs a backend)
    what = [args, algo, plugin_version if algo else ""] + (["tree"] if isinstance(cfg, DDTreeMode) else [])
    key = hashlib.sha256(json.dumps(what).encode()).hexdigest()[:16]
    python = p.service.python
    cache = layout.parser_cache
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
              'printf "%s\\n" "$out" > "$c.new" && mv -f "$c.new" "$c"; fi;; esac; exit $rc')
    res = host.run(["sh", "-c", script], sudo=True, timeout=180)
    payload = res.stdout.rpartition("\x1d")[2].strip()
    try:
        return json.loads(payload), ""
    except json.JSONDecodeError:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
        return None, f"{python} could not run SGLang's argument parser: {tail[0][:300]}"
