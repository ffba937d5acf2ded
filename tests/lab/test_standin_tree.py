"""The stand-in serving DDTREE through the plugin's own code: the shadow and the served tree on simulated
rounds (`standin/treesim.py`), the lab's two GPU classes' measured cost ratio and the verdicts it gives,
the served tree against the shadow's prediction, the tree-mask fault, and the tree mode's report lines
held to the plugin's own format and to its /metrics.

In-process where no HTTP is needed (the plugin's mixin in front of the stand-in's simulated DFlash
worker, as the stand-in builds it); as a stand-in process (tests/lab/standin_proc.py) for the rest."""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Any, Iterator

import pytest

from ddtree_ops.lab.standin import shadow, textgen, treesim
from ddtree_ops.treestats import FROM_MEASURED, KEEP_CHAIN, INCONCLUSIVE, PROMOTE, parse_metrics, verdict

from ports import free_port
from standin_proc import Standin, ddtree_argv, install_tree_backend, start

A6000 = types.SimpleNamespace(name="NVIDIA RTX A6000", compute_cap="8.6")
PRO6000 = types.SimpleNamespace(name="NVIDIA RTX PRO 6000 Blackwell Workstation Edition", compute_cap="12.0")
WEIGHTS = 16_381_470_720        # about Qwen3-8B's BF16 weights (r does not depend on them: both arms read them once)
BAR = 1.05                      # promote's bar on the lower bound (issue 28)


@pytest.fixture
def backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_tree_backend(tmp_path / "backend")
    monkeypatch.syspath_prepend(str(tmp_path / "backend"))


def plugin_env(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("DDTREE_") or key == "SGLANG_SIMULATE_ACC_LEN":
            monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def serve(card: Any, mode: str, monkeypatch: pytest.MonkeyPatch, *, batches: int, faults: frozenset[str] = frozenset(),
          **env: str) -> tuple[Any, Any]:
    """The lab load's shape (`lab load`: requests of 4 greedy prompts of 256 tokens) through the plugin's
    worker on the stand-in, with the lab profiles' 32-node tree; returns (the plugin's verdict over its
    own counters, its accounting)."""
    plugin_env(monkeypatch, DDTREE_MODE=mode, DDTREE_BUDGET="32", DDTREE_SHADOW_REPORT_EVERY="1000000", **env)
    mixin, why = shadow.plugin_mixin()
    assert mixin is not None, why
    run = shadow.ShadowRun(mixin, 16, [1, 9, 17, 25, 33], card=card, weight_bytes=WEIGHTS, faults=faults)
    run.init_cuda_graphs()
    for i in range(batches):
        jobs = []
        for k in range(4):
            prompt = f"lab load client 0 request {i} prompt {k}: tell me about the tree"
            st = textgen.spec_stats(prompt, 256, mean=4.6, spread=0.6, cap=16)
            jobs.append(shadow.Job(9, 256, textgen.round_commits(prompt, 256, st.verify_ct)))
        run.serve(jobs)
    w = run.worker
    state = w._ddtree_tree() if mode == "tree" else w._ddtree()
    if mode == "shadow":
        state.drain(wait=True)
    return state.acct.verdict(), state.acct


def test_verify_cost_is_a_roofline_of_the_simulated_card() -> None:
    a, p = treesim.VerifyCost(A6000.name, "8.6", WEIGHTS), treesim.VerifyCost(PRO6000.name, "12.0", WEIGHTS)
    assert a.weight_s == pytest.approx(WEIGHTS / 768e9) and p.weight_s == pytest.approx(WEIGHTS / 1792e9)
    assert a.ridge == pytest.approx(154.8e12 * 0.5 / 768e9) and p.ridge == pytest.approx(503.8e12 * 0.5 / 1792e9)
    ratio = lambda c, bs: c.exact(bs * 33) / c.exact(bs * 16)  # noqa: E731  (a 32-node tree's round, a chain's)
    # up to two rows the weight read hides the tree on both; four rows (the lab load): the A6000's tensor
    # cores show it; eight: both pay (docs/lab.md quotes these)
    assert (ratio(a, 2), ratio(p, 2)) == (pytest.approx(1.040, abs=1e-3), pytest.approx(1.011, abs=1e-3))
    assert (ratio(a, 4), ratio(p, 4)) == (pytest.approx(1.357, abs=1e-3), pytest.approx(1.143, abs=1e-3))
    assert (ratio(a, 8), ratio(p, 8)) == (pytest.approx(1.911, abs=1e-3), pytest.approx(1.680, abs=1e-3))
    assert treesim.card_figures("NVIDIA RTX 6000 Ada", "8.6")[0] == "RTX A6000"   # unknown name: by arch


def test_the_lab_classes_measure_their_r_and_reach_opposite_verdicts(backend: None,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The shadow on each class, over the lab load's rounds: the A6000 class measures a higher r and stays
    on the chain; the RTX PRO 6000 class clears promote's 1.05 bar on the lower bound."""
    a, _ = serve(A6000, "shadow", monkeypatch, batches=4, DDTREE_SHADOW_SHARE="1.0", DDTREE_COST_PROBE_SHARE="0.2")
    p, _ = serve(PRO6000, "shadow", monkeypatch, batches=4, DDTREE_SHADOW_SHARE="1.0", DDTREE_COST_PROBE_SHARE="0.2")
    for v in (a, p):
        assert v.r_source == FROM_MEASURED and v.exact_rounds >= 600
    assert a.r > 1.3 and 1.08 < p.r < 1.2
    assert a.tau_tree / a.tau_chain == pytest.approx(p.tau_tree / p.tau_chain, rel=0.08)   # the same tree, the same world
    assert 1.2 < p.tau_tree / p.tau_chain < 1.4
    assert a.recommendation in (KEEP_CHAIN, INCONCLUSIVE) and a.lower < BAR
    assert p.recommendation == PROMOTE and p.lower >= BAR


def test_the_served_tree_meets_the_shadows_prediction_and_the_fault_misses_it(backend: None,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    predicted, _ = serve(PRO6000, "shadow", monkeypatch, batches=4, DDTREE_SHADOW_SHARE="1.0")
    served, acct = serve(PRO6000, "tree", monkeypatch, batches=4, DDTREE_CHAIN_SHARE="0.2")
    assert served.mode == "tree" and served.exact_rounds >= 400 and served.r_source == FROM_MEASURED
    assert abs(served.tau_tree / predicted.tau_tree - 1) <= 0.03
    assert abs(served.tau_chain / predicted.tau_chain - 1) <= 0.03          # the paired chain: the same chain
    assert served.recommendation == PROMOTE
    assert acct.cost[("chain", "4")][1] >= 20                               # spine-only rounds: r measured live
    broken, _ = serve(PRO6000, "tree", monkeypatch, batches=4, faults=frozenset({treesim.TREE_MASK_FAULT}),
                      DDTREE_CHAIN_SHARE="0.1")
    assert broken.tau_tree < 0.95 * predicted.tau_tree                       # well outside promote's 3%
    assert broken.tau_tree >= broken.tau_chain                               # the spine still holds the chain


# ------------------------------------------------------------------ the stand-in process


TREE_ENV = {"SGLANG_PLUGINS": "ddtree", "DDTREE_MODE": "tree", "DDTREE_BUDGET": "32", "DDTREE_CHAIN_SHARE": "0.2",
            "DDTREE_SHADOW_REPORT_EVERY": "20"}
PRO6000_CARD = {"index": 0, "name": PRO6000.name, "uuid": "GPU-test-pro", "memory_mib": 97887, "compute_cap": "12.0",
                "driver_version": "570.172.08"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Standin]]:
    out: dict[str, Standin] = {}
    for name, env, backend_here in (("tree", TREE_ENV, True), ("tree-no-backend", TREE_ENV, False)):
        tmp = tmp_path_factory.mktemp(name)
        e = dict(env)
        if backend_here:
            install_tree_backend(tmp / "backend")
            e["PYTHONPATH"] = str(tmp / "backend")
        port = free_port()
        out[name] = start(tmp, ddtree_argv(port), port=port, env=e, card=PRO6000_CARD)
    try:
        yield out
    finally:
        for s in out.values():
            s.stop()


def test_tree_mode_without_a_backend_is_refused_at_launch(runs: dict[str, Standin]) -> None:
    s = runs["tree-no-backend"]
    assert s.wait_exit() != 0
    assert "DDTREE launch refused" in s.log() and "no tree verify backend for sglang 0.5.23" in s.log()
    assert "fired up" not in s.log()


def test_the_stand_in_serves_the_tree_and_its_lines_are_the_plugins(runs: dict[str, Standin]) -> None:
    """Conformance of the new lines: every `DDTREE tree:` report the stand-in prints is the plugin's own
    format (sglang_tree.TREE_LINE), and the last one says what /metrics says through treestats."""
    from ddtree_ops.engine.sglang_tree import TREE_LINE

    s = runs["tree"]
    s.wait_log("The server is fired up and ready to roll!")
    status, doc = s.post("/generate", {"text": ["one tree please", "and another"],
                                       "sampling_params": {"temperature": 0, "max_new_tokens": 192}})
    assert status == 200
    log = s.log()
    assert "DDTREE plugin: registered DDTREE as a DFlash-family algorithm (sglang 0.5.23, tree serving)" in log
    assert re.search(r"DDTREE tree: serving the tree \(budget 32, horizon 15, spine inside\), 20% of rounds verify the "
                     r"spine alone, tree verify by ddtree-ops LAB STAND-IN simulated tree verify", log)
    pattern = re.compile("^" + re.escape(TREE_LINE).replace(r"\{", "{").replace(r"\}", "}")
                         .replace("{", "(?P<").replace("}", r">\S+)") + "$")
    lines = [ln.split("] ", 1)[1] for ln in log.splitlines() if "] DDTREE tree: rounds=" in ln]
    assert len(lines) >= 3
    assert all(pattern.match(ln) for ln in lines), [ln for ln in lines if not pattern.match(ln)]
    last = pattern.match(lines[-1]).groupdict()  # type: ignore[union-attr]
    counters = parse_metrics(s.get("/metrics")[1].decode())
    assert counters is not None
    v = verdict(counters)
    assert v.mode == "tree" and int(last["exact"]) == v.exact_rounds and last["rec"] == v.recommendation
    assert float(last["tau_tree"]) == pytest.approx(v.tau_tree, abs=5e-4)
    assert float(last["tau_chain"]) == pytest.approx(v.tau_chain, abs=5e-4)
    # the request's acceptance is the served tree's: more than the chain's on the same rounds
    metas = [d["meta_info"] for d in doc]
    assert all(m["spec_accept_length"] > v.tau_chain for m in metas)
    assert all(m["completion_tokens"] == 192 for m in metas)


def test_the_load_sends_greedy_batches_and_counts(tmp_path: Path) -> None:
    """`lab load`'s script against a local HTTP server: batches of greedy prompts until the time is up,
    a refused request counted and retried, the count as its last line."""
    import http.server
    import json
    import os
    import subprocess
    import sys
    import threading

    from ddtree_ops.lab import api, payload

    seen: list[Any] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - /health: serving (the load's balancer asks)
            self.send_response(200)
            self.end_headers()

        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            self.send_response(503 if len(seen) == 1 else 200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    # the command `lab load` runs in a host, against the package as the lab payload lays it out
    pkg = tmp_path / "lib"
    payload._copy_package(pkg / "sglang_standin")
    argv = api.load_argv(server.server_address[1], api.LoadPlan(seconds=1, clients=2, batch=3, max_new_tokens=16),
                         python=sys.executable)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path,
                              env={"PATH": os.environ["PATH"], "PYTHONPATH": str(pkg)})
    finally:
        server.shutdown()
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.strip().splitlines()[-1]
    ok = len(seen) - 1
    assert out.startswith(f"ddtree-lab load: {ok} requests ({3 * ok} prompts) answered, 1 failed, in ")
    assert all(len(b["text"]) == 3 and b["sampling_params"] == {"temperature": 0, "max_new_tokens": 16} for b in seen)
    assert len({t for b in seen for t in b["text"]}) == 3 * len(seen)          # every prompt its own


def test_the_stand_in_waits_out_a_share_of_the_simulated_rounds_and_reports_them_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """treesim.PACE: a request served through the plugin's rounds reports their simulated seconds as its
    e2e_latency, and the stand-in sleeps only PACE of that (the lab's loads gather rounds faster); a
    request of a mode without the plugin sleeps its whole latency."""
    import asyncio

    from ddtree_ops.lab.standin import http

    class Rounds:
        tree = False

        def serve(self, jobs: list[Any]) -> tuple[list[list[int]], float]:
            return [j.chain for j in jobs], 2.0            # 2 s of simulated verify forwards

    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(http.asyncio, "sleep", sleep)

    def answer(shadow: Any) -> float:
        state = http.State(model_path="m", served_model_name="m", context_len=4096, max_total_num_tokens=4096,
                           speculative=True, accept_mean=3.0, accept_spread=0.5, draft_window=8, step_s=0.01,
                           server_info={}, model_info={}, enable_metrics=False, cuda_graph=True, shadow=shadow,
                           phase="ready", log_batches=False)
        status, doc, _ = asyncio.run(http.Handler(state).generate(
            {"text": "tell me", "sampling_params": {"temperature": 0, "max_new_tokens": 32}}))
        assert status == 200
        return float(doc["meta_info"]["e2e_latency"])

    latency = answer(Rounds())
    assert latency > 2.0 and slept == [pytest.approx(latency * treesim.PACE, rel=1e-3)]
    slept.clear()
    latency = answer(None)
    assert slept == [pytest.approx(latency, rel=1e-3)]
