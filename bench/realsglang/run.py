"""Run real SGLang on the lent H200 with the argv `render` makes, and bring back what it said.

On the device machine (the `device` tool's `run`), from the repository root:

    python3 bench/realsglang/run.py --out "$OUT" serve failures memory

Each name is a group of scenarios (`scenarios.py`); the servers of a group start together (their
imports take most of a start), except `memory`, whose probes run one at a time because SGLang
sizes its KV pool from the GPU memory free when each starts. For every server the runner:

- renders the launch line and environment from `bench/realsglang/h200.yaml` through
  `ddtree_ops.render` (the profile's `host.transport: local`: this machine has no sshd);
- runs the deploy gate's own state machine (`gate.GateState`) on what it observes: the process in
  place of the unit, the server's log in place of the journal, `/health_generate` and the gate's
  smoke request through `LocalHost`; then `smoke`'s parsers and judge on the real answers;
- for the `serve` group, measures decode throughput of DFLASH and DDTREE shadow side by side;
- for `memory`, runs preflight's memory fit on the live GPU (`preflight.memory_preflight` through
  `LocalHost`: the GPU probe, the model configs) and reads the pool SGLang allocated (`KV Cache is
  allocated. #tokens: N`); each probe file goes to `memory_probes/` in the bundle, the layout of
  bench/results/memory_probes/;
- for `refusals` (only when named), records preflight's verdict on settings it must refuse, then
  starts the real server anyway with the same argv and keeps its failure log;
- stops every server the way systemd stops a unit (SIGTERM to the whole process group), and runs
  `diagnose` on each log.

Logs and `summary.json` land in --out as one tar, `realsglang.tar.gz` (at most 8 files come back
from a call), rewritten after every group. `--standin` runs the same flow on this machine with the lab's SGLang stand-in, to check the
runner itself before spending device time.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from probes import gpu_facts, gpu_idle, memory_probe, refusal_verdict, refused_anyway, without_speculation  # noqa: E402
from scenarios import GROUPS, SHARED_GPU_CAP, Scenario, model_configs  # noqa: E402

DEFAULT_ROOT = Path("/tmp/rs")     # what h200.yaml and scenarios.py name; --root moves a dry run
ROOT = DEFAULT_ROOT
SITE = ROOT / "site"
T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


# ------------------------------------------------------------------ setup


def setup(standin: bool) -> dict[str, Any]:
    """Unpack the wheel set (kept while the machine stays warm), install the plugin built from this
    tree, write the models and the profiles directory."""
    info: dict[str, Any] = {}
    archive = REPO / ".device" / "realsglang" / "site.tar.xz"
    if not standin:
        stamp = SITE / ".stamp"
        want = f"{archive.stat().st_size}-{int(archive.stat().st_mtime)}"
        if not (stamp.exists() and stamp.read_text() == want):
            shutil.rmtree(SITE, ignore_errors=True)
            ROOT.mkdir(parents=True, exist_ok=True)
            with tarfile.open(archive) as tar:
                tar.extractall(ROOT)
            stamp.write_text(want)
            say(f"unpacked {archive.name}")
        install_plugin()
    models = ROOT / "models"
    for name, files in model_configs().items():
        d = models / name
        d.mkdir(parents=True, exist_ok=True)
        for fname, content in files.items():
            (d / fname).write_text(content if isinstance(content, str) else json.dumps(content, indent=1))
        for tok in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            shutil.copy(HERE / "models" / "tiny-qwen3" / tok, d / tok)
    profiles = ROOT / "profiles"
    profiles.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "profiles" / "defaults.yaml", profiles / "defaults.yaml")
    text = (HERE / "h200.yaml").read_text().replace(str(DEFAULT_ROOT), str(ROOT))
    if standin:
        text = text.replace("/opt/torch/.venv/bin/python3", sys.executable)
        standin_nvidia_smi()
    (profiles / "h200.yaml").write_text(text)
    os.environ["DDTREE_OPS_PROFILES"] = str(profiles)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), str(SITE)] + ([] if not standin else [os.environ.get("PYTHONPATH", "")]))
    for argv in (["nvidia-smi", "--query-gpu=name,memory.total,memory.free,driver_version", "--format=csv,noheader"],
                 [sys.executable, "-c", "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)"],
                 ["ps", "-o", "comm=", "-p", "1"]):
        try:
            info[argv[0].rsplit("/", 1)[-1]] = subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            info[argv[0]] = f"unavailable: {exc}"
    if not standin:
        import importlib.metadata as md

        sys.path.insert(0, str(SITE))
        info["versions"] = {d: _version(md, d) for d in ("sglang", "sglang-kernel", "flashinfer-python",
                                                         "transformers", "ddtree-ops")}
    say(f"environment: {json.dumps(info)}")
    return info


def _version(md: Any, dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def install_plugin() -> None:
    """The plugin wheel `deploy` would install on a host, built from this very tree."""
    from ddtree_ops.wheel import build

    wheel = build()
    if (SITE / f"ddtree_ops-{wheel.version}.dist-info").is_dir():
        say(f"plugin {wheel.version} already installed in {SITE}")   # a second runner on the same machine
        return
    for old in SITE.glob("ddtree_ops*"):
        shutil.rmtree(old, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / wheel.filename
        path.write_bytes(wheel.data)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
                        "--target", str(SITE), "--upgrade", str(path)], check=True)
    say(f"plugin {wheel.version} installed into {SITE}")


# ------------------------------------------------------------------ one server


@dataclass
class Server:
    sc: Scenario
    profile: Any
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    offset: int = 0
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def port(self) -> int:
        return int(self.profile.service.port)

    def start(self, standin: bool) -> None:
        from ddtree_ops.render import launch_argv, mode_env

        p, mode = self.profile, self.sc.mode
        argv = launch_argv(p, mode)
        if self.sc.plain:
            argv = without_speculation(argv)
        env = {**os.environ, **p.service.env, **mode_env(p, mode), **self.sc.env}
        self.result.update(argv=argv[1:], env={**p.service.env, **mode_env(p, mode), **self.sc.env})
        if standin:
            argv, env = standin_launch(argv, env, self.log.parent / f"{self.sc.name}.standin")
        out = open(self.log, "wb")
        out.write(f"# real-sglang run: scenario {self.sc.name}: {self.sc.about}\n".encode())
        out.flush()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        say(f"START {self.sc.name} pid={self.proc.pid} port={self.port}")

    def new_lines(self) -> list[str]:
        data = self.log.read_bytes()
        chunk, cut = data[self.offset:], data.rfind(b"\n") + 1
        if cut <= self.offset:
            return []
        chunk = data[self.offset:cut]
        self.offset = cut
        return chunk.decode("utf-8", "replace").splitlines()

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def unit(self) -> Any:
        """The process in place of the systemd unit: what `systemctl show` would say of it."""
        from ddtree_ops.observe import UnitState

        assert self.proc is not None
        rc = self.proc.poll()
        if rc is None:
            return UnitState(active="active", sub="running", result="success", main_pid=self.proc.pid,
                             invocation=f"run-{self.sc.name}", load="loaded")
        return UnitState(active="failed" if rc else "inactive", sub="failed" if rc else "dead",
                         result="exit-code" if rc else "success", main_status=rc, main_pid=0,
                         invocation=f"run-{self.sc.name}", load="loaded")

    def stop(self, timeout: float = 40.0) -> int | None:
        """SIGTERM to the process group, as systemd's KillMode=control-group does, then SIGKILL."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            t = time.monotonic()
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            self.result["stop_s"] = round(time.monotonic() - t, 2)
        try:                                      # children left behind hold GPU memory
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.result["exit"] = self.proc.returncode
        return self.proc.returncode

    def kill_scheduler(self) -> str:
        """A crash after ready: the scheduler child dies, as an OOM kill or a segfault would."""
        import psutil

        assert self.proc is not None
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                title = " ".join(child.cmdline()) + " " + child.name()
            except psutil.Error:
                continue
            if "scheduler" in title:
                child.send_signal(signal.SIGKILL)
                return f"killed pid {child.pid} ({title.strip()[:60]})"
        return "no scheduler process found"


def standin_nvidia_smi() -> None:
    """Local dry run: the lab's nvidia-smi stand-in on PATH (one simulated H200, nothing registered
    on it), so preflight's GPU probe reads a card as it would on the device."""
    work = ROOT / "standin-gpu"
    (work / "bin").mkdir(parents=True, exist_ok=True)
    (work / "gpu.json").write_text(json.dumps({"index": 0, "name": "NVIDIA H200", "uuid": "GPU-standin",
                                               "memory_mib": 143771, "compute_cap": "9.0",
                                               "driver_version": "580.159.04", "cuda_version": "13.0",
                                               "pci_bus_id": "00000000:19:00.0"}))
    tool = work / "bin" / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\nDDTREE_LAB_GPU_JSON={work}/gpu.json DDTREE_LAB_GPU_REGISTRY={work}/reg "
                    f"PYTHONPATH={REPO} exec {sys.executable} -m ddtree_ops.lab.standin.nvidia_smi \"$@\"\n")
    tool.chmod(0o755)
    os.environ["PATH"] = f"{work / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"


def standin_launch(argv: list[str], env: dict[str, str], work: Path) -> tuple[list[str], dict[str, str]]:
    """Local dry run: the lab's SGLang stand-in in place of `python -m sglang.launch_server`."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "gpu.json").write_text(json.dumps({"index": 0, "name": "NVIDIA H200", "uuid": "GPU-standin",
                                               "memory_mib": 143771, "compute_cap": "9.0",
                                               "driver_version": "580.159.04"}))
    (work / "faults").write_text("")
    launch = "import sys; from ddtree_ops.lab.standin.server import main; sys.exit(main(sys.argv[1:]))"
    env = {**env, "DDTREE_LAB_GPU_JSON": str(work / "gpu.json"), "DDTREE_LAB_GPU_REGISTRY": str(work / "reg"),
           "DDTREE_LAB_FAULTS": str(work / "faults"), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    return [sys.executable, "-c", launch, *argv[3:]], env


# ------------------------------------------------------------------ gate, smoke, load


def gate(server: Server, host: Any) -> dict[str, Any]:
    """The deploy gate's state machine on this server; kills the scheduler mid-window if asked."""
    from ddtree_ops import gate as g
    from ddtree_ops.diagnose.classify import Scanner
    from ddtree_ops.host import HttpUnavailable
    from ddtree_ops.observe import JournalLine

    p, mode = server.profile, server.sc.mode
    cfg = g.GateConfig(deadline_s=p.gate.startup_deadline_s, stay_s=p.gate.stay_healthy_s,
                       poll_s=p.gate.poll_interval_s, http_timeout_s=p.gate.http_timeout_s,
                       speculative=g.is_speculative(p, mode))
    state = g.GateState(cfg, Scanner())
    killed = ""
    while True:
        t = time.monotonic() - server.started
        lines = [JournalLine(m) for m in server.new_lines()]
        unit = server.unit()
        health, err, smoke = None, "", None
        if server.alive():
            try:
                health = host.http("GET", server.port, "/health_generate", timeout=5.0).status
            except HttpUnavailable as exc:
                err = str(exc)
            if state.phase is g.Phase.SMOKE or (state.phase is g.Phase.STARTING and health == 200):
                smoke = g.smoke_request(host, p, speculative=cfg.speculative, timeout=cfg.http_timeout_s)
        status = state.step(g.Observation(t, unit, lines, health, err, smoke))
        if (server.sc.kill_in_stay and state.phase is g.Phase.STAY and not killed and state.stay_from is not None
                and t - state.stay_from >= server.sc.kill_in_stay):
            killed = server.kill_scheduler()
            say(f"{server.sc.name}: {killed}")
            server.result["killed_at_s"] = round(t, 2)
        if status is not g.Status.WAIT:
            break
        time.sleep(cfg.poll_s)
    out = {"status": state.status.value, "reason": state.reason, "elapsed_s": round(time.monotonic() - server.started, 2),
           "ready_s": state.ready_at, "smoke": state.smoke.__dict__ if state.smoke else None}
    if killed:
        out["verdict_after_kill_s"] = round(out["elapsed_s"] - server.result["killed_at_s"], 2)
    if state.fatal is not None:
        out["fatal"] = {"label": state.fatal.label, "text": state.fatal.text.strip()[:300]}
    say(f"GATE {server.sc.name}: {out['status']} in {out['elapsed_s']}s: {out['reason'][:160]}")
    return out


def smoke_check(server: Server, host: Any) -> dict[str, Any]:
    """`smoke`'s own probes, parsers and judge against the live server. Without systemd here the
    unit part of the observation is the process, as in the gate."""
    from dataclasses import replace

    from ddtree_ops import smoke

    obs = smoke.observe_host(host, server.profile)
    if obs.unit is None:
        obs = replace(obs, unit=server.unit(), unit_error="")
    res = smoke.judge(obs, server.profile.smoke)
    line = smoke.status_line([res])
    say(f"SMOKE {server.sc.name}: {line}")
    return {"status_line": line, "exit": int(res.status_code) if hasattr(res, "status_code") else None,
            "algorithm": obs.algorithm, "server_accept_len": obs.server_accept_len,
            "metrics_accept_len": obs.metrics_accept_len}


def fetch(host: Any, port: int, path: str) -> str:
    from ddtree_ops.host import HttpUnavailable

    try:
        return host.http("GET", port, path, timeout=10).text
    except HttpUnavailable as exc:
        return f"unavailable: {exc}"


def throughput(host: Any, port: int, batch: int, tokens: int) -> float:
    """Decode tokens per second for `batch` concurrent greedy requests of `tokens` each."""
    body = {"text": "The capital of France is", "sampling_params": {"temperature": 0, "max_new_tokens": tokens,
                                                                   "ignore_eos": True}}
    done: list[int] = []

    def one() -> None:
        resp = host.http("POST", port, "/generate", body=body, timeout=300)
        done.append(int(json.loads(resp.body)["meta_info"]["completion_tokens"]))

    t = time.monotonic()
    with cf.ThreadPoolExecutor(batch) as pool:
        list(pool.map(lambda _: one(), range(batch)))
    return sum(done) / (time.monotonic() - t)


def shadow_tax(servers: list[Server], host: Any, reps: int, tokens: int) -> dict[str, Any]:
    """DFLASH and DDTREE shadow arms on the same settings, measured in turns so drift hits all arms."""
    arms = [s for s in servers if s.sc.tax_arm and s.result.get("gate", {}).get("status") == "pass"]
    table: dict[str, dict[str, list[float]]] = {s.sc.tax_arm: {"1": [], "8": []} for s in arms}
    for batch in (1, 8):
        for s in arms:                              # warm-up: graphs and allocator at this batch size
            throughput(host, s.port, batch, 64)
        for rep in range(reps):
            order = arms[rep % len(arms):] + arms[:rep % len(arms)]
            for s in order:
                table[s.sc.tax_arm][str(batch)].append(round(throughput(host, s.port, batch, tokens), 1))
    say(f"TAX {json.dumps(table)}")
    return table


# ------------------------------------------------------------------ groups


def profile_for(sc: Scenario, port: int, shared_gpu: bool) -> Any:
    from ddtree_ops.profile import load_profile

    sets = [f"service.port={port}", f"service.unit=sglang-{sc.name}.service",
            *(x.replace(str(DEFAULT_ROOT), str(ROOT)) for x in sc.sets)]
    if shared_gpu:
        extra = [*load_profile("h200", overrides=sets).service.extra_args, *SHARED_GPU_CAP]
        sets.append("service.extra_args=" + json.dumps(extra))
    return load_profile("h200", overrides=sets)


def run_group(name: str, out: Path, host: Any, standin: bool, args: argparse.Namespace, port0: int) -> list[Server]:
    scenarios = [sc for sc in GROUPS[name] if not args.only or sc.name in args.only]
    if not scenarios:
        return []
    servers = [Server(sc, profile_for(sc, port0 + i, shared_gpu=name not in ("memory", "refusals")),
                      out / f"{sc.name}.log") for i, sc in enumerate(scenarios)]
    if name == "refusals":
        # every verdict first (no refused server on the GPU while another preflight reads it), then
        # the three servers at once
        with cf.ThreadPoolExecutor(len(servers)) as pool:
            verdicts = list(pool.map(lambda s: refusal_verdict(s, host, say), servers))
            started = list(pool.map(lambda s: refused_anyway(s, standin, say), servers))
        for s, verdict, run in zip(servers, verdicts, started):
            s.result["refusal"] = {**verdict, **run}
        return servers
    if name == "memory":
        gpu_facts(host, out / "gpu_facts.txt")
        for s in servers:
            if time.monotonic() - T0 > args.budget_s:
                s.result["skipped"] = "past the budget"
                continue
            gpu_idle(host)
            s.result["memory"] = memory_probe(s, host, standin, out / "memory_probes", say)
        return servers
    for s in servers:
        s.start(standin)
    with cf.ThreadPoolExecutor(len(servers)) as pool:
        gates = dict(zip([s.sc.name for s in servers], pool.map(lambda s: gate(s, host), servers)))
    for s in servers:
        s.result["gate"] = gates[s.sc.name]
        if s.alive() and s.result["gate"]["status"] == "pass":
            s.result["smoke"] = smoke_check(s, host)
            for _ in range(s.sc.extra_requests):
                throughput(host, s.port, 8, 64)
    if name == "serve":
        time.sleep(0.5)
        summary_tax = shadow_tax(servers, host, args.reps, args.tokens)
        for s in servers:
            s.result["shadow_tax"] = summary_tax
    for s in servers:
        if s.alive():
            s.result["server_info"] = fetch(host, s.port, "/server_info")[:4000]
            metrics = fetch(host, s.port, "/metrics")
            s.result["metrics_ddtree"] = [ln for ln in metrics.splitlines() if ln.startswith("ddtree_shadow")]
            s.result["metrics_spec"] = [ln for ln in metrics.splitlines() if "spec_accept" in ln and not ln.startswith("#")]
            if s.sc.extra_requests:
                s.result["smoke_after_load"] = smoke_check(s, host)
            if s.sc.cli_smoke:
                s.result["cli_smoke"] = cli(["smoke", "h200", "--json", "--set", f"service.port={s.port}",
                                             "--state-dir", str(ROOT / "smoke-state"),
                                             "--lock-file", str(ROOT / "smoke.lock")])
    time.sleep(1.0)      # the last report lines reach the log before the stop
    with cf.ThreadPoolExecutor(len(servers)) as pool:
        list(pool.map(lambda s: s.stop(), servers))
    say(f"STOPPED {name}")
    return servers


def cli(args: list[str]) -> dict[str, Any]:
    """The command an operator on the GPU host would type (local transport), as a subprocess."""
    proc = subprocess.run([sys.executable, "-m", "ddtree_ops", *args], capture_output=True, text=True, timeout=240)
    say(f"CLI ddtree-ops {' '.join(args[:2])}: exit {proc.returncode}")
    return {"argv": args, "exit": proc.returncode, "stdout": proc.stdout[-6000:], "stderr": proc.stderr[-3000:]}


def diagnose(server: Server) -> dict[str, Any]:
    from ddtree_ops.diagnose.classify import classify

    rep = classify(server.text().splitlines())
    rc = rep.root_cause
    return {"verdict": rep.verdict, "label": rc.label if rc else None,
            "evidence": (rc.evidence if rc else "")[:300]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="real SGLang scenarios on the lent H200")
    ap.add_argument("groups", nargs="+", choices=sorted(GROUPS))
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--standin", action="store_true", help="dry run here with the lab's SGLang stand-in")
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--budget-s", type=float, default=540.0, help="skip a group that would start after this")
    ap.add_argument("--only", type=lambda v: set(v.split(",")), default=set(), metavar="NAME,...",
                    help="run only these scenarios of the groups named")
    ap.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="working directory (models, site, profiles)")
    ap.add_argument("--port", type=int, default=31000, help="first service port")
    args = ap.parse_args(argv)
    global ROOT, SITE
    ROOT, SITE = args.root, args.root / "site"
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    info = setup(args.standin)
    from ddtree_ops.local import LocalHost

    host = LocalHost("h200")
    summary: dict[str, Any] = {"environment": info, "groups": {}, "skipped": []}
    summary["plugin_check"] = cli(["engine", "plugin-check", "--json"])
    port = args.port
    for name in args.groups:
        if time.monotonic() - T0 > args.budget_s:
            summary["skipped"].append(name)
            say(f"SKIP {name}: past the budget")
            continue
        try:
            servers = run_group(name, logs, host, args.standin, args, port)
        except Exception as exc:          # keep what the other groups found
            import traceback

            summary["groups"][name] = {"error": traceback.format_exc()}
            say(f"ERROR {name}: {exc}")
            continue
        port += 20
        for s in servers:
            if s.log.exists():                 # a probe skipped past the budget left no log
                s.result["diagnose"] = diagnose(s)
            s.result["expect_label"] = s.sc.label
        summary["groups"][name] = {s.sc.name: s.result for s in servers}
        bundle(args.out, logs, summary)        # after every group: a call cut off keeps what it did
    bundle(args.out, logs, summary)
    shutil.rmtree(logs)
    say(f"done: {args.out / 'realsglang.tar.gz'}")
    return 0


def bundle(out: Path, logs: Path, summary: dict[str, Any]) -> None:
    summary["wall_s"] = round(time.monotonic() - T0, 1)
    (logs / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    tmp = out / "realsglang.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(logs, arcname="realsglang")
    tmp.replace(out / "realsglang.tar.gz")


if __name__ == "__main__":
    sys.exit(main())
