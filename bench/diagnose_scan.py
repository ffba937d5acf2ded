"""Scan throughput of `diagnose` against `grep -E -f`, on three journals, in one run.

    python bench/diagnose_scan.py [--size-mb 200] [--flood-mb 100] [--worst-mb 20] [--runs 3]

Journals in journald `short` format, generated here (seeded):
  - realistic: mostly healthy SGLang serving lines (decode and prefill reports with accept lengths,
    uvicorn access lines, health checks), rare benign warnings and request tracebacks, and one
    real failure (a CUDA OOM in the scheduler) near the end;
  - flood: an overloaded server, 20% of the lines "KV cache pool is full. Retract requests"
    warnings and rejected requests, the same planted failure;
  - worst case: request tracebacks whose exception messages are all different.
For each, in the same run and interleaved: `grep -E -c -f` with a handful of signature strings
(default locale and LC_ALL=C), the classifier in one process (`classify_stream`), and the
classifier with its keyword screen in worker processes (`classify_path`, what `diagnose --log
FILE` uses); the two classifier runs must give the same report. Writes a markdown table to
bench/results/diagnose.md (its corpus section, written by bench/diagnose_corpus.py, is kept).
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

from ddtree_ops.diagnose.classify import classify_path, classify_stream, load_catalogue  # noqa: E402

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


def machine() -> str:
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
        load = "load average " + " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        load = ""
    return (f"{cpu}, {os.cpu_count()} CPUs ({load} when the run started), {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, {grep}")


def run_journal(name: str, journal: Path, size: int, failure_line: int, signatures: Path, runs: int,
                workers: int) -> dict:
    """grep and the classifier on one journal, interleaved (grep, one process, workers; repeated)
    so that a load change on the machine hits all of them alike; best of `runs` each."""
    mb = size / 1e6
    times: dict[str, list[float]] = {"grep": [], "grep_c": [], "one": [], "par": []}
    result: dict = {}

    def grep(locale: str | None) -> None:
        env = dict(os.environ)
        if locale:
            env["LC_ALL"] = locale
        res = subprocess.run(["grep", "-E", "-c", "-f", str(signatures), str(journal)], env=env,
                             capture_output=True, text=True)
        if res.returncode not in (0, 1):
            raise SystemExit(f"grep failed: {res.stderr}")
        result["grep_hits"] = int(res.stdout.strip() or 0)

    def one() -> None:
        with journal.open("rb") as fh:
            result["report"] = classify_stream(fh)

    def par() -> None:
        result["report_par"] = classify_path(str(journal), workers=workers, min_bytes=0)

    one()  # warm the page cache
    for _ in range(runs):
        for key, fn in (("grep", lambda: grep(None)), ("grep_c", lambda: grep("C")), ("one", one), ("par", par)):
            t = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t)
    best = {k: min(v) for k, v in times.items()}
    rep = result["report"]
    rc = rep.root_cause
    same = _key(rep) == _key(result["report_par"])
    ok = (rc is not None and rc.label == "cuda_oom" and rc.line == failure_line) if failure_line else rep.verdict != "healthy"
    return {"name": name, "mb": mb, "lines": rep.lines, "best": best, "rate": {k: mb / v for k, v in best.items()},
            "grep_hits": result["grep_hits"], "verdict": rep.verdict, "root": rc, "correct": ok, "same": same,
            "suppressed": sum(rep.suppressed.values())}


def _key(rep) -> tuple:
    rc = rep.root_cause
    return (rep.verdict, rep.lines, None if rc is None else (rc.label, rc.line),
            [(f.rule_id, f.line) for f in rep.findings], tuple(sorted(rep.suppressed.items())))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=200, help="the realistic journal")
    ap.add_argument("--flood-mb", type=int, default=100, help="the overloaded server's journal")
    ap.add_argument("--worst-mb", type=int, default=20, help="the worst case (unique traceback per request)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 8))
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "diagnose.md"))
    args = ap.parse_args(argv)
    if shutil.which("grep") is None:
        print("grep not found", file=sys.stderr)
        return 2
    load_catalogue()
    tmp = Path(tempfile.mkdtemp(prefix="ddtree-diagnose-bench-"))
    try:
        signatures = tmp / "signatures.txt"
        signatures.write_text("\n".join(SIGNATURES) + "\n", encoding="utf-8")
        results = []
        for name, gen, mb in (("realistic", generate, args.size_mb), ("flood", generate_flood, args.flood_mb),
                              ("worst case", generate_worst, args.worst_mb)):
            path = tmp / f"{name.replace(' ', '_')}.txt"
            size, failure_line = gen(path, mb)
            results.append(run_journal(name, path, size, failure_line, signatures, args.runs, args.workers))
            path.unlink()
        text = render(results, args)
        out = Path(args.out)
        old = out.read_text("utf-8") if out.exists() else ""
        tail = old[old.index("## Real-log corpus"):] if "## Real-log corpus" in old else ""
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + ("\n" + tail if tail else ""), encoding="utf-8")
        print(text)
        return 0 if all(r["correct"] and r["same"] for r in results) else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def render(results: list[dict], args: argparse.Namespace) -> str:
    lines = [
        "# diagnose: scan throughput",
        "",
        f"Generated by `python bench/diagnose_scan.py` (best of {args.runs} interleaved runs each: grep, the classifier "
        f"in one process, the classifier with its screen in {args.workers} worker processes; same files, same run, "
        "page cache warm).",
        "",
        f"- machine: {machine()}",
        f"- grep gets the {len(SIGNATURES)} signature strings an operator would type: "
        + ", ".join(f"`{s}`" for s in SIGNATURES),
        f"- the classifier gets its whole catalogue ({len(load_catalogue().rules)} rules, "
        f"{len(load_catalogue().patterns())} patterns) and does its full work: prefixes, tracebacks, priorities, "
        "context, root cause",
        "",
        "| journal | MB | lines | grep -E -f (default locale) | grep -E -f (LC_ALL=C) | classifier, 1 process | "
        "ratio to grep | classifier, screen in workers | ratio | verdict |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        rate, rc = r["rate"], r["root"]
        verdict = f"{r['verdict']}" + (f", `{rc.label}` at line {rc.line}" if rc else "")
        verdict += "" if r["correct"] else " (WRONG)"
        verdict += "" if r["same"] else " (workers DIFFER)"
        lines.append(f"| {r['name']} | {r['mb']:.0f} | {r['lines']:,} | {rate['grep']:.0f} MB/s | {rate['grep_c']:.0f} MB/s | "
                     f"{rate['one']:.0f} MB/s | {rate['one'] / rate['grep']:.2f} | {rate['par']:.0f} MB/s | "
                     f"{rate['par'] / rate['grep']:.2f} | {verdict} |")
    lines += [
        "",
        "- realistic: healthy SGLang serving lines with accept lengths, uvicorn access lines, health checks, rare "
        "benign warnings and request tracebacks, one CUDA OOM near the end (it must be named at its line).",
        "- flood: an overloaded server, 20% of the lines KV-retract warnings, rejected over-long requests and their 400 "
        "access lines; the same planted OOM. Once a rule has kept its examples, a copy of a known message shape is one "
        "dictionary lookup.",
        "- worst case: nothing but request tracebacks whose exception messages are all different: no memoised "
        "decision applies and every line is read in Python.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
