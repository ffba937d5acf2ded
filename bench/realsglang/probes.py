"""The memory probes and the refusals of bench/realsglang/run.py: what each does with one server.

`server` is run.py's `Server` (start, stop, alive, text, log, result, profile, sc); `say` its
timestamped progress line. Kept apart from the runner so the probes' concern (a probe file per
start in the layout of bench/results/memory_probes/, preflight's verdict then SGLang's own
failure) reads on its own.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

from scenarios import REFUSAL_WAIT_S

Say = Callable[[str], None]
KV_TOKENS = re.compile(r"KV Cache is allocated\. .*#tokens: (\d+)")

# SGLang's own lines about the pool, kept verbatim in each probe file (bench/results/memory_probes/)
MEMORY_LINE = re.compile(r"Init torch distributed ends|Load weight (begin|end)\.|KV Cache is allocated\.|"
                         r"Memory pool end\.|max_total_num_tokens=|Loaded weights leave no GPU memory|"
                         r"Not enough memory")
POOLS_DONE = re.compile(r"max_total_num_tokens=\d+")


def without_speculation(argv: list[str]) -> list[str]:
    """The rendered launch line of a service without speculative decoding: every --speculative-*
    flag and its value dropped (the profile has no plain mode; the probes without a draft need one)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg.startswith("--speculative-"):
            skip = "=" not in arg
        else:
            out.append(arg)
    return out


def gpu_idle(host: Any, timeout: float = 20.0) -> int | None:
    """Wait until no process holds GPU memory (the last probe's server is gone, its memory freed),
    so the next probe's preflight reads what SGLang will find. Returns the free MiB then."""
    from ddtree_ops.gpu import snapshot

    deadline = time.monotonic() + timeout
    while True:
        snap = snapshot(host, sys.executable)
        if not snap.gpus:
            return None
        if not snap.apps or time.monotonic() > deadline:
            return snap.gpus[0].memory_free_mib
        time.sleep(0.5)


def gpu_facts(host: Any, path: Path) -> None:
    """The raw outputs preflight's GPU probe parses, captured once on the device (the card modes,
    the driver's CUDA, the probe's own JSON through NVML): test data for the parsers."""
    from ddtree_ops.gpu import PROBE

    parts = []
    for argv in (["nvidia-smi", "--query-gpu=index,uuid,name,memory.total,memory.used,memory.free,compute_cap,"
                  "driver_version", "--format=csv,noheader,nounits"],
                 ["nvidia-smi", "--query-gpu=index,pci.bus_id,mig.mode.current,mig.mode.pending,compute_mode",
                  "--format=csv,noheader,nounits"],
                 ["nvidia-smi", "--version"], ["nvidia-smi"], [sys.executable, "-c", PROBE]):
        res = host.run(argv, timeout=60)
        label = " ".join(argv[:2]) if argv[0] != sys.executable else "python -c gpu.PROBE"
        parts.append(f"$ {label}\n# exit {res.rc}\n{res.stdout}{res.stderr}")
    path.write_text("\n".join(parts))


def memory_probe(server: Any, host: Any, standin: bool, probes: Path, say: Say) -> dict[str, Any]:
    """Preflight's memory fit on the live GPU, then the pool SGLang allocates, then stop; writes
    the probe file (settings, the free memory preflight read, its prediction, SGLang's own lines)
    and a copy of the log under `probes`, the layout of bench/results/memory_probes/."""
    from ddtree_ops import memory
    from ddtree_ops.preflight import memory_preflight
    from ddtree_ops.profile import DDTreeShadowMode, DflashMode

    p, mode = server.profile, server.sc.mode
    pf = memory_preflight(host, p, mode)
    target_dir = Path(p.service.model_path)
    target_cfg = json.loads((target_dir / "config.json").read_text())
    index_path = target_dir / "model.safetensors.index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else None
    cfg = p.mode(mode)
    draft_path = None if server.sc.plain else cfg.draft_model_path
    draft_cfg = json.loads((Path(draft_path) / "config.json").read_text()) if draft_path else None
    gpu = pf.gpu.gpus[0] if pf.gpu and pf.gpu.gpus else None
    settings = {
        "model": target_dir.name, "draft": Path(draft_path).name if draft_path else None,
        "algorithm": cfg.algorithm if draft_path and isinstance(cfg, (DflashMode, DDTreeShadowMode)) else None,
        "mem_fraction_static": p.memory.mem_fraction_static, "tp": p.sizes.tp_size, "cards": max(len(pf.cards), 1),
        "kv_cache_dtype": p.memory.kv_cache_dtype, "page_size": p.memory.page_size,
        "context_length": p.memory.context_length, "max_running_requests": p.memory.max_running_requests,
        "gpu": gpu.name if gpu else None, "gpu_total_mib": gpu.memory_total_mib if gpu else p.gpu.memory_mib,
        "target_config": target_cfg,
        "target_index_total_size": (index or {}).get("metadata", {}).get("total_size"),
        "draft_config": draft_cfg,
    }
    # the plain probes have no draft: their prediction is the same formula without it
    plan = pf.memory if draft_path or pf.memory is None or pf.free_mib is None else memory.plan_from_configs(
        target_cfg, index=index, gpu_total_mib=settings["gpu_total_mib"], free_mib=pf.free_mib,
        mem_fraction_static=p.memory.mem_fraction_static, context_length=p.memory.context_length,
        concurrency=p.memory.max_running_requests, kv_cache_dtype=p.memory.kv_cache_dtype,
        page_size=p.memory.page_size, tp=p.sizes.tp_size)
    out: dict[str, Any] = {"mfs": p.memory.mem_fraction_static, "model": target_dir.name, "draft": settings["draft"],
                           "predicted_tokens": plan.tokens if plan else None, "free_mib": pf.free_mib,
                           "checks": {c.name: c.status for c in pf.checks}}
    server.start(standin)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not POOLS_DONE.search(server.text()) and server.alive():
        time.sleep(0.5)
    server.stop(timeout=20)
    text = server.text()
    lines = [ln for ln in text.splitlines() if MEMORY_LINE.search(ln)]
    m = KV_TOKENS.search(text)
    real = int(m.group(1)) if m else None
    out["real_tokens"] = real
    if real and plan and plan.tokens:
        out["error_pct"] = round(100.0 * (plan.tokens - real) / real, 2)
    settings["argv"] = server.result.get("argv")
    date = time.strftime("%Y-%m-%d", time.gmtime())
    stem = f"{date}_{server.sc.name}"
    probe = {
        "schema": 1, "probe": server.sc.name, "about": server.sc.about, "date": date,
        "server": "lab stand-in (not SGLang)" if standin else f"sglang {_installed('sglang')}",
        "machine": {"gpu": settings["gpu"], "driver": pf.gpu.driver if pf.gpu else None,
                    "python": sys.version.split()[0]},
        "ddtree_ops": _installed("ddtree-ops"),
        "settings": settings,
        "preflight": {"free_mib": pf.free_mib, "gpu_source": pf.gpu.source if pf.gpu else None,
                      "predicted_tokens": out["predicted_tokens"],
                      "memory_check": next((c.detail for c in pf.checks if c.name == "memory"), None),
                      "checks": out["checks"]},
        "sglang_lines": lines, "exit": server.result.get("exit"), "log": f"{stem}.log",
    }
    probes.mkdir(parents=True, exist_ok=True)
    (probes / f"{stem}.json").write_text(json.dumps(probe, indent=1) + "\n")
    shutil.copy(server.log, probes / f"{stem}.log")
    say(f"MEMORY {server.sc.name}: predicted {out['predicted_tokens']} real {real} ({out.get('error_pct')}%)")
    return out


def _installed(dist: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


# ------------------------------------------------------------------ refusals


def refusal_verdict(server: Any, host: Any, say: Say) -> dict[str, Any]:
    """Preflight's verdict on settings it must refuse (the full preflight a deploy runs)."""
    from ddtree_ops.preflight import run_preflight
    from ddtree_ops.releases import Layout
    from ddtree_ops.render import render

    p, mode = server.profile, server.sc.mode
    t = time.monotonic()
    pf = run_preflight(host, p, mode, render(p, mode), Layout.for_service(p.service.state_dir, p.service.unit), "")
    failed = [{"name": c.name, "detail": c.detail} for c in pf.failed]
    key = server.sc.refuse_key
    out: dict[str, Any] = {"preflight_s": round(time.monotonic() - t, 1), "refused": not pf.ok, "failed": failed,
                           "names_key": any(key in c["detail"] for c in failed), "key": key,
                           "checks": {c.name: c.status for c in pf.checks}}
    say(f"REFUSAL {server.sc.name}: preflight {'refused' if not pf.ok else 'PASSED'}"
        f"{'' if out['names_key'] else f' without naming {key}'}: {'; '.join(c['name'] for c in failed)}")
    return out


def refused_anyway(server: Any, standin: bool, say: Say) -> dict[str, Any]:
    """The real server started with the same rendered argv (what a hand-edited unit would do),
    stopped when it dies or after REFUSAL_WAIT_S: its log is SGLang's own failure, for diagnose."""
    server.start(standin)
    deadline = time.monotonic() + REFUSAL_WAIT_S
    while server.alive() and time.monotonic() < deadline:
        time.sleep(0.5)
    out: dict[str, Any] = {"server_died": not server.alive(), "server_s": round(time.monotonic() - server.started, 1)}
    server.stop(timeout=10)
    out["exit"] = server.result.get("exit")
    say(f"REFUSAL {server.sc.name}: server {'died' if out['server_died'] else 'still up, stopped'} "
        f"after {out['server_s']}s (exit {out['exit']})")
    return out
