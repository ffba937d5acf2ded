"""The shadow's top-K inside DFlash's draft graph, its one-copy transfer, the eager fallback, and
the hidden-state relay exemption, against each supported release's own source.

The CUDA graph cannot be captured here; the fakes run the sampler the way SGLang's capture tail
hook and the replay do (`dflash_fakes`). The Triton top-K runs under Triton's CPU interpreter in a
child process (TRITON_INTERPRET must be set before Triton is imported)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
import types
from typing import Any

import pytest
import torch
from dflash_fakes import FakeBatch, FakeDFlash, VERSIONS, real_sampler_class, sglang_file, shadow_env

pytestmark = pytest.mark.engine



@pytest.mark.parametrize("version", VERSIONS)
def test_folded_head_writes_dflash_argmax_and_the_topk_from_one_matmul(version: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """FoldedTopK in place of the release's own `_DflashDraftSampler`: the same draft tokens in the
    same buffer, and the top-K of the same logits, in the engine's canonical order."""
    from ddtree_ops.engine.sglang_topk import fold_topk
    from ddtree_ops.engine.tree import topk_logprobs

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cls = real_sampler_class(version)
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(50, 12, generator=g)
    make = lambda: cls(weight=weight, block_size=5, num_org=50, org_vocab_start=0, max_bs=4)  # noqa: E731
    dflash, inner = make(), make()
    folded, why = fold_topk(inner, budget=7)
    assert why == "" and folded is not None and folded.out is inner.out and folded.path == "torch"
    matmuls = 0
    real_matmul = torch.matmul

    def counting(*a: Any, **k: Any) -> Any:
        nonlocal matmuls
        matmuls += 1
        return real_matmul(*a, **k)

    for bs in (3, 1, 4):
        hidden = torch.randn(bs * 5, 12, generator=g)
        dflash(hidden)
        monkeypatch.setattr(torch, "matmul", counting)
        folded(hidden)
        monkeypatch.setattr(torch, "matmul", real_matmul)
        n = bs * 4
        assert torch.equal(folded.out[:n], dflash.out[:n])
        logits = hidden.view(bs, 5, -1)[:, 1:, :].reshape(-1, 12) @ weight.T
        tok, sc = topk_logprobs(logits, 7)
        got_t, got_s = folded.round(n)
        assert torch.equal(got_t, tok) and torch.equal(got_s, sc)
        assert torch.equal(got_t[:, 0], dflash.out[:n])        # rank 0 is DFlash's draft token
    assert matmuls == 3                                           # one matmul a call, not two


@pytest.mark.parametrize("why,sampler", [
    ("DFlash keeps its draft head eager", None),
    ("not its greedy head", types.SimpleNamespace()),
])
def test_nothing_folded_into_a_sampler_that_is_not_dflash_greedy_head(why: str, sampler: Any) -> None:
    from ddtree_ops.engine.sglang_topk import fold_topk

    folded, reason = fold_topk(sampler, budget=4)
    assert folded is None and why in reason


def test_sharded_head_is_not_folded() -> None:
    from ddtree_ops.engine.sglang_topk import fold_topk

    cls = real_sampler_class("0.5.17")
    s = cls(weight=torch.zeros(8, 4), block_size=3, num_org=8, org_vocab_start=8, max_bs=2)
    assert "sharded" in fold_topk(s, 4)[1]


TRITON_CHILD = textwrap.dedent('''
    import json, os, sys
    assert os.environ["TRITON_INTERPRET"] == "1"
    import torch
    from ddtree_ops.engine.sglang_topk import FoldedTopK, select_topk
    out = []
    for case in json.loads(sys.argv[1]):
        g = torch.Generator().manual_seed(case["seed"])
        x = torch.randn(case["n"], case["V"], generator=g) * case["scale"]
        if case["ties"]:
            x = x.round()
        x = x.to(getattr(torch, case["dtype"]))
        tri, ref = select_topk(x, case["k"], triton=True), select_topk(x, case["k"])
        out.append({"tokens_same": torch.equal(tri[0], ref[0]), "max_score_diff": int((tri[1] - ref[1]).abs().max())})
    inner = type("_DflashDraftSampler", (), {})()
    inner.weight, inner.block_size, inner.num_org, inner.org_vocab_start = torch.randn(300, 16), 4, 300, 0
    inner.out = torch.empty(2 * 3, dtype=torch.int64)
    folded = FoldedTopK(inner, 8, triton=True)
    folded(torch.randn(2 * 4, 16, generator=torch.Generator().manual_seed(9)))
    folded(torch.randn(1 * 4, 16, generator=torch.Generator().manual_seed(8)))   # a second size, same counters
    print(json.dumps({"cases": out, "folded_path": folded.path, "counters_zero": int(folded.counters.abs().sum()) == 0,
                      "rank0_is_argmax": torch.equal(folded.tokens[:3, 0], folded.out[:3])}))
''')

TRITON_CASES = [
    {"n": 6, "V": 1000, "k": 16, "scale": 3.0, "ties": False, "dtype": "float32", "seed": 1},
    {"n": 4, "V": 300, "k": 8, "scale": 1.0, "ties": False, "dtype": "bfloat16", "seed": 2},
    {"n": 5, "V": 200, "k": 12, "scale": 2.0, "ties": True, "dtype": "float32", "seed": 3},
]


def test_triton_topk_and_the_torch_fallback_agree_under_the_interpreter() -> None:
    """The in-graph selection (the engine's Triton kernels) and the fallback give the same
    top-K tokens in the same order; the quantised log-probs differ by at most a few units of
    2**-24 (the kernel's normaliser is summed in another order than torch.log_softmax's)."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", TRITON_CHILD, json.dumps(TRITON_CASES)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    for case, r in zip(TRITON_CASES, doc["cases"]):
        assert r["tokens_same"], case
        assert r["max_score_diff"] <= 16, (case, r)
    assert doc["folded_path"] == "triton"            # it compiled and ran: no fallback taken
    assert doc["counters_zero"]                      # replays need no memset of the atomic counters
    assert doc["rank0_is_argmax"]


def test_a_triton_failure_at_warm_up_falls_back_to_torch(monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    from ddtree_ops.engine import sglang_topk

    inner = real_sampler_class("0.5.17")(weight=torch.randn(30, 6), block_size=3, num_org=30, org_vocab_start=0,
                                         max_bs=2)
    folded = sglang_topk.FoldedTopK(inner, 4, triton=True)
    real = sglang_topk.select_topk

    def failing(logits: Any, k: int, counters: Any = None, triton: bool = False) -> Any:
        if triton:
            raise RuntimeError("no kernel image for this GPU")
        return real(logits, k)

    monkeypatch.setattr(sglang_topk, "select_topk", failing)
    with caplog.at_level("WARNING", logger="ddtree_ops.engine.sglang"):
        folded(torch.randn(2 * 3, 6))
        folded(torch.randn(2 * 3, 6))
    assert folded.path == "torch" and not folded.triton
    assert sum("Triton top-K failed" in r.getMessage() for r in caplog.records) == 1


def test_eager_path_where_dflash_declines_to_fold(monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """DFlash's `_eager(...)`: its head stays eager; the shadow takes the top-K there, on sampled
    rounds only, and says once which path runs."""
    from ddtree_ops.engine import sglang_shadow
    from ddtree_ops.engine.sglang_shadow import ShadowWorkerMixin

    shadow_env(monkeypatch, DDTREE_SHADOW_SHARE="0.5", DDTREE_BUDGET="4")
    calls = 0
    real = sglang_shadow.eager_topk

    def counting(*a: Any, **k: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(*a, **k)

    monkeypatch.setattr(sglang_shadow, "eager_topk", counting)      # where the worker looks it up

    class Worker(ShadowWorkerMixin, FakeDFlash):
        pass

    with caplog.at_level("INFO", logger="ddtree_ops.engine.sglang"):
        w = Worker(accept=[1], bonus=[3], fold=False)
        for _ in range(40):
            w.forward_batch_generation(FakeBatch("decode"))
    st = w._ddtree()
    st.drain(wait=True)
    assert w._draft_sampler is None and st.path == "eager" and w.eager_rounds == 40
    assert 5 < st.sent < 35 and calls == st.sent == st.accounted        # top-K only on sampled rounds
    said = [r.getMessage() for r in caplog.records if "top-K taken" in r.getMessage()]
    assert said == ["DDTREE shadow: top-K taken on the eager draft head on sampled rounds "
                    "(DFlash keeps its draft head eager)"]


def test_a_batch_beyond_the_captured_sizes_takes_the_eager_head(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddtree_ops.engine.sglang_shadow import ShadowWorkerMixin

    shadow_env(monkeypatch, DDTREE_SHADOW_SHARE="1.0", DDTREE_BUDGET="4")

    class Worker(ShadowWorkerMixin, FakeDFlash):
        pass

    w = Worker(accept=[0, 1, 2], bonus=[1, 2, 3], max_bs=2)     # bs 3 > the largest graph
    w.forward_batch_generation(FakeBatch("decode"))
    st = w._ddtree()
    st.drain(wait=True)
    assert st.path == "graph" and w.eager_rounds == 1 and st.accounted == 3


def test_a_sampled_round_is_one_pack_one_copy_from_pooled_buffers() -> None:
    from ddtree_ops.engine.sglang_transfer import RoundTransfer

    t = RoundTransfer()
    g = torch.Generator().manual_seed(4)
    for r in range(50):
        bs = 1 + r % 3
        parts = [torch.randint(0, 99, (bs * 3, 4), generator=g), torch.randint(-99, 0, (bs * 3, 4), generator=g),
                 torch.randint(0, 99, (bs, 4), generator=g), torch.tensor([2] * bs, dtype=torch.int32),
                 torch.arange(bs), torch.arange(bs) + 100]
        landing = t.send(parts, meta=r)
        got = landing.parts()
        assert [len(x) for x in got] == [p.numel() for p in parts]
        assert all(x == p.reshape(-1).tolist() for x, p in zip(got, parts))
        t.release(landing)
    assert t.sent == 50 and t.host_allocs == 1       # one host buffer served every round


def test_events_come_from_a_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddtree_ops.engine.sglang_transfer import Landing, RoundTransfer

    made = []

    class FakeEvent:
        def __init__(self) -> None:
            made.append(self)

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    t = RoundTransfer()
    inflight = []
    for r in range(30):
        inflight.append(Landing(None, t._take_event(), [], 0, None))
        if len(inflight) > 2:                           # three rounds in flight at most
            t.release(inflight.pop(0))
    assert len(made) == 3 and t.event_allocs == 3


# ------------------------------------------------------------------ the hidden-state relay


def relay_function(version: str) -> Any:
    """The release's own `spec_need_hidden_states`, executed from its source with its config
    lookups answered by `config` (0.5.17: get_server_args(); 0.5.23: get_spec())."""
    src = sglang_file(version, "sglang/srt/speculative/spec_utils.py")
    assert src is not None
    fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "spec_need_hidden_states")
    config = types.SimpleNamespace(speculative_algorithm=None, enable_multi_layer_eagle=False)
    scope: dict[str, Any] = {"get_server_args": lambda: config, "get_spec": lambda: config, "Optional": Any,
                             "ServerArgs": Any}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), f"<sglang {version} spec_utils>", "exec"), scope)
    module = types.ModuleType(f"spec_utils_{version}")
    module.spec_need_hidden_states = scope["spec_need_hidden_states"]
    return module, config


@pytest.mark.parametrize("version", VERSIONS)
def test_relay_decision_is_dflash_for_ddtree_after_the_exemption(version: str) -> None:
    from ddtree_ops.engine.sglang_relay import exempt_module

    module, config = relay_function(version)
    answers = {}
    for algo in ("DFLASH", "DDTREE", "EAGLE"):
        config.speculative_algorithm = algo
        answers[algo] = module.spec_need_hidden_states()
    assert answers == {"DFLASH": False, "DDTREE": True, "EAGLE": True}      # the string test: DDTREE relays
    assert exempt_module(module) and exempt_module(module)                  # idempotent
    config.speculative_algorithm = "DDTREE"
    assert module.spec_need_hidden_states() is False
    assert module.spec_need_hidden_states.ddtree_original.__name__ == "spec_need_hidden_states"


@pytest.mark.parametrize("version", VERSIONS)
def test_every_caller_reads_the_relay_decision_from_spec_utils_at_call_time(version: str) -> None:
    """The exemption replaces a module attribute: it reaches a caller only if the caller imports
    the function inside a function (at call time), never at module level."""
    callers = {"0.5.17": "sglang/srt/managers/overlap_utils.py", "0.5.23": "sglang/srt/managers/overlap_utils.py"}
    src = sglang_file(version, callers[version])
    assert src is not None
    tree = ast.parse(src)
    top_level = [n for n in tree.body if isinstance(n, ast.ImportFrom)
                 and any(a.name == "spec_need_hidden_states" for a in n.names)]
    inside = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n not in top_level
              and any(a.name == "spec_need_hidden_states" for a in n.names)]
    assert not top_level and inside
    assert all(n.module == "sglang.srt.speculative.spec_utils" for n in inside)


def test_worker_factory_exempts_ddtree_in_the_scheduler_process(monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    from ddtree_ops.engine import sglang_plugin
    from ddtree_ops.engine.sglang_relay import PATCHED

    module, config = relay_function("0.5.17")
    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.spec_utils", module)
    worker_mod = types.ModuleType("ddtree_ops.engine.sglang_worker")
    worker_mod.DDTreeShadowWorker = object
    worker_mod.DDTreeTreeWorker = type("DDTreeTreeWorker", (), {})
    monkeypatch.setitem(sys.modules, "ddtree_ops.engine.sglang_worker", worker_mod)
    with caplog.at_level("INFO", logger="ddtree_ops.engine.sglang"):
        sglang_plugin.worker_factory(types.SimpleNamespace(speculative_algorithm="EAGLE"))
        config.speculative_algorithm = "DDTREE"
        assert module.spec_need_hidden_states() is True                  # not a DDTREE process: untouched
        assert sglang_plugin.worker_factory(types.SimpleNamespace(speculative_algorithm="DDTREE")) is object
    assert module.spec_need_hidden_states() is False
    assert [r.getMessage() for r in caplog.records].count(PATCHED) == 1
