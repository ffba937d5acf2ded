"""The stand-in's pure parts (no lab, no sglang): KV sizing, the decision table, nvidia-smi formats,
per-request acceptance figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddtree_ops.lab.standin import behaviour, memory, nvidia_smi, simgpu, textgen

FIX = Path(__file__).resolve().parents[2] / "ddtree_ops" / "lab" / "fixtures"


def cfg(name: str, file: str = "config.json") -> dict:
    return json.loads((FIX / name / file).read_text())


TARGET, INDEX = cfg("Qwen3-8B"), cfg("Qwen3-8B", "model.safetensors.index.json")
DFLASH, NEXTN = cfg("Qwen3-8B-DFlash-b16"), cfg("Qwen3-8B-NextN")
A6000, PRO6000 = 49140, 97887


def inputs(**kw: object) -> behaviour.Inputs:
    base = dict(algorithm="DFLASH", kind="dflash", target_cfg=TARGET, target_index=INDEX, draft_cfg=DFLASH,
                total_mib=A6000, others_mib=0, mem_fraction_static=0.85, context_length=32768,
                max_running_requests=4, cuda_graph_max_bs=8)
    base.update(kw)
    return behaviour.Inputs(**base)  # type: ignore[arg-type]


# ---------------------------------------------------------------- fixtures are the real shapes


def test_fixture_weights_match_the_shapes() -> None:
    s = memory.Shape.from_config(TARGET)
    assert (s.layers, s.hidden, s.heads, s.kv_heads, s.head_dim, s.intermediate, s.vocab) == \
        (36, 4096, 32, 8, 128, 12288, 151936)
    assert INDEX["metadata"]["total_size"] == s.params() * 2 == 16_381_470_720
    assert DFLASH["dflash_config"]["target_layer_ids"] == [1, 9, 17, 25, 33] and DFLASH["block_size"] == 16


# ---------------------------------------------------------------- memory


def test_dflash_on_the_48gb_host_holds_140_to_150k_tokens() -> None:
    p = behaviour.plan(inputs())
    assert 140_000 <= p.pool.tokens <= 150_000
    assert p.pool.cell == 147_456 + 20_480  # target 144 KiB + the 5-layer draft's 20 KiB per token
    assert p.failure is None


def test_agrees_with_the_preflight_formula() -> None:
    """The lead's preflight (ddtree_ops.memory) predicts independently; they must agree closely."""
    from ddtree_ops import memory as preflight

    for total, mfs, draft in ((A6000, 0.85, DFLASH), (A6000, 0.88, DFLASH), (PRO6000, 0.84, DFLASH)):
        ours = behaviour.plan(inputs(total_mib=total, mem_fraction_static=mfs)).pool.tokens
        t = preflight.model_shape(TARGET)
        theirs = preflight.plan(gpu_total_mib=total, free_mib=total, target=t, weights=preflight.weights_bytes(TARGET, INDEX),
                                draft_cell=preflight.model_shape(draft).cell_bytes(),
                                draft_weights=preflight.draft_weights_bytes(draft, t), mem_fraction_static=mfs,
                                context_length=1, concurrency=1).tokens
        assert abs(ours - theirs) / theirs < 0.03, (total, mfs, ours, theirs)


def test_long_context_does_not_fail_the_server_itself() -> None:
    # 131072 x 4 does not fit in ~157k tokens (preflight refuses it) but SGLang starts anyway
    p = behaviour.plan(inputs(mem_fraction_static=0.88, context_length=131072, allow_longer_context=True))
    assert p.failure is None and 0 < p.pool.tokens < 131072 * 4
    assert any("greater than the derived context_length (40960)" in w for w in p.warnings)


def test_longer_context_than_the_model_without_the_env_var_is_sglangs_value_error() -> None:
    p = behaviour.plan(inputs(context_length=131072))
    assert p.failure == "context"
    assert p.failure_message.endswith("set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1")


def test_a_stray_30gb_process_leaves_no_room() -> None:
    p = behaviour.plan(inputs(others_mib=30 * 1024))
    assert p.failure == "weights-leave-no-kv" and p.pool.tokens == 0 and p.pool.rest <= 0
    # 0.5.17's text when the weights leave no rest (real: 3_ddtree_s025_shared_gpu, 4_kv_too_small)
    assert p.failure_message.startswith("Loaded weights leave no GPU memory for the KV cache under "
                                        "--mem-fraction-static=0.85. Raise --mem-fraction-static above ")
    minimum = 1 - p.pool.post / p.pool.pre
    assert f"(minimum viable = 1 - available/pre = {minimum:.4f})" in p.failure_message



def test_nextn_cell_adds_the_eagle_draft_layer() -> None:
    p = behaviour.plan(inputs(algorithm="NEXTN", kind="eagle", draft_cfg=NEXTN, mem_fraction_static=0.81,
                              num_steps=3, eagle_topk=1, num_draft_tokens=4))
    assert p.pool.cell == 147_456 + 147_456 // 36
    assert p.draft_window == 4 and p.tokens_per_req == 4 and p.failure is None


def test_graphs_come_out_of_the_headroom_not_the_pool() -> None:
    on = behaviour.plan(inputs()).pool
    off = behaviour.plan(inputs(cuda_graph=False)).pool
    assert on.tokens == off.tokens and on.graph > 0 and off.graph == 0
    assert on.avail_after_graph < off.avail_after_graph


def test_graph_capture_fails_when_the_fraction_leaves_nothing() -> None:
    p = behaviour.plan(inputs(mem_fraction_static=0.999))
    assert p.failure == "graph-oom"


def test_default_fraction_follows_sglangs_heuristic() -> None:
    assert memory.default_mem_fraction(A6000, speculative="DFLASH", chunked_prefill=4096, cuda_graph_max_bs=32) == \
        pytest.approx(0.819, abs=0.002)


# ---------------------------------------------------------------- decisions


TINY = Path(__file__).resolve().parents[2] / "bench" / "realsglang" / "models"
TINY_TARGET = json.loads((TINY / "tiny-qwen3" / "config.json").read_text())
TINY_DRAFT = json.loads((TINY / "tiny-qwen3-dflash" / "config.json").read_text())


def tiny(layer_ids: list[int] | None = None, **kw: object) -> behaviour.Plan:
    """The real runs' models (4-layer Qwen3, 1-layer DFlash draft) on the H200 of the real runs."""
    draft = json.loads(json.dumps(TINY_DRAFT))
    if layer_ids is not None:
        draft["dflash_config"]["target_layer_ids"] = layer_ids
    base = dict(algorithm="DDTREE", kind="dflash", target_cfg=TINY_TARGET, target_index=None, draft_cfg=draft,
                total_mib=143771, others_mib=0, mem_fraction_static=0.2, context_length=2048, cuda_graph_max_bs=8)
    base.update(kw)
    return behaviour.plan(behaviour.Inputs(**base))  # type: ignore[arg-type]


# The three real forms of "DDTREE without DFlash-family hidden capture", chosen by what the
# registered spec class answers (tests/data/real-sglang/0.5.17: 2_neg_plain_graph,
# 1_neg_nonfamily_graph_layers13, 2_neg_nonfamily_nograph)


def test_plain_custom_algorithm_with_graphs_dies_sizing_the_graphs() -> None:
    # no server-args hook: --speculative-num-draft-tokens stays unset, the graphs are sized by None
    p = tiny(kind="custom", dflash_hook=False, verify_for_draft=False)
    assert p.failure == "graph-shape" and p.block is None
    assert p.failure_message == "unsupported operand type(s) for *: 'int' and 'NoneType'"
    assert not any("Max running requests" in w for w in p.warnings)
    assert p.worker == "dflash" and p.draft_window == 8  # the DFlash worker falls back to the draft's block


def test_non_family_subclass_with_graphs_dies_at_the_draft_graph() -> None:
    p = tiny(kind="custom", dflash_hook=True, verify_for_draft=False)
    assert p.failure == "draft-graph" and p.failure_message == "This should not happen"
    assert p.block == 8 and any("Max running requests is reset to 48" in w for w in p.warnings)


def test_non_family_without_graphs_dies_at_the_first_prefill() -> None:
    p = tiny(kind="custom", dflash_hook=True, verify_for_draft=False, cuda_graph=False)
    assert p.failure == "hidden-dim"
    assert (p.hidden_expected, p.hidden_got) == (512, 256)  # 2 features x 256 expected, the final hidden state got
    assert p.capture_layers is None and p.pool.draft_cell == 0 and p.side_draft_cell == 256 * 2


def test_plain_custom_algorithm_without_graphs_dies_at_the_first_prefill_too() -> None:
    # no real log for this one: without graphs nothing is sized by the unset width
    assert tiny(kind="custom", dflash_hook=False, verify_for_draft=False, cuda_graph=False).failure == "hidden-dim"


def test_a_draft_layer_at_the_targets_last_layer_is_never_captured() -> None:
    # Qwen3 captures before layer id + 1: id 3 of 4 layers has no "before layer 4" (1_dflash_layers13)
    p = tiny([1, 3], algorithm="DFLASH")
    assert p.failure == "hidden-dim" and (p.hidden_expected, p.hidden_got) == (512, 256)
    ok = tiny([0, 2], algorithm="DFLASH")
    assert ok.failure is None and ok.capture_layers == [0, 2] and ok.accept_mean > 1


def test_family_pool_counts_the_draft_and_non_family_allocates_it_beside() -> None:
    family, other = tiny([0, 2]), tiny([0, 2], kind="custom", dflash_hook=True, verify_for_draft=False)
    assert family.pool.draft_cell == 2 * 2 * 64 * 1 * 2 and other.pool.draft_cell == 0
    # the real pools: 11644462 (DFLASH, 2_dflash) and 14555577 (not family, 2_neg_nonfamily_nograph)
    assert abs(family.pool.tokens - 11_644_462) / 11_644_462 < 0.02
    assert abs(other.pool.tokens - 14_555_577) / 14_555_577 < 0.02


def test_graph_lists_are_sglangs() -> None:
    p = tiny([0, 2], cuda_graph_max_bs_prefill=256)
    assert p.graph_bs == [1, 2, 3, 4, 5, 6, 7, 8]  # speculative: dense up to 8 (2_dflash)
    assert p.prefill_graph_tokens[-1] == 256 and len(p.prefill_graph_tokens) == 22
    base = tiny(algorithm=None, kind="none", draft_cfg=None)
    assert base.graph_bs == [1, 2, 4, 8] and base.max_running_requests == 4096  # 1_base_graph


def test_dflash_family_without_layer_ids_serves_with_acceptance_one() -> None:
    draft = {k: v for k, v in DFLASH.items() if k != "dflash_config"}
    p = behaviour.plan(inputs(draft_cfg=draft))
    assert p.failure is None and p.accept_mean == 1.0


@pytest.mark.parametrize("fault,attr", [("hang", "hang"), ("slow-start", "slow_start"),
                                        ("crash-after-ready", "crash_after_ready")])
def test_faults_set_their_flag(fault: str, attr: str) -> None:
    assert getattr(behaviour.plan(inputs(faults=frozenset({fault}))), attr) is True


def test_libcuda_fault_wins_over_everything_after_it() -> None:
    assert behaviour.plan(inputs(faults=frozenset({"libcuda-missing"}), others_mib=40000)).failure == "libcuda"


def test_accept_collapse() -> None:
    assert behaviour.plan(inputs(faults=frozenset({"accept-collapse"}))).accept_mean == 1.0


# ---------------------------------------------------------------- per-request acceptance


@pytest.mark.parametrize("mean,spread,cap,lo,hi", [(2.9, 0.35, 4, 2.5, 3.5), (4.6, 0.6, 16, 3.5, 5.5)])
def test_spec_accept_length_stays_in_the_modes_range(mean: float, spread: float, cap: int, lo: float, hi: float) -> None:
    for i in range(200):
        st = textgen.spec_stats(f"prompt {i}", 64, mean=mean, spread=spread, cap=cap)
        assert lo - 0.2 <= st.accept_length <= min(hi, cap)
        assert st.accept_length == pytest.approx(64 / st.verify_ct)


def test_collapsed_acceptance_is_exactly_one() -> None:
    st = textgen.spec_stats("x", 16, mean=1.0, spread=0.0, cap=16)
    assert st.verify_ct == 16 and st.accept_length == 1.0


def test_generation_is_deterministic() -> None:
    assert textgen.continuation("hello", 8) == textgen.continuation("hello", 8)
    toks, finish = textgen.continuation("The capital of France is", 16)
    assert "".join(toks).startswith(" Paris.") and finish == "length" and len(toks) == 16


# ---------------------------------------------------------------- nvidia-smi


CARD = simgpu.Card(index=0, name="NVIDIA RTX A6000", uuid="GPU-abc", memory_mib=49140, compute_cap="8.6",
                   driver_version="570.172.08", cuda_version="12.8", pci_bus_id="00000000:01:00.0", power_limit_w=300)
HOLDER = simgpu.Holder(pid=812, used_mib=40232, process_name="/opt/sglang/venv/bin/python")


def smi(*argv: str, holders: list[simgpu.Holder] | None = None) -> tuple[str, str, int]:
    return nvidia_smi.run(list(argv), CARD, [HOLDER] if holders is None else holders)


def test_query_gpu_csv_with_header_and_units() -> None:
    out, _, rc = smi("--query-gpu=index,name,memory.total,memory.used,compute_cap", "--format=csv")
    assert rc == 0
    assert out == ("index, name, memory.total [MiB], memory.used [MiB], compute_cap\n"
                   "0, NVIDIA RTX A6000, 49140 MiB, 40232 MiB, 8.6\n")


def test_query_gpu_noheader_nounits() -> None:
    out, _, rc = smi("--query-gpu=index,uuid,memory.free,driver_version,utilization.gpu", "--format=csv,noheader,nounits")
    assert (out, rc) == ("0, GPU-abc, 8908, 570.172.08, 0\n", 0)


def test_unknown_field_is_nvidia_smis_error() -> None:
    out, err, rc = smi("--query-gpu=index,cuda_version", "--format=csv")
    assert (out, err, rc) == ('Field "cuda_version" is not a valid field to query.\n\n', "", 2)


def test_compute_apps() -> None:
    out, _, rc = smi("--query-compute-apps=gpu_uuid,pid,process_name,used_memory", "--format=csv")
    assert out == ("gpu_uuid, pid, process_name, used_gpu_memory [MiB]\n"
                   "GPU-abc, 812, /opt/sglang/venv/bin/python, 40232 MiB\n")
    empty, _, _ = smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader", holders=[])
    assert empty == ""


def test_list_and_table() -> None:
    assert smi("-L")[0] == "GPU 0: NVIDIA RTX A6000 (UUID: GPU-abc)\n"
    table = smi()[0]
    assert "Driver Version: 570.172.08" in table and "40232MiB /  49140MiB" in table and "LAB STAND-IN" in table


def test_registry_ignores_dead_processes(tmp_path: Path) -> None:
    import os

    simgpu.register(1000, pid=os.getpid(), registry=tmp_path)
    simgpu.register(2000, pid=2**22 - 3, registry=tmp_path)  # no such pid
    assert simgpu.used_mib(tmp_path) == 1000
    assert not (tmp_path / f"{2**22 - 3}.json").exists()


# ---------------------------------------------------------------- per-round commits


def test_round_commits_add_up_to_the_completion() -> None:
    for i in range(50):
        st = textgen.spec_stats(f"p{i}", 48, mean=4.6, spread=0.6, cap=8)
        commits = textgen.round_commits(f"p{i}", 48, st.verify_ct)
        assert sum(commits) == 48 and len(commits) == st.verify_ct and 1 <= min(commits) <= max(commits) <= 8


# ---------------------------------------------------------------- milestones (the conformance test's rules)

REAL_LOG = (Path(__file__).resolve().parents[2] / "tests" / "data" / "real-sglang" / "0.5.17" / "2_dflash.log").read_text()


def test_a_log_conforms_to_itself_whatever_its_numbers() -> None:
    from ddtree_ops.lab.standin import milestones

    other = REAL_LOG.replace("2026-12-01 17:5", "2031-01-09 08:0").replace("pid=464", "pid=99").replace(
        "31001", "40404").replace("/opt/sglang/venv/lib/python3.12/", "/srv/venv/lib/python3.11/")
    assert milestones.compare(REAL_LOG, other).ok


def test_a_missing_or_reordered_milestone_is_named() -> None:
    from ddtree_ops.lab.standin import milestones

    lines = REAL_LOG.splitlines()
    ready = next(i for i, ln in enumerate(lines) if "fired up" in ln)
    without = "\n".join(lines[:ready] + lines[ready + 1:])
    rep = milestones.compare(REAL_LOG, without)
    assert not rep.ok and "The server is fired up and ready to roll!" in rep.explain()
    moved = "\n".join([lines[ready]] + lines[:ready] + lines[ready + 1:])
    assert not milestones.compare(REAL_LOG, moved).ok


def test_a_milestone_the_real_log_lacks_fails_but_the_plugins_lines_do_not() -> None:
    from ddtree_ops.lab.standin import milestones

    extra = REAL_LOG + "\n[2026-12-01 17:55:00] Received sigquit from a child process. It usually means the child failed."
    rep = milestones.compare(REAL_LOG, extra)
    assert not rep.ok and rep.extra[0].name == "launch_sigquit"
    plugin = REAL_LOG + ("\nDDTREE plugin: registered DDTREE as a DFlash-family algorithm (sglang 0.5.17, shadow-linear)"
                         "\n[2026-12-01 17:55:00] DDTREE registered as DFlash-family, hidden capture layers [0, 2]")
    assert milestones.compare(REAL_LOG, plugin).ok


def test_kv_pool_within_two_percent() -> None:
    from ddtree_ops.lab.standin import milestones

    assert milestones.kv_tokens(REAL_LOG) == [11644462, 11644462]
    near = REAL_LOG.replace("#tokens: 11644462", "#tokens: 11800000")
    far = REAL_LOG.replace("#tokens: 11644462", "#tokens: 12000000")
    assert milestones.compare(REAL_LOG, near).ok
    rep = milestones.compare(REAL_LOG, far)
    assert not rep.ok and "+3.05%" in rep.explain()


# ---------------------------------------------------------------- the ddtree plugin in the stand-in


def test_only_the_ddtree_plugins_worker_runs_its_shadow() -> None:
    from types import SimpleNamespace

    from ddtree_ops.engine import sglang_plugin
    from ddtree_ops.lab.standin import shadow

    assert shadow.is_plugin_worker(SimpleNamespace(factory=sglang_plugin.worker_factory))
    assert not shadow.is_plugin_worker(SimpleNamespace(factory=lambda sa: object))
    assert not shadow.is_plugin_worker(object())  # an enum algorithm (DFLASH): no factory at all


def test_without_torch_the_shadow_is_off_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from ddtree_ops.lab.standin import shadow

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    assert shadow.plugin_mixin() == (None, "torch is not installed")


def test_the_plugins_gauges_without_prometheus_client() -> None:
    """The lab's venv has no prometheus_client: the plugin's own ShadowMetrics still names and sets its
    gauges, through the stand-in's recorder, in Prometheus text format."""
    import sys

    from ddtree_ops.engine.shadow import BoundTally
    from ddtree_ops.lab.standin import shadow

    recorder = shadow._recorder_module()
    saved = sys.modules.get("prometheus_client")
    sys.modules["prometheus_client"] = recorder
    from ddtree_ops.engine.sglang_metrics import ShadowMetrics

    # one set of gauges per process: an earlier test's (made with the real prometheus_client) must
    # not stand in for the recorder's
    shared, ShadowMetrics._shared = ShadowMetrics._shared, None
    try:
        metrics = ShadowMetrics()
    finally:
        ShadowMetrics._shared = shared
        if saved is not None:
            sys.modules["prometheus_client"] = saved
    tally = BoundTally(3)
    for chain, lower in ((2, 3), (1, 1), (4, 4)):
        tally.add(chain, lower)
    metrics.publish(tally.report())
    text = recorder.render()
    assert "# TYPE ddtree_shadow_rounds gauge\nddtree_shadow_rounds 3.0\n" in text
    assert 'ddtree_shadow_sibling_hits{depth="2"} 1.0' in text
    assert "ddtree_shadow_tau_chain 2.3333333333333335" in text


def test_the_collector_is_paused_for_the_import_and_parse_only() -> None:
    """main() imports SGLang and parses the argv with the cyclic collector paused, and the server runs
    with it on again: also when the parse ends the process (argparse's exit 2), whose interpreter still
    shuts down as usual."""
    import gc

    from ddtree_ops.lab.standin.server import collector_paused

    with pytest.raises(SystemExit):
        with collector_paused():
            assert not gc.isenabled()
            raise SystemExit(2)
    assert gc.isenabled()
