"""The stand-in's parallel ranks as local processes (no lab): one rank process per card, each holding
memory on its own card; rank-prefixed log lines in SGLang's form; a real TCP rendezvous between two
"nodes" (two stand-ins with two simulated hosts' cards) at --dist-init-addr; a dead peer takes the
survivor down after the timeout with NCCL's watchdog lines."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from ports import free_port
from standin_proc import A6000, Standin, nextn_argv, start

from ddtree_ops.diagnose.classify import Scanner
from ddtree_ops.lab.standin import simgpu
from ddtree_ops.lab.standin.nvidia_smi import run as smi

TWO_CARDS = {**A6000, "cards": [{**A6000, "index": 0, "uuid": "GPU-test-0", "pci_bus_id": "00000000:01:00.0"},
                                {**A6000, "index": 1, "uuid": "GPU-test-1", "pci_bus_id": "00000000:02:00.0"}]}


def holders(s: Standin) -> list[simgpu.Holder]:
    return simgpu.holders(s.dir / "reg")


def verdict(log: str) -> tuple[str, str | None, str | None]:
    sc = Scanner()
    sc.feed(log.splitlines())
    sc.finish()
    r = sc.report()
    return r.verdict, r.root_cause.label if r.root_cause else None, r.root_cause.role if r.root_cause else None


def test_tp2_starts_one_rank_process_per_card(tmp_path: Path) -> None:
    port = free_port()
    s = start(tmp_path / "tp2", nextn_argv(port) + ["--tp-size", "2"], port=port, card=TWO_CARDS,
              env={"CUDA_VISIBLE_DEVICES": "0,1"})
    try:
        assert s.wait_ready(90), s.log()[-3000:]
        held = holders(s)
        by_card = {h.card: h for h in held}
        assert set(by_card) == {0, 1}, held  # one process on each card, neither is the launcher
        assert by_card[0].pid != by_card[1].pid and s.proc.pid not in {h.pid for h in held}
        assert abs(by_card[0].used_mib - by_card[1].used_mib) < 2
        log = s.log()
        for rank in ("TP0", "TP1"):
            assert re.search(rf"^\[\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d {rank}\] Load weight end\. ", log, re.M), log[-2000:]
        # uvicorn's lines are the launcher's: no rank prefix
        assert re.search(r"^\[[\d :-]+\] INFO:     Uvicorn running on", log, re.M)
        # nvidia-smi lists both cards, each with its own process
        out, _, rc = smi(["--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"],
                         simgpu.load_cards(s.dir / "gpu.json"), held)
        rows = [r.split(", ") for r in out.splitlines()]
        assert rc == 0 and sorted(r[0] for r in rows) == ["GPU-test-0", "GPU-test-1"]
        # the weights are split: each rank holds half of Qwen3-8B's 15.3 GiB
        usage = [float(x) for x in re.findall(r"TP\d\] Load weight end\..*? mem usage=([\d.]+) GB", log)]
        assert len(usage) >= 2 and all(7.0 < u < 8.2 for u in usage[:2]), usage
    finally:
        s.stop()


@pytest.mark.slow  # ~20 s: 12 s of two quiet peers
def test_two_nodes_meet_at_the_rendezvous_and_a_dead_peer_takes_the_other_down(tmp_path: Path) -> None:
    store, p0, p1 = free_port(), free_port(), free_port()
    common = ["--tp-size", "2", "--nnodes", "2", "--dist-init-addr", f"127.0.0.1:{store}", "--dist-timeout", "4"]
    n0 = start(tmp_path / "n0", nextn_argv(p0) + common + ["--node-rank", "0"], port=p0)
    n1 = start(tmp_path / "n1", nextn_argv(p1) + common + ["--node-rank", "1"], port=p1)
    try:
        assert n0.wait_ready(90), n0.log()[-3000:]
        assert n1.wait_ready(60), n1.log()[-3000:]  # the dummy health server of a node other than rank 0
        assert n1.get("/generate")[0] == 404  # it serves no API
        assert re.search(r"^\[[\d :-]+ TP1\] Load weight end\.", n1.log(), re.M)
        assert re.search(r"^\[[\d :-]+ TP0\] Load weight end\.", n0.log(), re.M)
        time.sleep(12)  # a quiet peer is a live one: nothing happens while both live
        assert n0.proc.poll() is None and n0.get("/health_generate")[0] == 200
        n1.proc.kill()  # the node dies without a word (SIGKILL to its process group)
        code = n0.wait_exit(30)
        assert code != 0
        log = n0.log()
        assert "Watchdog caught collective operation timeout" in log
        assert verdict(log)[1:] == ("watchdog_timeout", "downstream")  # a symptom, not a cause
    finally:
        n0.stop()
        n1.stop()


def test_a_node_that_never_reaches_the_store_times_out_with_torchs_message(tmp_path: Path) -> None:
    store, p1 = free_port(), free_port()
    n1 = start(tmp_path / "n1", nextn_argv(p1) + ["--tp-size", "2", "--nnodes", "2", "--node-rank", "1",
                                                   "--dist-init-addr", f"127.0.0.1:{store}", "--dist-timeout", "3"],
               port=p1)
    try:
        assert n1.wait_exit(40) != 0
        log = n1.log()
        assert "The client socket has failed to connect to" in log
        assert "DistNetworkError: The client socket has timed out after 3000ms while trying to connect to " \
               f"(127.0.0.1, {store})" in log
    finally:
        n1.stop()


def test_rank_oom_names_the_rank_that_failed(tmp_path: Path) -> None:
    port = free_port()
    s = start(tmp_path / "oom", nextn_argv(port) + ["--tp-size", "2"], port=port, card=TWO_CARDS,
              faults=("rank-oom",), env={"CUDA_VISIBLE_DEVICES": "0,1"})
    try:
        assert s.wait_exit(60) != 0
        log = s.log()
        assert re.search(r"^\[[\d :-]+ TP1\] Scheduler hit an exception", log, re.M), log[-2000:]
        assert verdict(log)[1] == "cuda_oom"
    finally:
        s.stop()


def test_visible_cards_follow_cuda_visible_devices() -> None:
    cards = [simgpu.Card(i, "x", f"u{i}", 100, "8.6", "1", "12", "b", 300) for i in range(3)]
    assert [c.index for c in simgpu.visible_cards(cards, "2,0")] == [2, 0]
    assert [c.index for c in simgpu.visible_cards(cards, "1,7,2")] == [1]  # CUDA stops at a bad index
    assert simgpu.visible_cards(cards, "") == []
