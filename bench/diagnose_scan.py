"""Scan throughput of `diagnose` against `grep -E -f`, on three journals, in one run.

    python bench/diagnose_scan.py [--size-mb 200] [--flood-mb 100] [--worst-mb 20] [--runs 5]
    python bench/diagnose_scan.py --table        # the table, from bench/results/diagnose_scan.json

Journals in journald `short` format, generated here (seeded):
  - realistic: mostly healthy SGLang serving lines (decode and prefill reports with accept lengths,
    uvicorn access lines, health checks), rare benign warnings and request tracebacks, and one
    real failure (a CUDA OOM in the scheduler) near the end;
  - flood: an overloaded server, 20% of the lines "KV cache pool is full. Retract requests"
    warnings and rejected requests, the same planted failure;
  - worst case: request tracebacks whose exception messages are all different.
For each, in the same run and interleaved (so a change of load on a shared machine hits all of
them alike): `grep -E -c -f` with a handful of signature strings in the default locale and in
LC_ALL=C, the classifier in one process (`classify_stream`) with each keyword screen available
(Hyperscan where the package is installed, and the stdlib screen), and the classifier with its
screen in worker processes (`classify_path`), and the whole command an operator types
(`ddtree-ops diagnose --log FILE --json`, a process of its own: start-up included, as grep's is).
Every classifier run must give the same report, with the planted failure at its line.

Start-up (issue 31: at most 0.2 s): the whole command on a one-line log, interleaved with the
interpreter alone, `ddtree-ops --help`, and the command with an empty disk cache (what a first run
on a machine pays). The whole-process arms run as an installed tool does: bytecode cached
(PYTHONDONTWRITEBYTECODE unset, PYTHONPYCACHEPREFIX in a temporary directory, one warm-up run) and
the catalogue's disk cache in a temporary DDTREE_OPS_CACHE; the same command without a bytecode
cache (a source tree under PYTHONDONTWRITEBYTECODE=1) is measured beside them.

Each run's wall-clock and CPU seconds go to bench/results/diagnose_scan.json (raw); `--table`
prints the table from that file, and the run writes it to bench/results/diagnose.md too (its
corpus section, written by bench/diagnose_corpus.py, is kept).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import json  # noqa: E402

from ddtree_ops.diagnose import screen as screens  # noqa: E402
from ddtree_ops.diagnose.catalogue import parse_catalogue, screen_for  # noqa: E402
from ddtree_ops.diagnose.classify import classify_path, classify_stream, load_catalogue  # noqa: E402

RESULTS = REPO / "bench" / "results" / "diagnose_scan.json"

MONTHS = ("Jan", "Feb", "Mar")
BENIGN = (
    "Using default MoE kernel config. Performance might be sub-optimal! Config file not found at "
    "/opt/venv/lib/python3.11/site-packages/sglang/srt/layers/moe/fused_moe_triton/configs/E=128,N=768.json",
    "Endpoint '/get_model_info' is deprecated and will be removed in a future version. Please use '/model_info' instead.",
    "Disable prefill CUDA graph because the capture size is not set",
    "KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_token_ratio: 0.4000 -> 0.6000",
)
REQUEST_TRACEBACK = [
    "ERROR:    Exception in ASGI application",
    "Traceback (most recent call last):",
    '  File "/opt/venv/lib/python3.11/site-packages/sglang/srt/entrypoints/http_server.py", line 612, in generate_request',
    "    ret = await _global_state.tokenizer_manager.generate_request(obj, request).__anext__()",
    "ValueError: The input (40210 tokens) is longer than the model's context length (32768 tokens).",
]
FAILURE = [
    "Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/opt/venv/lib/python3.11/site-packages/sglang/srt/managers/scheduler.py", line 6350, in run_scheduler_process',
    "    scheduler.event_loop_overlap()",
    '  File "/opt/venv/lib/python3.11/site-packages/torch/nn/functional.py", line 1704, in softmax',
    "    ret = input.softmax(dim, dtype=dtype)",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 47.54 GiB "
    "of which 1.12 GiB is free. Including non-PyTorch memory, this process has 46.41 GiB memory in use.",
    "",
    "Received sigquit from a child process. It usually means the child failed.",
]


def generate(path: Path, size_mb: int, seed: int = 7) -> tuple[int, int]:
    """Writes the journal; returns (bytes, 1-based line number of the planted failure's cause)."""
    rng = random.Random(seed)
    target = size_mb * 1_000_000
    written = 0
    lineno = 0
    failure_line = 0
    planted = False
    pid = 41231
    with path.open("w", encoding="utf-8") as out:
        t = 0
        while written < target or not planted:
            t += 1
            s = t // 40
            stamp = f"{MONTHS[(s // 86400) % 3]} {1 + (s // 86400) % 28:2d} {s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d}"
            prefix = f"{stamp} ct129 sglang-ddtree[{pid}]: "
            sg = f"[2026-01-{1 + (s // 86400) % 28:02d} {s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d}"
            r = rng.random()
            lines: list[str]
            if not planted and written > target * 0.97:
                lines = [f"{sg} TP0] {FAILURE[0]}", *FAILURE[1:]]
                failure_line = lineno + 6
                planted = True
            elif r < 0.52:
                n = rng.randint(1, 8)
                lines = [f"{sg} TP0] Decode batch, #running-req: {n}, #token: {rng.randint(100, 90000)}, token usage: "
                         f"{rng.random():.2f}, accept len: {rng.uniform(1.6, 4.8):.2f}, accept rate: {rng.random():.2f}, "
                         f"cuda graph: {'True' if n < 8 else 'False'}, gen throughput (token/s): {rng.uniform(40, 900):.2f}, "
                         f"#queue-req: 0, "]
            elif r < 0.66:
                lines = [f"{sg} TP0] Prefill batch, #new-seq: 1, #new-token: {rng.randint(10, 4000)}, #cached-token: "
                         f"{rng.randint(0, 4000)}, token usage: {rng.random():.2f}, #running-req: {rng.randint(0, 7)}, "
                         "#queue-req: 0, #pending-token: 0, "]
            elif r < 0.93:
                path_ = rng.choice(("/generate", "/v1/chat/completions", "/v1/completions"))
                lines = [f'{sg}] INFO:     127.0.0.1:{rng.randint(30000, 60000)} - "POST {path_} HTTP/1.1" 200 OK']
            elif r < 0.9985:
                lines = [f'{sg}] INFO:     127.0.0.1:{rng.randint(30000, 60000)} - "GET /health_generate HTTP/1.1" 200 OK']
            elif r < 0.9995:
                lines = [f"{sg} TP0] {rng.choice(BENIGN)}"]
            else:
                lines = [f"{sg}] {REQUEST_TRACEBACK[0]}", *REQUEST_TRACEBACK[1:]]
            for ln in lines:
                text = prefix + ln + "\n"
                out.write(text)
                written += len(text.encode())
                lineno += 1
    return written, failure_line


FLOOD_RETRACT = ("KV cache pool is full. Retract requests. #retracted_reqs: {n}, #new_tokens_gained: {g}, "
                 "#new_token_ratio: {a:.4f} -> {b:.4f}")
FLOOD_ERROR = "[http_server] Error: The input ({n} tokens) is longer than the model's context length (32768 tokens)."


def generate_flood(path: Path, size_mb: int, seed: int = 11) -> tuple[int, int]:
    """An overloaded server: 20% of the lines are KV-retract warnings and rejected requests (with
    their 400 access lines), the rest serving lines; one CUDA OOM near the end."""
    rng = random.Random(seed)
    target = size_mb * 1_000_000
    written = lineno = failure_line = 0
    planted = False
    with path.open("w", encoding="utf-8") as out:
        t = 0
        while written < target or not planted:
            t += 1
            s = t // 40
            stamp = f"Jan {1 + (s // 86400) % 28:2d} {s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d}"
            prefix = f"{stamp} ct129 sglang-ddtree[41231]: "
            sg = f"[2026-01-{1 + (s // 86400) % 28:02d} {s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d}"
            r = rng.random()
            if not planted and written > target * 0.97:
                lines = [f"{sg} TP0] {FAILURE[0]}", *FAILURE[1:]]
                failure_line = lineno + 6
                planted = True
            elif r < 0.10:
                a = rng.uniform(0.1, 0.9)
                lines = [f"{sg} TP0] " + FLOOD_RETRACT.format(n=rng.randint(1, 16), g=rng.randint(100, 90000), a=a,
                                                               b=min(1.0, a + 0.2))]
            elif r < 0.15:
                lines = [f"{sg}] " + FLOOD_ERROR.format(n=rng.randint(32769, 200000))]
            elif r < 0.20:
                lines = [f'{sg}] INFO:     127.0.0.1:{rng.randint(30000, 60000)} - "POST /v1/chat/completions HTTP/1.1" 400 Bad Request']
            elif r < 0.62:
                n = rng.randint(1, 48)
                lines = [f"{sg} TP0] Decode batch, #running-req: {n}, #token: {rng.randint(100, 90000)}, token usage: "
                         f"{rng.uniform(0.9, 1.0):.2f}, accept len: {rng.uniform(1.6, 4.8):.2f}, accept rate: {rng.random():.2f}, "
                         f"cuda graph: {'True' if n < 8 else 'False'}, gen throughput (token/s): {rng.uniform(40, 900):.2f}, "
                         f"#queue-req: {rng.randint(20, 400)}, "]
            elif r < 0.75:
                lines = [f"{sg} TP0] Prefill batch, #new-seq: 1, #new-token: {rng.randint(10, 4000)}, #cached-token: "
                         f"{rng.randint(0, 4000)}, token usage: {rng.uniform(0.9, 1.0):.2f}, #running-req: {rng.randint(0, 47)}, "
                         f"#queue-req: {rng.randint(20, 400)}, #pending-token: 0, "]
            else:
                lines = [f'{sg}] INFO:     127.0.0.1:{rng.randint(30000, 60000)} - "POST /generate HTTP/1.1" 200 OK']
            for ln in lines:
                text = prefix + ln + "\n"
                out.write(text)
                written += len(text.encode())
                lineno += 1
    return written, failure_line


def generate_worst(path: Path, size_mb: int, seed: int = 13) -> tuple[int, int]:
    """The worst input found: nothing but request tracebacks, each exception line a message shape
    never seen before (no memoised decision applies; every line is read in Python)."""
    rng = random.Random(seed)
    target = size_mb * 1_000_000
    words = ["tensor", "shape", "index", "batch", "token", "cache", "slot", "rank", "stream", "page"]
    written = lineno = 0
    with path.open("w", encoding="utf-8") as out:
        while written < target:
            msg = " ".join(rng.choice(words) + rng.choice("abcdefghijklmnopqrstuvwxyz") * rng.randint(1, 4)
                           for _ in range(6))
            lines = ["[2026-01-01 00:00:00] ERROR:    Exception in ASGI application",
                     "Traceback (most recent call last):",
                     '  File "/opt/venv/lib/python3.11/site-packages/sglang/srt/entrypoints/http_server.py", line 612, in generate_request',
                     "    ret = await _global_state.tokenizer_manager.generate_request(obj, request).__anext__()",
                     f"KeyError: '{msg}'"]
            for ln in lines:
                text = "Jan  1 00:00:00 ct129 sglang-ddtree[41231]: " + ln + "\n"
                out.write(text)
                written += len(text.encode())
                lineno += 1
    return written, 0


# What an operator greps a journal for, by hand: the handful of signature strings grep gets.
SIGNATURES = (
    "Traceback", "Error", "CUDA out of memory", "Killed", "NCCL", "Segmentation fault", "undefined symbol",
    "cannot open shared object", "Address already in use", "Not enough memory", "Watchdog timeout",
    "illegal memory access", "no kernel image", "core dumped", "FAILED", "Failed with result", "Received sigquit",
)


def machine() -> dict:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    grep = subprocess.run(["grep", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    try:
        load = Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        load = []
    return {"cpu": cpu, "cpus": os.cpu_count(), "load_at_start": load, "system": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(), "grep": grep, "locale": os.environ.get("LC_ALL") or os.environ.get("LANG", "")}


def _catalogue(screen: str):  # noqa: ANN202 - a Catalogue
    """The shipped catalogue with the keyword screen `screen` (hyperscan or python)."""
    cat = parse_catalogue((REPO / "ddtree_ops" / "diagnose" / "catalogue.yaml").read_text("utf-8"), screen_kind=screen)
    kind = type(screen_for(cat)).__name__
    assert kind == ("HyperscanScreen" if screen == "hyperscan" else "Screen"), kind
    return cat


def _timed(fn) -> tuple[float, float, object]:
    """Wall-clock and CPU seconds (this process and its children) of one call."""
    t0, c0 = time.perf_counter(), os.times()
    out = fn()
    t1, c1 = time.perf_counter(), os.times()
    cpu = (c1.user - c0.user) + (c1.system - c0.system) + (c1.children_user - c0.children_user) \
        + (c1.children_system - c0.children_system)
    return t1 - t0, cpu, out


def command() -> list[str]:
    """`ddtree-ops` as installed beside this interpreter (the console script), else `python -m`."""
    script = Path(sys.executable).with_name("ddtree-ops")
    return [str(script)] if script.exists() else [sys.executable, "-m", "ddtree_ops"]


def tool_env(tmp: Path, bytecode: bool = True, cache: str = "cache") -> dict:
    """The environment of the whole-process arms: an installed tool's (bytecode cached, the disk
    cache of the catalogue in `tmp`), or a source tree's without a bytecode cache."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if bytecode:
        env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["DDTREE_OPS_CACHE"] = str(tmp / cache)
    env["NO_COLOR"] = "1"
    return env


def whole(journal: Path, env: dict) -> int:
    res = subprocess.run([*command(), "diagnose", "--log", str(journal), "--json"], env=env, capture_output=True)
    if res.returncode not in (0, 1, 2, 3):
        raise SystemExit(f"diagnose failed ({res.returncode}): {res.stderr.decode()[-2000:]}")
    return res.returncode


def run_startup(tmp: Path, runs: int) -> dict:
    """Start-up: the whole command on a one-line log, and what it is made of, interleaved."""
    log = tmp / "one-line.log"
    log.write_text("[2026-01-10 09:00:20 TP0] Load weight begin. avail mem=47.10 GB\n", encoding="utf-8")
    env = tool_env(tmp)
    nopyc = tool_env(tmp, bytecode=False)
    cold_dir = tmp / "cold"

    def cold() -> int:
        shutil.rmtree(cold_dir, ignore_errors=True)
        return whole(log, tool_env(tmp, cache="cold"))

    plan = [("python -c pass (the interpreter)", lambda: subprocess.run([sys.executable, "-c", "pass"], env=env).returncode),
            ("ddtree-ops --help", lambda: subprocess.run([*command(), "--help"], env=env, capture_output=True).returncode),
            ("diagnose --log (one line), disk cache warm", lambda: whole(log, env)),
            ("diagnose --log (one line), disk cache empty", cold),
            ("diagnose --log (one line), no bytecode cache", lambda: whole(log, nopyc))]
    whole(log, env)  # warm: bytecode and the catalogue's disk cache written once
    arms: dict[str, list[dict]] = {}
    for _ in range(runs):
        for arm, fn in plan:
            wall, cpu, _ = _timed(fn)
            arms.setdefault(arm, []).append({"wall_s": wall, "cpu_s": cpu})
    return {"arms": arms}


def run_journal(name: str, journal: Path, size: int, failure_line: int, signatures: Path, runs: int,
                workers: int, cats: dict, env: dict | None = None) -> dict:
    """grep (two locales) and the classifier (each screen, and in workers), interleaved, `runs` times."""
    arms: dict[str, list[dict]] = {}
    reports: dict[str, object] = {}
    grep_hits: dict[str, int] = {}

    def grep(locale: str | None):  # noqa: ANN202
        def go() -> int:
            env = dict(os.environ)
            if locale:
                env["LC_ALL"] = locale
            res = subprocess.run(["grep", "-E", "-c", "-f", str(signatures), str(journal)], env=env,
                                 capture_output=True, text=True)
            if res.returncode not in (0, 1):
                raise SystemExit(f"grep failed: {res.stderr}")
            return int(res.stdout.strip() or 0)
        return go

    def one(cat):  # noqa: ANN202, ANN001
        def go():  # noqa: ANN202
            with journal.open("rb") as fh:
                return classify_stream(fh, cat)
        return go

    def par(cat):  # noqa: ANN202, ANN001
        return lambda: classify_path(str(journal), cat, workers=workers, min_bytes=0)

    plan = [("grep -E -f (default locale)", grep(None)), ("grep -E -f (LC_ALL=C)", grep("C"))]
    for screen, cat in cats.items():
        plan.append((f"classifier, {screen} screen", one(cat)))
    first = next(iter(cats.values()))
    plan.append((f"classifier, {next(iter(cats))} screen in {workers} workers", par(first)))
    if env is not None:
        plan.append(("ddtree-ops diagnose --log FILE (whole process)", lambda: whole(journal, env)))
    one(first)()  # warm the page cache
    for _ in range(runs):
        for arm, fn in plan:
            wall, cpu, out = _timed(fn)
            arms.setdefault(arm, []).append({"wall_s": wall, "cpu_s": cpu})
            if arm.startswith("grep"):
                grep_hits[arm] = out  # type: ignore[assignment]
            elif arm.startswith("ddtree-ops"):
                if out != 2:  # every journal holds a failure: exit 2
                    raise SystemExit(f"{arm} exited {out} on {name}")
            else:
                reports[arm] = out
    keys = {arm: _key(rep) for arm, rep in reports.items()}
    ref = next(iter(reports.values()))
    rc = ref.root_cause  # type: ignore[attr-defined]
    ok = (rc is not None and rc.label == "cuda_oom" and rc.line == failure_line) if failure_line \
        else ref.verdict != "healthy"  # type: ignore[attr-defined]
    return {"journal": name, "bytes": size, "lines": ref.lines, "arms": arms, "grep_hits": grep_hits,  # type: ignore[attr-defined]
            "verdict": ref.verdict, "root": None if rc is None else {"label": rc.label, "line": rc.line},  # type: ignore[attr-defined]
            "correct": ok, "same_report": len(set(keys.values())) == 1,
            "suppressed": sum(ref.suppressed.values())}  # type: ignore[attr-defined]


def _key(rep) -> tuple:  # noqa: ANN001
    rc = rep.root_cause
    return (rep.verdict, rep.lines, None if rc is None else (rc.label, rc.line),
            tuple((f.rule_id, f.line) for f in rep.findings), tuple(sorted(rep.suppressed.items())))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=200, help="the realistic journal")
    ap.add_argument("--flood-mb", type=int, default=100, help="the overloaded server's journal")
    ap.add_argument("--worst-mb", type=int, default=20, help="the worst case (unique traceback per request)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--startup-runs", type=int, default=15)
    ap.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 8))
    ap.add_argument("--json", default=str(RESULTS), help="raw numbers (written by a run, read by --table)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "diagnose.md"))
    ap.add_argument("--table", action="store_true", help="print the table from --json and exit")
    args = ap.parse_args(argv)
    if args.table:
        print(render(json.loads(Path(args.json).read_text("utf-8"))))
        return 0
    if shutil.which("grep") is None:
        print("grep not found", file=sys.stderr)
        return 2
    load_catalogue()
    kinds = (["hyperscan"] if screens.hyperscan_available() else []) + ["python"]
    cats = {k: _catalogue(k) for k in kinds}
    tmp = Path(tempfile.mkdtemp(prefix="ddtree-diagnose-bench-"))
    try:
        signatures = tmp / "signatures.txt"
        signatures.write_text("\n".join(SIGNATURES) + "\n", encoding="utf-8")
        env = tool_env(tmp)
        startup = run_startup(tmp, args.startup_runs)
        results = []
        for name, gen, mb in (("realistic", generate, args.size_mb), ("flood", generate_flood, args.flood_mb),
                              ("worst case", generate_worst, args.worst_mb)):
            path = tmp / f"{name.replace(' ', '_')}.txt"
            size, failure_line = gen(path, mb)
            results.append(run_journal(name, path, size, failure_line, signatures, args.runs, args.workers, cats, env))
            path.unlink()
        doc = {"schema_version": 1, "generated_by": "python bench/diagnose_scan.py", "date": time.strftime("%Y-%m-%d"),
               "machine": machine(), "runs": args.runs, "workers": args.workers, "screens": kinds,
               "signatures": list(SIGNATURES),
               "catalogue": {"rules": len(load_catalogue().rules), "patterns": len(load_catalogue().patterns())},
               "startup": startup, "journals": results}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        text = render(doc)
        out = Path(args.out)
        old = out.read_text("utf-8") if out.exists() else ""
        tail = old[old.index("## Real-log corpus"):] if "## Real-log corpus" in old else ""
        out.write_text(text + ("\n" + tail if tail else ""), encoding="utf-8")
        print(text)
        return 0 if all(r["correct"] and r["same_report"] for r in results) else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def render(doc: dict) -> str:
    """The markdown table: per journal, each arm's best wall-clock rate, and each classifier's ratio
    to grep in each locale (best against best; the CPU-time ratio beside it, which a busy machine
    disturbs less)."""
    m = doc["machine"]
    lines = [
        "# diagnose: scan throughput",
        "",
        f"Generated by `{doc['generated_by']}` on {doc['date']}: best of {doc['runs']} interleaved runs of every arm "
        "(same files, same run, page cache warm); raw seconds per run in `bench/results/diagnose_scan.json`, "
        "this table from it with `python bench/diagnose_scan.py --table`.",
        "",
        f"- machine: {m['cpu']}, {m['cpus']} CPUs (load average {' '.join(m['load_at_start'])} when the run started), "
        f"{m['system']}, Python {m['python']}, {m['grep']}, default locale {m['locale'] or 'unset'}",
        f"- screens measured: {', '.join(doc['screens'])} (Hyperscan where the `hyperscan` package is installed; the "
        "stdlib screen otherwise)",
        f"- grep gets the {len(doc['signatures'])} signature strings an operator would type: "
        + ", ".join(f"`{s}`" for s in doc["signatures"]),
        f"- the classifier gets its whole catalogue ({doc['catalogue']['rules']} rules, {doc['catalogue']['patterns']} "
        "patterns) and does its full work: prefixes, tracebacks, priorities, context, root cause",
        "",
        "| journal | MB | lines | arm | MB/s (wall, best) | vs grep default locale (wall / cpu) | vs grep LC_ALL=C (wall / cpu) | verdict |",
        "|---|---:|---:|---|---:|---:|---:|---|",
    ]
    for r in doc["journals"]:
        mb = r["bytes"] / 1e6
        best = {arm: (min(x["wall_s"] for x in runs), min(x["cpu_s"] for x in runs)) for arm, runs in r["arms"].items()}
        g_def, g_c = best["grep -E -f (default locale)"], best["grep -E -f (LC_ALL=C)"]
        root = r["root"]
        verdict = r["verdict"] + (f", `{root['label']}` at line {root['line']}" if root else "")
        verdict += "" if r["correct"] else " (WRONG)"
        verdict += "" if r["same_report"] else " (classifier arms DIFFER)"
        for arm, (wall, cpu) in best.items():
            if arm.startswith("grep"):
                ratio_d = ratio_c = ""
            elif arm.startswith("ddtree-ops"):  # its CPU time is a child's: the wall-clock ratio only
                ratio_d, ratio_c = f"{g_def[0] / wall:.2f} / n/a", f"{g_c[0] / wall:.2f} / n/a"
            else:
                ratio_d = f"{g_def[0] / wall:.2f} / " + (f"{g_def[1] / cpu:.2f}" if cpu and g_def[1] else "n/a")
                ratio_c = f"{g_c[0] / wall:.2f} / " + (f"{g_c[1] / cpu:.2f}" if cpu and g_c[1] else "n/a")
            lines.append(f"| {r['journal']} | {mb:.0f} | {r['lines']:,} | {arm} | {mb / wall:.0f} | {ratio_d} | {ratio_c} | "
                         f"{verdict if arm.startswith('classifier') else ''} |")
    if "startup" in doc:
        lines += ["", "Start-up: the whole process on a one-line log (wall seconds over the runs, interleaved):", "",
                  "| arm | best | median | worst |", "|---|---:|---:|---:|"]
        for arm, runs in doc["startup"]["arms"].items():
            w = sorted(x["wall_s"] for x in runs)
            lines.append(f"| {arm} | {w[0]:.3f} | {w[len(w) // 2]:.3f} | {w[-1]:.3f} |")
    lines += [
        "",
        "- realistic: healthy SGLang serving lines with accept lengths, uvicorn access lines, health checks, rare "
        "benign warnings and request tracebacks, one CUDA OOM near the end (it must be named at its line).",
        "- flood: an overloaded server, 20% of the lines KV-retract warnings, rejected over-long requests and their 400 "
        "access lines; the same planted OOM. Once a rule has kept its examples, a copy of a known message shape is one "
        "dictionary lookup.",
        "- worst case: nothing but request tracebacks whose exception messages are all different: no memoised "
        "decision applies; the tracebacks repeat one shape, so they are replayed from a template and counted in bulk "
        "(ddtree_ops/diagnose/replay.py), each message still checked against every rule that could claim it.",
        "- `ddtree-ops diagnose --log FILE`: the command an operator types, a process of its own (start-up, reading, "
        "the JSON report), bytecode and the catalogue's disk cache warm, as an installed tool runs.",
        "- a ratio is grep's best time over the classifier's best time (1.00 = as fast as grep); CPU seconds count "
        "grep's process and the classifier's (workers included).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
