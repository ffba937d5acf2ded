"""Servers that run side by side on the one GPU for a measurement (the tax and truth groups).

`run.py` owns the machine set-up (the wheel set, the plugin wheel built from this tree, the
models, the profiles) and the `Server` process wrapper; this module starts a list of scenarios
together with extra flags, waits until each answers `/health_generate`, sends requests, reads
what each says about speculation, and stops them the way systemd would. The measurement groups
skip the deploy gate: what they need is a ready server, and the 8B shape's tiny tokenizer makes
the gate's smoke text empty (docs/realsglang.md).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402  (bench/realsglang/run.py: set-up, Server, bundle)
from scenarios import Scenario  # noqa: E402

REPORT = re.compile(r"DDTREE shadow: rounds=(\d+) sampled=(\d+) tau_chain=([\d.]+) tau_tree=(\S+) "
                    r"tau_tree_lower=([\d.]+) cost_ratio=(\S+) sibling_hits=\[([\d, ]*)\] recommendation=(\S+)"
                    r"(?: cost_from=(\S+) dropped=(\d+))?")


def common_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--standin", action="store_true", help="dry run here with the lab's SGLang stand-in")
    ap.add_argument("--root", type=Path, default=run.DEFAULT_ROOT, help="working directory (models, site, profiles)")
    ap.add_argument("--port", type=int, default=31100, help="first service port")
    ap.add_argument("--budget-s", type=float, default=400.0, help="wall-clock budget of the whole call")


def init(args: argparse.Namespace, group: str) -> tuple[Any, dict[str, Any], Path]:
    """run.py's set-up under --root; returns (local host, environment facts, logs directory). The
    logs are kept under --root, not $OUT: at most 8 files come back from a call, so only the
    bundle, the JSON and the console go there."""
    import shutil

    run.ROOT, run.SITE = args.root, args.root / "site"
    args.out.mkdir(parents=True, exist_ok=True)
    logs = args.root / f"logs-{group}" / "realsglang"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True, exist_ok=True)
    info = run.setup(args.standin)
    from ddtree_ops.local import LocalHost

    return LocalHost("h200"), info, logs


def say(msg: str) -> None:
    run.say(msg)


def elapsed() -> float:
    return time.monotonic() - run.T0


def profile(sc: Scenario, port: int, extra: tuple[str, ...], drop: tuple[str, ...] = ()) -> Any:
    """The h200 profile with the scenario's overrides, its port and unit, and `extra` flags
    appended to service.extra_args (`drop`: flags removed with their value)."""
    from ddtree_ops.profile import load_profile

    sets = [f"service.port={port}", f"service.unit=sglang-{sc.name}.service",
            *(x.replace(str(run.DEFAULT_ROOT), str(run.ROOT)) for x in sc.sets)]
    base = list(load_profile("h200", overrides=sets).service.extra_args)
    for flag in drop:
        if flag in base:
            i = base.index(flag)
            del base[i:i + 2]
    sets.append("service.extra_args=" + json.dumps(base + list(extra)))
    return load_profile("h200", overrides=sets)


def start_all(scenarios: list[Scenario], logs: Path, port0: int, standin: bool, extra: tuple[str, ...],
              drop: tuple[str, ...] = ()) -> list[run.Server]:
    servers = [run.Server(sc, profile(sc, port0 + i, extra, drop), logs / f"{sc.name}.log")
               for i, sc in enumerate(scenarios)]
    for s in servers:
        s.start(standin)
    return servers


def wait_ready(servers: list[run.Server], host: Any, deadline_s: float) -> None:
    """Poll every server's /health_generate until 200, its death, or the deadline; records
    `gate` = {status, ready_s, smoke} in the form run.py's summaries have."""
    from ddtree_ops.host import HttpUnavailable

    waiting = list(servers)
    end = time.monotonic() + deadline_s
    while waiting and time.monotonic() < end:
        for s in list(waiting):
            if not s.alive():
                s.result["gate"] = {"status": "died", "ready_s": None, "smoke": None,
                                    "reason": s.text().strip().splitlines()[-1][:300] if s.text().strip() else ""}
                say(f"DIED {s.sc.name}")
                waiting.remove(s)
                continue
            try:
                ok = host.http("GET", s.port, "/health_generate", timeout=5.0).status == 200
            except HttpUnavailable:
                ok = False
            if ok:
                t = round(time.monotonic() - s.started, 1)
                s.result["gate"] = {"status": "ready", "ready_s": t, "smoke": {"served": True}}
                say(f"READY {s.sc.name} in {t}s")
                waiting.remove(s)
        time.sleep(1.0)
    for s in waiting:
        s.result["gate"] = {"status": "timeout", "ready_s": None, "smoke": None}
        say(f"NOT READY {s.sc.name} after {deadline_s:.0f}s")


def ready(servers: list[run.Server]) -> list[run.Server]:
    return [s for s in servers if s.result.get("gate", {}).get("status") == "ready" and s.alive()]


def generate(host: Any, port: int, bodies: list[dict[str, Any]], timeout: float = 300.0) -> tuple[list[dict[str, Any]], float]:
    """The bodies as concurrent /generate requests; (their meta_info, wall seconds)."""
    def one(body: dict[str, Any]) -> dict[str, Any]:
        resp = host.http("POST", port, "/generate", body=body, timeout=timeout)
        return json.loads(resp.body)["meta_info"]

    t = time.monotonic()
    with cf.ThreadPoolExecutor(max(1, len(bodies))) as pool:
        metas = list(pool.map(one, bodies))
    return metas, time.monotonic() - t


def speculation(host: Any, s: run.Server) -> dict[str, Any]:
    """What the server says of its speculation: /server_info's cumulative accept length,
    /metrics' last interval and the plugin's gauges, the log's last shadow report."""
    out: dict[str, Any] = {}
    try:
        info = json.loads(run.fetch(host, s.port, "/server_info"))
        states = info.get("internal_states") or [{}]
        out["server_info_accept_len"] = states[0].get("avg_spec_accept_length")
    except (ValueError, TypeError):
        out["server_info_accept_len"] = None
    metrics = run.fetch(host, s.port, "/metrics")
    out["metrics_spec"] = [ln for ln in metrics.splitlines() if "spec_accept" in ln and not ln.startswith("#")]
    out["metrics_ddtree"] = [ln for ln in metrics.splitlines() if ln.startswith("ddtree_shadow")]
    out["shadow"] = last_report(s.text())
    return out


def last_report(text: str) -> dict[str, Any] | None:
    found = list(REPORT.finditer(text))
    if not found:
        return None
    m = found[-1]
    num = lambda v: None if v in (None, "n/a") else float(v)  # noqa: E731
    return {"rounds": int(m.group(1)), "sampled": int(m.group(2)), "tau_chain": float(m.group(3)),
            "tau_tree": num(m.group(4)), "tau_tree_lower": float(m.group(5)), "cost_ratio": num(m.group(6)),
            "sibling_hits": [int(x) for x in m.group(7).split(",") if x.strip()],
            "recommendation": m.group(8), "cost_from": m.group(9),
            "dropped": int(m.group(10)) if m.group(10) else None, "line": m.group(0)}


def bundle(out: Path, logs: Path, summary: dict[str, Any], name: str) -> None:
    """Every log and summary.json as one tar in $OUT (`name`), rewritten whole each time."""
    import tarfile

    summary["wall_s"] = round(elapsed(), 1)
    (logs / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    tmp = out / f"{name}.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(logs, arcname="realsglang")
    tmp.replace(out / name)


def stop_all(servers: list[run.Server]) -> None:
    time.sleep(1.0)          # the last report lines reach the log before the stop
    with cf.ThreadPoolExecutor(max(1, len(servers))) as pool:
        list(pool.map(lambda s: s.stop(), servers))


def write_json(path: Path, doc: Any) -> None:
    """Atomic: a call cut off mid-write leaves the previous version."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


def gpu_name(info: dict[str, Any]) -> str:
    smi = str(info.get("nvidia-smi", ""))
    return smi.split(",")[0].strip() if smi and "unavailable" not in smi else "unknown"


def sglang_version(info: dict[str, Any], standin: bool) -> str:
    version = (info.get("versions") or {}).get("sglang")
    if version:
        return str(version)
    if standin:
        import sglang

        return f"{sglang.__version__} (lab stand-in)"
    return "unknown"
