"""The lab's SGLang stand-in against real SGLang 0.5.17: for every real log in tests/data/real-sglang/0.5.17,
the stand-in is started with that run's args and env (from the run's summary, on the same simulated
H200), driven the same way (/health_generate until ready or dead, the same /generate requests,
/server_info, then SIGTERM to its process group), and its log must carry the real log's milestones
in the real order, no milestone the real log lacks (the ddtree plugin's own lines excepted), and a
KV pool within 2% of the real one (`ddtree_ops.lab.standin.milestones`)."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from ddtree_ops.lab.standin import milestones
from ports import free_port
from standin_proc import H200, NEGCTL, Standin, install_plugin, start

if importlib.util.find_spec("sglang") is None:  # found, not imported: only the stand-ins' forkserver imports it
    pytest.skip("needs sglang (the stand-in runs its parser)", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("realsglang_scenarios", REPO / "bench" / "realsglang" / "scenarios.py")
assert _spec and _spec.loader
_scenarios = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _scenarios          # dataclasses look their module up
_spec.loader.exec_module(_scenarios)
_SHAPES = _scenarios.model_configs()
REAL = REPO / "tests" / "data" / "real-sglang" / "0.5.17"
MODELS = REPO / "bench" / "realsglang" / "models"
# log -> (summary, run name in it, the draft's target_layer_ids in that run). Run 1 used a draft
# with target_layer_ids [1, 3] on the 4-layer target (tests/data/real-sglang/0.5.17/INDEX.md: the
# "layers13" logs), run 2 the committed draft ([0, 2]).
RUNS = {
    "1_base_nograph": ("1_summary.txt", "base_nograph", None),
    "1_base_graph": ("1_summary.txt", "base_graph", None),
    "1_dflash_layers13": ("1_summary.txt", "dflash", [1, 3]),
    "1_ddtree_layers13": ("1_summary.txt", "ddtree", [1, 3]),
    "1_neg_nonfamily_graph_layers13": ("1_summary.txt", "neg_nonfamily", [1, 3]),
    "2_dflash": ("2_summary.txt", "dflash", None),
    "2_ddtree": ("2_summary.txt", "ddtree", None),
    "2_neg_nonfamily_nograph": ("2_summary.txt", "neg_nonfamily_ng", None),
    "2_neg_plain_graph": ("2_summary.txt", "neg_plain", None),
    # runs 4 and 5 (bench/realsglang/run.py: argv rendered from bench/realsglang/h200.yaml); the
    # client: the gate's smoke request (1 prompt, 32 tokens), then one arm's share of the shadow-tax
    # load, shortened (a warm-up at batch 1 and 8, one batch of 8 x 256)
    "4_layers_last": ("4_summary.json", "failures/layers_last", [1, 3]),
    "4_kv_too_small": ("4_summary.json", "failures/kv_too_small", None),
    "5_dflash": ("5_summary.json", "serve/dflash", None),
}
# Run 6 (issue 22: bench/realsglang/run.py tax, the Qwen3-8B shape; docs/realsglang.md says how its
# logs are copied here): replayed as soon as they are committed. Their DDTREE arms are the plugin
# of this tree (the top-K in the draft graph, exact greedy accounting); the stand-in's shadow
# lines must follow them.
RUN6 = {f"6_tax_{arm}": ("6_summary.json", f"tax/{arm}", None)
        for arm in ("dflash", "dflash_twin", "ddtree_s000", "ddtree_s025", "ddtree_s100")}
RUNS.update({log: run for log, run in RUN6.items() if (REAL / f"{log}.log").exists()})
# Run 7 (issue 23, bench/realsglang/truth.py): a trained pair whose weights the repository does not
# hold; tests/engine/test_real_shadow_0517.py reads its logs instead
TRUTH_LOGS = {p.stem: "the trained pair's weights are not in the repository (the stand-in serves configs only)"
              for p in [*REAL.glob("7_truth_*.log"), *REAL.glob("8_*.log")]}  # run 8 (issue 33): the same pair
# runs recorded with the plugin before issue 22, which kept DFlash's draft head eager (no "DFLASH
# draft greedy head folded" line) and printed its shadow lines in their old form; the stand-in runs
# this tree's plugin, so those lines are left out of both logs for these runs (every other
# milestone is still held to the real log)
OLD_PLUGIN = {"1_ddtree_layers13", "1_neg_nonfamily_graph_layers13", "2_ddtree"}
_OLD_PLUGIN_LINE = re.compile(r"DDTREE shadow: |DFLASH draft greedy head (folded into|kept eager)")
# real logs the stand-in does not replay, and why
NOT_REPLAYED = {
    "3_ddtree_s025_shared_gpu": "three other real servers held the GPU's memory",
    "4_ddtree_s025": "the plugin before the TARGET_VERIFY fix; the stand-in runs the plugin of this tree",
    "5_ddtree_s025": "the plugin before issue 22 (DFlash's head kept eager, lower-bound reports only); the stand-in "
                     "runs the plugin of this tree, which folds the top-K into DFlash's graph",
    "4_crash_after_ready": "the runner SIGKILLed the real scheduler mid-window (the lab's crash fault covers it)",
    "4_mem_1p7b_30": "a Qwen3-1.7B shape: preflight's memory table holds it (BENCHMARKS.md), not the stand-in",
    "5_ddtree_s100": "the same run as 5_ddtree_s025 at share 1.0",
    "6_tax_ddtree_s100_stalled": "the plugin's sign test stalled this scheduler as its rounds grew (fixed since): it exited "
                         "gracefully on SIGTERM, mid-backlog, where the others crashed out; the stand-in runs the fix",
    "6_refuse_gpus1": "settings preflight refuses (gpus [1] on one card): diagnose holds the log, the lab never starts it",
    "6_refuse_tp2": "settings preflight refuses (tp_size 2 on one card): diagnose holds the log, the lab never starts it",
    "6_refuse_context": "settings preflight refuses (context past the model): diagnose holds the log",
    **TRUTH_LOGS,
}
_START = re.compile(r"^\[\d+s\] START (\S+) port=\d+ env=(.*?) args: (.*)$")
_CLIENT = re.compile(r"^\[\d+s\] CLIENT (\S+): (.*)$")
_GENERATE = re.compile(r'\{ "status": \d+, "s": [\d.]+, "n": (\d+), "text0": ".*?", "meta0": \{ "prompt_tokens": \d+, '
                       r'"completion_tokens": (\d+)')


@dataclass(frozen=True)
class RealRun:
    log: str
    env: dict[str, str]
    args: list[str]
    batches: list[tuple[int, int]]  # (prompts, tokens generated) of each /generate request, in order
    layer_ids: list[int] | None


def _json_run(log: str, summary: str, where: str, layer_ids: list[int] | None) -> RealRun:
    group, name = where.split("/")
    run = json.loads((REAL / summary).read_text())["groups"][group][name]
    argv = [a.replace("/tmp/rs/models/", "/models/").replace("/models/tiny-qwen3-dflash-last", "/models/tiny-qwen3-dflash")
            for a in run["argv"][2:]]   # after -m sglang.launch_server; the -last draft is made below
    i = argv.index("--port")
    del argv[i:i + 2]
    served = run["gate"].get("smoke") is not None
    env = {k: v for k, v in run["env"].items() if k != "PYTHONPATH"}
    env["SGLANG_PLUGINS"] = "ddtree"        # the real site held one plugin, ours, and loaded it
    return RealRun(log, env, argv, [(1, 32), (1, 64), (8, 64), (8, 256)] if served else [], layer_ids)


def real_run(log: str) -> RealRun:
    summary, name, layer_ids = RUNS[log]
    if summary.endswith(".json"):
        return _json_run(log, summary, name, layer_ids)
    env: dict[str, str] = {}
    args: list[str] = []
    batches: list[tuple[int, int]] = []
    for line in (REAL / summary).read_text().splitlines():
        if (m := _START.match(line)) and m.group(1) == name:
            env = dict(kv.split("=", 1) for kv in m.group(2).split())
            args = m.group(3).split()
        elif (m := _CLIENT.match(line)) and m.group(1) == name:
            batches = [(int(n), int(t)) for n, t in _GENERATE.findall(m.group(2))]  # the line may be cut short
    assert args, f"{summary} has no START line for {name}"
    return RealRun(log, env, args, batches, layer_ids)


def test_every_real_log_has_a_run() -> None:
    assert sorted(p.stem for p in REAL.glob("*.log")) == sorted([*RUNS, *NOT_REPLAYED])
    served = {log: real_run(log).batches for log in RUNS}
    assert served["1_base_graph"] == [(1, 48), (8, 48)] and served["2_ddtree"] == [(1, 48)] + [(8, 48)] * 3
    assert served["2_neg_plain_graph"] == []  # it died before serving


def _models(tmp: Path, layer_ids: list[int] | None) -> dict[str, str]:
    """The run's /models: the committed configs (and the larger shapes the real-SGLang runner
    writes from them), the draft's layer ids as in that run."""
    out = {}
    for name in ("tiny-qwen3", "tiny-qwen3-dflash"):
        dest = tmp / "models" / name
        shutil.copytree(MODELS / name, dest, dirs_exist_ok=True)
        out[f"/models/{name}"] = str(dest)
    for name in ("qwen3-8b", "qwen3-8b-dflash"):
        dest = tmp / "models" / name
        dest.mkdir(parents=True, exist_ok=True)
        for fname, content in _SHAPES[name].items():
            (dest / fname).write_text(content if isinstance(content, str) else json.dumps(content, indent=1))
        for tok in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            shutil.copy(MODELS / "tiny-qwen3" / tok, dest / tok)
        out[f"/models/{name}"] = str(dest)
    if layer_ids is not None:
        cfg_path = tmp / "models" / "tiny-qwen3-dflash" / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["dflash_config"]["target_layer_ids"] = layer_ids
        cfg_path.write_text(json.dumps(cfg, indent=2))
    return out


def _drive(s: Standin, run: RealRun) -> None:
    """What the real run's client did."""
    if s.wait_ready(timeout=90):
        for i, (n, tokens) in enumerate(run.batches):
            prompt = f"Tell me about request {i} of the conformance run"
            text: str | list[str] = prompt if n == 1 else [f"{prompt}, prompt {k}" for k in range(n)]
            status, _ = s.post("/generate", {"text": text, "sampling_params": {"temperature": 0,
                                                                               "max_new_tokens": tokens}}, timeout=60)
            assert status == 200
        assert s.get("/server_info")[0] == 200
        s.proc.signal_group(signal.SIGTERM)  # systemd's stop: KillMode=control-group, KillSignal=SIGTERM
    s.wait_exit(timeout=60)


def _launch(tmp: Path, run: RealRun) -> Standin:
    paths = _models(tmp, run.layer_ids)
    port = free_port()
    args = [paths.get(a, a) for a in run.args]
    args += ["--port", str(port)]
    env = dict(run.env)
    pdir = tmp / "negctl"
    install_plugin(pdir, "ddtree_negctl", NEGCTL, {"ddtree_nonfamily": "register_nonfamily",
                                                   "ddtree_plain": "register_plain"})
    env["PYTHONPATH"] = str(pdir)
    return start(tmp / "run", args, env=env, port=port, card=H200)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Standin, float]]]:
    """Every real run replayed at once (each one mostly waits)."""
    t0 = time.monotonic()
    started = {log: _launch(tmp_path_factory.mktemp(log), real_run(log)) for log in RUNS}
    try:
        with ThreadPoolExecutor(len(started)) as pool:
            for log, fut in [(log, pool.submit(_drive, s, real_run(log))) for log, s in started.items()]:
                fut.result()
        took = time.monotonic() - t0
        yield {log: (s, took) for log, s in started.items()}
    finally:
        for s in started.values():
            s.stop()


@pytest.mark.parametrize("log", sorted(RUNS))
def test_standin_prints_what_real_sglang_printed(runs: dict[str, tuple[Standin, float]], log: str) -> None:
    s, _ = runs[log]
    real, ours = (REAL / f"{log}.log").read_text(errors="replace"), s.log()
    if log in OLD_PLUGIN:
        real, ours = (("\n".join(ln for ln in t.splitlines() if not _OLD_PLUGIN_LINE.search(ln)) + "\n")
                      for t in (real, ours))
    report = milestones.compare(real, ours)
    assert report.ok, (f"{log}: the stand-in's log ({s.dir / 'out.log'}) differs from real SGLang 0.5.17's "
                       f"({REAL / (log + '.log')}):\n{report.explain('real log', 'stand-in')}")


@pytest.mark.parametrize("log", sorted(RUNS))
def test_standin_ends_as_sglang_does(runs: dict[str, tuple[Standin, float]], log: str) -> None:
    """Served and stopped, or failed: SGLang's launcher ends in kill_process_tree, SIGKILLing itself."""
    s, _ = runs[log]
    assert s.proc.poll() == -signal.SIGKILL, s.log()[-2000:]
