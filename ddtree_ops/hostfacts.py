"""What a host has for SGLang, asked in one round trip: the facts `profile init` writes a profile from.

One stdlib script runs on the host (as pyinfra gathers its facts) and prints raw observations:
the systemd units that run or mention SGLang (their properties, their text, their environment
files, the command lines of their processes), the interpreters in the usual places and which of
them have SGLang, the chosen SGLang's own flags (its argparse parser), the GPU probe
(`gpu.PROBE`), the model and draft directories (config.json, the weights index, the weights'
sizes, the checkpoints beside the target) and whether the host's SGLang captures the target's
hidden states (`draftcheck.CAPTURE_SCAN`). Everything that reads those observations is a pure
function here, tested on canned answers; the lab runs the script for real.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ddtree_ops import remote
from ddtree_ops.draftcheck import CAPTURE_SCAN
from ddtree_ops.gpu import PROBE, GpuSnapshot, parse_probe
from ddtree_ops.host import Host
from ddtree_ops.launchline import FlagSpec, environment, exec_start, is_launch_line

# Run with an SGLang interpreter: its version, and its parser's flags (spellings, dest, nargs).
SPEC = remote.QUIET_GC + r'''
import argparse, json
from importlib.metadata import version
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
flags = []
for a in parser._actions:
    if a.option_strings and a.dest != "help":
        n = a.nargs
        flags.append({"options": list(a.option_strings), "dest": a.dest,
                      "nargs": n if n is None or isinstance(n, int) else str(n),
                      "choices": [str(c) for c in a.choices] if a.choices else None})
print("\x1d" + json.dumps({"sglang": version("sglang"), "flags": flags}))
'''

# Run with each interpreter found: does it have SGLang (without importing it), and where.
_VERSION = r'''
import importlib.util, json, sys
from importlib.metadata import version, PackageNotFoundError
out = {"python": sys.version.split()[0], "sglang": None, "sglang_dir": None}
try:
    out["sglang"] = version("sglang")
    spec = importlib.util.find_spec("sglang")
    out["sglang_dir"] = spec.submodule_search_locations[0] if spec and spec.submodule_search_locations else None
except PackageNotFoundError:
    pass
print(json.dumps(out))
'''

# where an SGLang interpreter usually lives, in the order they are tried (after the running unit's)
USUAL_PYTHONS = ("/opt/sglang/venv/bin/python", "/opt/sglang/.venv/bin/python", "/opt/*/venv/bin/python",
                 "/opt/*/.venv/bin/python", "/opt/conda/envs/*/bin/python", "/opt/conda/bin/python",
                 "/root/miniconda3/envs/*/bin/python", "/root/miniconda3/bin/python", "/root/anaconda3/envs/*/bin/python",
                 "/root/.venv/bin/python", "/root/venv/bin/python", "/home/*/.venv/bin/python",
                 "/home/*/venv/bin/python", "/home/*/miniconda3/envs/*/bin/python", "sglang on PATH",
                 "/usr/local/bin/python3", "/usr/bin/python3")
UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system", "/lib/systemd/system",
             "/usr/lib/systemd/system")
UNIT_PROPS = ("Id", "LoadState", "ActiveState", "SubState", "MainPID", "ControlGroup", "FragmentPath", "User",
              "UnitFileState", "Environment", "EnvironmentFiles", "ExecStart")
MAX_SIBLINGS = 200

FACTS = CAPTURE_SCAN + f"PROBE = {PROBE!r}\nSPEC = {SPEC!r}\nVERSION = {_VERSION!r}\n" + \
    f"USUAL = {list(USUAL_PYTHONS)!r}\nUNIT_DIRS = {list(UNIT_DIRS)!r}\nPROPS = {','.join(UNIT_PROPS)!r}\n" + \
    f"MAX_SIBLINGS = {MAX_SIBLINGS}\n" + r'''
import glob, json, os, re, shutil, subprocess, sys
args = json.loads(sys.argv[1])
out = {"processes": [], "units": {}, "pythons": [], "looked": [], "models": {}, "siblings": {}, "capture": {},
       "errors": []}

def run(argv, timeout=30):
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout, r.stderr
    except (OSError, subprocess.SubprocessError) as exc:
        return None, "", "%s: %s" % (type(exc).__name__, exc)

def read(path, limit):
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        return None, exc.strerror or str(exc)
    if len(data) > limit:
        return None, "larger than %d bytes" % limit
    return data.decode("utf-8", "replace"), None

def cmdline(pid):
    text, _ = read("/proc/%s/cmdline" % pid, 1 << 16)
    return [w for w in (text or "").split("\0")][:-1] if text else []

def unit_of(pid):
    text, _ = read("/proc/%s/cgroup" % pid, 1 << 14)
    m = re.findall(r"/([^/\n]+\.service)", text or "")
    return m[-1] if m else None

def launches(argv):
    head = argv[:8]
    return any(w.endswith("sglang.launch_server") or w.endswith("sglang/launch_server.py") for w in head) or \
        (len(argv) > 1 and os.path.basename(argv[0]) == "sglang" and argv[1] == "serve")

# SGLang servers running now, and the units they belong to
units = []
for pid in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
    argv = cmdline(pid)
    if argv and launches(argv):
        out["processes"].append({"pid": int(pid), "argv": argv, "unit": unit_of(pid)})
        if out["processes"][-1]["unit"]:
            units.append(out["processes"][-1]["unit"])
# units whose files mention SGLang
for d in UNIT_DIRS:
    for f in sorted(glob.glob(os.path.join(d, "*.service"))):
        name = os.path.basename(f)
        if "@" in name or name in units:
            continue
        text, _ = read(f, 1 << 18)
        if text and "sglang" in text:
            units.append(name)
for unit in list(dict.fromkeys(units))[:16]:
    u = {}
    rc, u["show"], err = run(["systemctl", "show", "--no-pager", "--property", PROPS, "--", unit])
    rc, u["cat"], err2 = run(["systemctl", "cat", "--no-pager", "--", unit])
    if rc != 0:
        out["errors"].append("systemctl cat %s: %s" % (unit, (err2 or err).strip()[-200:]))
    u["env_files"] = {}
    for line in u["show"].splitlines():
        if line.startswith("EnvironmentFiles="):
            path = line.split("=", 1)[1].split(" (")[0].strip()
            if path:
                u["env_files"][path] = read(path, 1 << 18)[0]
    cg = re.search(r"^ControlGroup=(.+)$", u["show"], re.M)
    u["procs"] = []
    if cg:
        for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified"):
            text, _ = read(root + cg.group(1) + "/cgroup.procs", 1 << 16)
            if text:
                u["procs"] = [{"pid": int(p), "argv": cmdline(p)} for p in text.split()[:64]]
                break
    out["units"][unit] = u

# interpreters: the running unit's first, then the usual places
def unit_pythons():
    found = []
    for argv in [p["argv"] for p in out["processes"]] + \
            [re.findall(r"path=([^ ;]+)", u["show"]) for u in out["units"].values()]:
        if not argv:
            continue
        exe = argv[0]
        if os.path.basename(exe) == "sglang":
            exe = os.path.join(os.path.dirname(exe), "python")
        if exe.startswith("/") and os.path.basename(exe).startswith("python"):
            found.append(exe)
    return found
candidates = list(args.get("pythons") or []) + unit_pythons()
for pattern in USUAL:
    out["looked"].append(pattern)
    if pattern == "sglang on PATH":
        exe = shutil.which("sglang")
        if exe:
            candidates.append(os.path.join(os.path.dirname(os.path.realpath(exe)), "python"))
            candidates.append(os.path.join(os.path.dirname(exe), "python"))
        continue
    candidates += sorted(glob.glob(pattern)) if "*" in pattern else [pattern]
chosen = None
for py in list(dict.fromkeys(candidates))[:24]:
    if not os.path.isfile(py) or not os.access(py, os.X_OK):
        continue
    rc, so, se = run([py, "-c", VERSION], timeout=30)
    try:
        info = json.loads(so.strip().splitlines()[-1])
    except (ValueError, IndexError):
        info = {"error": (se or so).strip()[-200:] or "exit %s" % rc}
    info["path"] = py
    out["pythons"].append(info)
    if chosen is None and info.get("sglang"):
        chosen = info
if chosen:
    rc, so, se = run([chosen["path"], "-c", SPEC], timeout=180)
    out["spec"] = so.rpartition("\x1d")[2].strip() or None
    out["spec_error"] = None if out["spec"] else (se.strip().splitlines() or ["exit %s" % rc])[-1][:300]
probe_py = chosen["path"] if chosen else "python3"
rc, so, se = run([probe_py, "-c", PROBE], timeout=90)
if not so.strip() and probe_py != "python3":
    rc, so, se = run(["python3", "-c", PROBE], timeout=90)
out["gpu"] = so
out["gpu_error"] = se.strip()[-300:]

# the models: asked for, and those the units name
def named(argv, flags):
    found = []
    for i, w in enumerate(argv):
        for f in flags:
            if w == f and i + 1 < len(argv):
                found.append(argv[i + 1])
            elif w.startswith(f + "="):
                found.append(w.split("=", 1)[1])
    return found
argvs = [p["argv"] for p in out["processes"]]
for u in out["units"].values():
    m = re.search(r"argv\[\]=([^;]*)", u["show"])
    if m:
        argvs.append(m.group(1).split())
targets = list(args.get("models") or [])
drafts = list(args.get("drafts") or [])
for argv in argvs:
    targets += named(argv, ("--model-path", "--model"))
    drafts += named(argv, ("--speculative-draft-model-path", "--speculative-draft-model"))

def model(path):
    m = {"exists": os.path.exists(path), "is_dir": os.path.isdir(path)}
    if m["is_dir"]:
        m["config"], m["config_error"] = read(os.path.join(path, "config.json"), 1 << 20)
        m["index"], _ = read(os.path.join(path, "model.safetensors.index.json"), 1 << 23)
        files, size = 0, 0
        try:
            names = os.listdir(path)
        except OSError as exc:
            names, m["config_error"] = [], exc.strerror
        for name in names:
            if re.search(r"\.(safetensors|bin|pt|gguf)$", name):
                try:
                    size += os.path.getsize(os.path.join(path, name))
                    files += 1
                except OSError:
                    pass
        m["weight_files"], m["weight_bytes"] = files, size
    return m
for path in list(dict.fromkeys(targets + drafts))[:32]:
    out["models"][path] = model(path)
for path in list(dict.fromkeys(targets))[:4]:
    parent = os.path.dirname(path.rstrip("/"))
    try:
        names = sorted(os.listdir(parent))[:MAX_SIBLINGS]
    except OSError:
        names = []
    sib = []
    for name in names:
        p = os.path.join(parent, name)
        if p.rstrip("/") == path.rstrip("/") or not os.path.isfile(os.path.join(p, "config.json")):
            continue
        text, err = read(os.path.join(p, "config.json"), 1 << 18)
        sib.append({"path": p, "config": text, "config_error": err})
    out["siblings"][path] = sib
    cfg = out["models"].get(path, {}).get("config")
    if chosen and chosen.get("sglang_dir") and cfg:
        try:
            archs = json.loads(cfg).get("architectures") or []
            out["capture"][path] = dict(capture_scan(os.path.join(chosen["sglang_dir"], "srt", "models"), archs),
                                        architectures=archs)
        except BaseException as exc:
            out["capture"][path] = {"error": "%s: %s" % (type(exc).__name__, exc)}
print("\x1d" + json.dumps(out))
'''


# ------------------------------------------------------------------ what came back


@dataclass(frozen=True)
class UnitFacts:
    """A systemd unit that runs SGLang, or whose file names it."""

    name: str
    active: str  # ActiveState
    sub: str
    main_pid: int
    user: str
    fragment: str
    text: str  # `systemctl cat`: the file and its drop-ins
    env: dict[str, str]  # Environment= then its EnvironmentFile= files
    env_files: dict[str, str | None]  # path -> text (None: unreadable)
    argv: list[str] | None  # what it runs (the launcher process's command line, else its ExecStart)
    argv_from: str  # "process PID" or "ExecStart"

    @property
    def serving(self) -> bool:
        return self.active in ("active", "activating", "reloading") and self.argv_from.startswith("process")


@dataclass(frozen=True)
class PythonFacts:
    path: str
    sglang: str | None
    python: str = ""
    sglang_dir: str | None = None
    error: str = ""


@dataclass(frozen=True)
class ModelFiles:
    path: str
    exists: bool
    is_dir: bool
    config: dict[str, Any] | None
    error: str = ""  # why config is None
    index: dict[str, Any] | None = None
    weight_files: int = 0
    weight_bytes: int = 0


@dataclass
class HostFacts:
    units: list[UnitFacts] = field(default_factory=list)
    pythons: list[PythonFacts] = field(default_factory=list)
    looked: list[str] = field(default_factory=list)  # the places searched for an interpreter
    spec: list[FlagSpec] | None = None  # the chosen SGLang's flags
    spec_error: str = ""
    gpu: GpuSnapshot = field(default_factory=lambda: GpuSnapshot(None))
    models: dict[str, ModelFiles] = field(default_factory=dict)
    siblings: dict[str, list[ModelFiles]] = field(default_factory=dict)  # target -> checkpoints beside it
    capture: dict[str, dict[str, Any]] = field(default_factory=dict)  # target -> CAPTURE_SCAN's answer
    errors: list[str] = field(default_factory=list)

    @property
    def python(self) -> PythonFacts | None:
        """The interpreter with SGLang (the running unit's when it has it), or None."""
        return next((p for p in self.pythons if p.sglang), None)

    def serving(self) -> UnitFacts | None:
        """The unit serving SGLang now (an active one with a launcher process), else the first unit
        that names it."""
        return next((u for u in self.units if u.serving), None)


def _json(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def _model(path: str, raw: dict[str, Any]) -> ModelFiles:
    text = raw.get("config")
    cfg = _json(text)
    if not raw.get("exists", True):
        error = "does not exist"
    elif not raw.get("is_dir", True):
        error = "is not a directory"
    elif text is None:
        error = f"config.json: {raw.get('config_error') or 'cannot be read'}"
    elif cfg is None:
        error = "config.json is not a JSON object"
    else:
        error = ""
    return ModelFiles(path, bool(raw.get("exists", True)), bool(raw.get("is_dir", True)), cfg, error,
                      _json(raw.get("index")), int(raw.get("weight_files") or 0), int(raw.get("weight_bytes") or 0))


def parse_show(text: str) -> dict[str, list[str]]:
    """`systemctl show` lines; a property printed more than once (EnvironmentFiles) keeps each."""
    props: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if eq:
            props.setdefault(key, []).append(value)
    return props


def unit_facts(name: str, raw: dict[str, Any], processes: list[dict[str, Any]]) -> UnitFacts:
    props = parse_show(raw.get("show") or "")

    def one(key: str) -> str:
        return (props.get(key) or [""])[-1]

    files = {str(k): v for k, v in (raw.get("env_files") or {}).items()}
    env = environment(props.get("Environment", []), [v for v in files.values() if v is not None])
    main = int(one("MainPID") or 0)
    procs = [p for p in (raw.get("procs") or []) if p.get("argv")]
    procs += [p for p in processes if p.get("unit") == name and p not in procs]
    launchers = [p for p in procs if is_launch_line(p["argv"])]
    chosen = next((p for p in launchers if p["pid"] == main), None) or (
        min(launchers, key=lambda p: p["pid"]) if launchers else None)
    if chosen is not None:
        argv, argv_from = list(chosen["argv"]), f"process {chosen['pid']}"
    else:
        argv, argv_from = exec_start(raw.get("cat") or "", env), "ExecStart"
    return UnitFacts(name, one("ActiveState"), one("SubState"), main, one("User") or "root", one("FragmentPath"),
                     raw.get("cat") or "", env, files, argv, argv_from)


def parse_facts(stdout: str) -> HostFacts:
    """The facts script's answer (its last record after the \\x1d mark) to `HostFacts`."""
    raw = _json(stdout.rpartition("\x1d")[2].strip())
    if raw is None:
        return HostFacts(errors=[f"the facts script printed no answer: {stdout.strip()[-300:]!r}"])
    processes = list(raw.get("processes") or [])
    facts = HostFacts(errors=list(raw.get("errors") or []), looked=list(raw.get("looked") or []))
    facts.units = [unit_facts(n, u, processes) for n, u in (raw.get("units") or {}).items()]
    facts.units.sort(key=lambda u: not u.serving)
    facts.pythons = [PythonFacts(p["path"], p.get("sglang"), p.get("python", ""), p.get("sglang_dir"), p.get("error", ""))
                     for p in raw.get("pythons") or []]
    spec = _json(raw.get("spec"))
    if spec is not None:
        facts.spec = [FlagSpec(tuple(f["options"]), f["dest"], _nargs(f.get("nargs")), tuple(f.get("choices") or ()))
                      for f in spec.get("flags", [])]
    facts.spec_error = raw.get("spec_error") or ""
    gpu_text = raw.get("gpu") or ""
    facts.gpu = parse_probe(gpu_text) if gpu_text.strip() else GpuSnapshot(
        None, errors=[f"GPU probe printed nothing: {raw.get('gpu_error') or 'no output'}"])
    facts.models = {p: _model(p, m) for p, m in (raw.get("models") or {}).items()}
    facts.siblings = {t: [_model(s["path"], {"config": s.get("config"), "config_error": s.get("config_error")})
                          for s in sibs] for t, sibs in (raw.get("siblings") or {}).items()}
    facts.capture = {t: c for t, c in (raw.get("capture") or {}).items() if isinstance(c, dict)}
    return facts


def _nargs(value: Any) -> int | str | None:
    if value is None or isinstance(value, int):
        return value
    return str(value) if str(value) in ("?", "*", "+") else None


def facts_argv(models: list[str], drafts: list[str], pythons: list[str]) -> list[str]:
    """The one command that gathers the facts (as data, pyinfra-style): python3 runs the script,
    else the first interpreter the caller named that exists."""
    payload = json.dumps({"models": models, "drafts": drafts, "pythons": pythons})
    runner = ('s="$1"; p="$2"; shift 2; for py in python3 /usr/bin/python3 "$@"; do '
              'if command -v "$py" >/dev/null 2>&1; then exec "$py" -c "$s" "$p"; fi; done; '
              'echo "no python3 on the host" >&2; exit 127')
    return ["sh", "-c", runner, "sh", FACTS, payload, *pythons]


def gather(host: Host, *, models: list[str], drafts: list[str], pythons: list[str]) -> HostFacts:
    """Ask the host, in one round trip (as root where the profile says sudo: environment files
    and other users' processes are read)."""
    res = host.run(facts_argv(models, drafts, pythons), sudo=True, timeout=300)
    facts = parse_facts(res.stdout)
    if res.rc == 127 and not facts.units and not facts.pythons:
        facts.errors.append("the host has no python3 to run the facts script (ddtree-ops asks the host with it)")
    elif res.rc not in (0, None) and not res.stdout.strip():
        facts.errors.append(f"the facts script failed (exit {res.rc}): {(res.stderr or '').strip()[-300:]}")
    return facts


__all__ = ["FACTS", "SPEC", "USUAL_PYTHONS", "HostFacts", "ModelFiles", "PythonFacts", "UnitFacts", "facts_argv",
           "gather", "parse_facts", "parse_show", "unit_facts"]
