"""Several GPUs per host and several hosts per model, as pure functions: the profile's parallel,
gpus and multinode sections and their rules (file, line, key), the launch line and environment,
preflight per card (free memory and strays on every owned card, the KV pool from the least free
card, weights split over the ranks, the TP that would fit), and the multi-node service's verdicts
(the first failing rank, the service gate, smoke, history)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ddtree_ops import memory
from ddtree_ops.errors import ProfileError
from ddtree_ops.gate import GateConfig, GateState, Status, service_verdict
from ddtree_ops.gpu import Gpu, GpuApp, GpuSnapshot
from ddtree_ops.config.inventory import Inventory
from ddtree_ops.lab import hosts as lab_hosts
from ddtree_ops.preflight import FAIL, OK, WARN, Preflight, check_gpu, check_models
from ddtree_ops.profile import load_profile
from ddtree_ops.render import render, render_service

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "ddtree_ops" / "lab" / "fixtures"
PRO = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"


@pytest.fixture
def profiles(tmp_path: Path) -> Path:
    d = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", d)
    return d


@pytest.fixture
def lab_inventory(tmp_path: Path) -> Path:
    """The lab's inventory for six hosts, as `lab up --hosts 6` writes it."""
    p = tmp_path / "inventory.yaml"
    p.write_text(lab_hosts.inventory_text(lab_hosts.lab_hosts(6), "test"))
    return p


def tp2(profiles: Path, extra: str = "") -> Path:
    (profiles / "ct200.yaml").write_text((profiles / "ct200.yaml").read_text().replace(
        "gpu:\n", "parallel:\n  tp_size: 2\ngpus: [0, 1]\n" + extra + "gpu:\n  count: 2\n", 1))
    return profiles


def by_name(pf: Preflight, name: str) -> object:
    return next(c for c in pf.checks if c.name == name)


# ------------------------------------------------------------------ profiles


def test_tp2_profile_renders_its_sizes_and_cards(profiles: Path) -> None:
    p = load_profile("ct200", directory=tp2(profiles))
    r = render(p, "nextn")
    assert r.argv[-2:] == ("--tp-size", "2")
    assert "CUDA_VISIBLE_DEVICES=0,1" in r.env_redacted.splitlines()
    assert [c.index for c in p.cards()] == [0, 1]


def test_single_gpu_profiles_render_as_before() -> None:
    for host in ("ct129", "ct200"):
        r = render(load_profile(host, directory=REPO / "profiles"), "nextn")
        assert "--tp-size" not in r.argv and "CUDA_VISIBLE_DEVICES" not in r.env_redacted


def test_tp_size_one_renders_through_the_new_fields(profiles: Path) -> None:
    """The single-GPU path of the same code (what the H200 runs): tp 1, one card named."""
    path = profiles / "ct200.yaml"
    path.write_text(path.read_text().replace("gpu:\n", "parallel: {tp_size: 1}\ngpus: [0]\ngpu:\n", 1))
    r = render(load_profile("ct200", directory=profiles), "nextn")
    assert r.argv[-2:] == ("--tp-size", "1") and "CUDA_VISIBLE_DEVICES=0" in r.env_redacted.splitlines()


def test_cards_that_do_not_match_the_sizes_are_named_with_file_line_and_key(profiles: Path) -> None:
    path = profiles / "ct200.yaml"
    path.write_text(path.read_text().replace("gpu:\n", "parallel:\n  tp_size: 2\ngpus: [0]\ngpu:\n", 1))
    line = path.read_text().splitlines().index("gpus: [0]") + 1
    with pytest.raises(ProfileError) as exc:
        load_profile("ct200", directory=profiles)
    (msg,) = exc.value.problems
    assert f"ct200.yaml:{line} gpus:" in msg and "1 card(s) listed" in msg and "tp 2" in msg


def test_tp_without_cards_asks_for_them(profiles: Path) -> None:
    path = profiles / "ct200.yaml"
    path.write_text(path.read_text().replace("gpu:\n", "parallel:\n  tp_size: 4\ngpu:\n", 1))
    with pytest.raises(ProfileError) as exc:
        load_profile("ct200", directory=profiles)
    assert any("parallel.tp_size" in m and "gpus: [0, 1, 2, 3]" in m for m in exc.value.problems)


def test_a_card_listed_twice_and_a_bad_card_entry(profiles: Path) -> None:
    path = profiles / "ct200.yaml"
    path.write_text(path.read_text().replace("gpu:\n", "parallel: {tp_size: 2}\ngpus: [1, 1]\ngpu:\n", 1))
    with pytest.raises(ProfileError) as exc:
        load_profile("ct200", directory=profiles)
    assert any("gpus.1.index" in m and "listed twice" in m for m in exc.value.problems)
    path.write_text(path.read_text().replace("gpus: [1, 1]", "gpus: [0, x]"))
    with pytest.raises(ProfileError) as exc:
        load_profile("ct200", directory=profiles)
    assert any("gpus.1" in m and "card index" in m for m in exc.value.problems)


def test_flags_rendered_from_the_parallel_section_are_refused_in_extra_args(profiles: Path) -> None:
    path = profiles / "ct200.yaml"
    path.write_text(path.read_text().replace("service:\n", "service:\n  extra_args: [--tp-size, '2']\n", 1))
    with pytest.raises(ProfileError) as exc:
        load_profile("ct200", directory=profiles)
    assert any("service.extra_args.0" in m and "parallel.tp_size" in m for m in exc.value.problems)


def test_the_example_tp2_group_and_two_card_hosts(lab_inventory: Path) -> None:
    inv = Inventory.load(REPO / "profiles", str(lab_inventory))
    assert inv.profile("ct200").gpu.count == 1 and inv.profile("ct201").gpu.count == 2
    p = inv.profile("ct201", ["parallel.tp_size=2", "gpus=[0, 1]"])
    assert p.sizes.tp_size == 2 and [c.index for c in p.cards()] == [0, 1]
    group = (REPO / "profiles/groups/tp2.yaml").read_text()
    assert "tp_size: 2" in group and "gpus: [0, 1]" in group


# ------------------------------------------------------------------ a two-node service


def test_two_node_service_same_line_but_the_node_rank_one_release(lab_inventory: Path) -> None:
    inv = Inventory.load(REPO / "profiles", str(lab_inventory))
    assert inv.services() == ["pro6000-pair"]
    nodes = inv.service_profiles("pro6000-pair")
    assert [p.name for p in nodes] == ["ct201", "ct202"]
    rs = render_service(nodes, "nextn")
    assert rs[0].release_id == rs[1].release_id
    a, b = list(rs[0].argv), list(rs[1].argv)
    diff = [(x, y) for x, y in zip(a, b) if x != y]
    assert diff == [("0", "1")] and a[a.index("--node-rank") + 1] == "0"
    assert a[a.index("--dist-init-addr") + 1] == "ct201:20000" and a[a.index("--nnodes") + 1] == "2"
    assert all(r.unit_name == "sglang-pair.service" for r in rs)
    assert [r.manifest()["node_rank"] for r in rs] == [0, 1]
    # a change on one node is a new release of the whole service
    other = render_service(inv.service_profiles("pro6000-pair", ["memory.context_length=16384"]), "nextn")
    assert other[0].release_id != rs[0].release_id


def test_service_file_errors_name_file_and_line(lab_inventory: Path, tmp_path: Path) -> None:
    d = tmp_path / "p"
    shutil.copytree(REPO / "profiles", d)
    path = d / "services" / "pro6000-pair.yaml"
    path.write_text(path.read_text().replace("nodes: [ct201, ct202]", "nodes: [ct201, ct299]\n  node_rank: 1"))
    inv = Inventory.load(d, str(lab_inventory))
    with pytest.raises(ProfileError) as exc:
        inv.service_profiles("pro6000-pair")
    msgs = "\n".join(exc.value.problems)
    assert "pro6000-pair.yaml:" in msgs and "multinode.nodes.1" in msgs and "ct299" in msgs
    assert "multinode.node_rank: set by the tool" in msgs


def test_tp_that_does_not_divide_over_the_nodes(lab_inventory: Path) -> None:
    inv = Inventory.load(REPO / "profiles", str(lab_inventory))
    with pytest.raises(ProfileError) as exc:
        inv.service_profiles("pro6000-pair", ["parallel.tp_size=3"])
    assert any("does not divide over the 2 nodes" in m for m in exc.value.problems)


# ------------------------------------------------------------------ preflight per card


def snapshot(free: list[int], apps: list[GpuApp] = (), total: int = 97887) -> GpuSnapshot:
    gpus = [Gpu(i, f"GPU-{i}", PRO, total, total - f, f, "12.0") for i, f in enumerate(free)]
    return GpuSnapshot("nvidia-smi", gpus, list(apps))


def model_files(p: object) -> dict[str, bytes]:
    s = p.service  # type: ignore[attr-defined]
    nextn = p.modes.nextn.draft_model_path  # type: ignore[attr-defined]
    return {f"{s.model_path}/config.json": (FIX / "Qwen3-8B/config.json").read_bytes(),
            f"{nextn}/config.json": (FIX / "Qwen3-8B-NextN/config.json").read_bytes()}


def test_per_card_free_memory_strays_and_the_pool_from_the_least_free_card(profiles: Path) -> None:
    p = load_profile("ct200", directory=tp2(profiles))
    stray = GpuApp("GPU-1", 4242, 40000, "python", None)
    pf = Preflight()
    check_gpu(pf, p, snapshot([97000, 57000], [stray]))
    check_models(pf, p, "nextn", model_files(p))
    assert [(c.index, c.rank, c.free_for_service) for c in pf.cards] == [(0, "TP0", 97000), (1, "TP1", 57000)]
    procs = by_name(pf, "gpu-processes")
    assert procs.status == WARN and "card 1: pid 4242" in procs.detail  # type: ignore[attr-defined]
    assert by_name(pf, "gpu-balance").status == WARN  # type: ignore[attr-defined]
    assert by_name(pf, "parallel").status == OK  # 32 heads, 8 KV heads: 16 and 4 per rank
    assert "16 and 4 per rank" in by_name(pf, "parallel").detail  # type: ignore[attr-defined]
    m = pf.memory
    assert m is not None and m.tp == 2 and m.cards == 2
    # the pool is sized from card 1's 57,000 MiB, not card 0's
    assert abs(m.free_before_load_gib - (57000 - memory.CUDA_CONTEXT_MIB) / 1024) < 0.01
    whole = memory.weights_bytes(json.loads((FIX / "Qwen3-8B/config.json").read_text()), None)
    assert abs(m.weights_gib - whole / 2 / memory.GIB) < 0.01  # half the weights per rank


def test_a_stray_on_a_card_the_service_does_not_own_is_not_its_business(profiles: Path) -> None:
    p = load_profile("ct200", directory=profiles)  # card 0 only
    pf = Preflight()
    check_gpu(pf, p, snapshot([97000, 20000], [GpuApp("GPU-1", 77, 70000, "python", "other.service")]))
    assert by_name(pf, "gpu-processes").status == OK  # type: ignore[attr-defined]


def test_a_card_the_host_lacks_is_refused(profiles: Path) -> None:
    p = load_profile("ct200", directory=tp2(profiles))
    pf = Preflight()
    check_gpu(pf, p, snapshot([97000]))
    assert by_name(pf, "gpu").status == FAIL  # type: ignore[attr-defined]


def test_tp_that_does_not_divide_the_heads_says_which(profiles: Path) -> None:
    path = profiles / "ct200.yaml"
    path.write_text(path.read_text().replace("gpu:\n", "parallel:\n  tp_size: 3\ngpus: [0, 1, 2]\ngpu:\n  count: 3\n", 1))
    p = load_profile("ct200", directory=profiles)
    pf = Preflight()
    check_gpu(pf, p, snapshot([97000, 97000, 97000]))
    check_models(pf, p, "nextn", model_files(p))
    check = by_name(pf, "parallel")
    assert check.status == FAIL and "32 attention heads do not divide by tp_size 3" in check.detail  # type: ignore[attr-defined]


def test_kv_heads_are_checked_apart_from_attention_heads() -> None:
    shape = memory.ModelShape(layers=4, kv_heads=6, head_dim=64, v_head_dim=64, hidden=768, vocab=100,
                              dtype_bytes=2, params=1, heads=12)
    assert memory.tp_problem(shape, 4) == "the model's 6 KV heads do not divide by tp_size 4"
    assert memory.tp_problem(shape, 3) is None and memory.tp_problem(shape, 12) is None
    # replicated KV heads: each rank holds one
    assert shape.cell_bytes(tp=12) == 1 * 128 * 4 * 2


def test_a_model_that_fits_only_on_more_cards_is_refused_naming_the_tp_that_fits(profiles: Path) -> None:
    p = load_profile("ct200", directory=tp2(profiles))
    cfg = json.loads((FIX / "Qwen3-8B/config.json").read_text())
    cfg["num_hidden_layers"] = 36 * 8  # ~8x the weights: ~120 GiB
    files = model_files(p) | {f"{p.service.model_path}/config.json": json.dumps(cfg).encode()}
    pf = Preflight()
    check_gpu(pf, p, snapshot([97000, 97000]))
    check_models(pf, p, "nextn", files)
    m = by_name(pf, "memory")
    assert m.status == FAIL  # type: ignore[attr-defined]
    assert "parallel.tp_size=8 with 8 cards in gpus" in m.detail  # type: ignore[attr-defined]
    assert "parallel.tp_size=4" not in m.detail  # 4 ranks would hold a pool of too few tokens


# ------------------------------------------------------------------ a multi-node service's verdicts


def failure(node: str, rank: int, when: float, label: str, role: str, raw: str = "") -> object:
    from ddtree_ops.diagnose.classify import Finding
    from ddtree_ops.service_nodes import NodeFailure, tp_rank_of

    f = Finding(label=label, severity="fatal", line=1, text=label, evidence=label, remedy="", profile_key=None,
                direction=None, rule_id=label, role=role)
    return NodeFailure(node, rank, when, f, "", tp_rank_of(raw))


def test_the_first_failing_rank_is_the_cause_not_the_nccl_timeouts_of_the_others() -> None:
    from ddtree_ops.service_nodes import first_failed

    oom = failure("ct202", 1, 20.0, "cuda_oom", "cause", "[2026-12-01 17:46:19 TP1] Scheduler hit an exception")
    timeout = failure("ct201", 0, 5.0, "watchdog_timeout", "downstream")  # earlier, but an echo
    first = first_failed([timeout, oom])  # type: ignore[list-item]
    assert first is oom and first.tp_rank == "TP1"
    assert first.describe().startswith("node rank 1 (ct202, TP1) failed first: cuda_oom")
    # only symptoms: the earliest of them
    assert first_failed([timeout, failure("ct202", 1, 9.0, "nccl_error", "downstream")]) is timeout  # type: ignore[list-item]


def test_service_gate_verdict() -> None:
    cfg = GateConfig(deadline_s=10, stay_s=1, poll_s=1, http_timeout_s=1, speculative=False)

    def state(status: Status, at: float | None = None, reason: str = "") -> GateState:
        from ddtree_ops.diagnose.classify import Scanner

        st = GateState(cfg, Scanner(), "")
        st.status, st.failed_at, st.reason = status, at, reason
        return st

    names = ["a", "b", "c"]
    assert service_verdict([state(Status.WAIT), state(Status.WAIT), state(Status.WAIT)], names)[0] is Status.WAIT
    st, why, rank = service_verdict([state(Status.FAIL, 9, "x"), state(Status.WAIT), state(Status.FAIL, 3, "y")], names)
    assert (st, rank) == (Status.FAIL, 2) and why.startswith("c (node rank 2): y")
    assert service_verdict([state(Status.PASS, reason="ok"), state(Status.WAIT), state(Status.WAIT)], names)[0] \
        is Status.PASS


def test_nodes_on_different_releases_are_not_consistent_and_smoke_says_critical() -> None:
    from ddtree_ops.service_nodes import NodeState, consistent, smoke_service
    from ddtree_ops.smoke.judge import Check, HostResult
    from ddtree_ops.smoke.observe import Observation
    from ddtree_ops.status import NagiosExit

    good = [NodeState("a", 0, "r1", "r1", None, "active/running, pid=1, restarts=0", True),
            NodeState("b", 1, "r1", "r1", None, "active/running, pid=2, restarts=0", True)]
    assert consistent(good)
    apart = [good[0], NodeState("b", 1, "r0", "r0", None, "active/running, pid=2, restarts=0", True)]
    assert not consistent(apart)
    rank0 = HostResult("a", "nextn", NagiosExit.OK, (Check("health", NagiosExit.OK, "200"),), (), Observation(host="a"))
    assert smoke_service("svc", rank0, good).state is NagiosExit.OK
    dead = [good[0], NodeState("b", 1, "r1", "r1", None, "failed/failed, pid=0, restarts=1", False)]
    res = smoke_service("svc", rank0, dead)
    assert res.state is NagiosExit.CRITICAL and res.host == "svc"
    assert any("node rank 1 (b)" in r for r in res.reasons)
    assert smoke_service("svc", rank0, apart).state is NagiosExit.CRITICAL


def test_history_merges_every_node_under_one_release_row() -> None:
    from ddtree_ops.releases import ReleaseInfo
    from ddtree_ops.service_nodes import merge_history

    def rel(rid: str, passed: bool, last: str, at: str, kg: bool = False, cur: bool = False) -> ReleaseInfo:
        return ReleaseInfo(release_id=rid, mode="nextn", created_at=at, by="t", passed=passed, last=last, attempts=1,
                           current=cur, target=kg, kept=True)

    rows = merge_history(["a", "b"], [([rel("r1", True, "passed", "1", True, True),
                                        rel("r2", False, "failed", "2")], None, []),
                                      ([rel("r1", True, "passed", "1", True, True)], None, [])])
    assert [r.release_id for r in rows] == ["r2", "r1"]
    assert rows[0].per_node == {"a": "failed", "b": "-"}
    assert rows[1].per_node == {"a": "passed current rollback-target", "b": "passed current rollback-target"}


def test_the_rank_of_a_traceback_is_its_records_prefix() -> None:
    from ddtree_ops.service_nodes import rank_before

    lines = ["[2026-12-01 17:46:19 TP0] Load weight end.", "[2026-12-01 17:46:19 TP1] Scheduler hit an exception: "
             "Traceback (most recent call last):", '  File "x.py", line 1, in f', "torch.OutOfMemoryError: CUDA out"]
    assert rank_before(lines, 3) == "TP1" and rank_before(lines, 0) == "TP0"
    assert rank_before(["no prefix here"], 0) == ""


# ------------------------------------------------------------------ the transaction's order, with fakes


class RecordingHost:
    """A node that records every command across all nodes, in one shared log, and answers empty."""

    def __init__(self, name: str, log: list[tuple[str, str]]) -> None:
        self.name, self.log = name, log

    def run(self, argv: list[str], *, stdin: bytes | None = None, timeout: float = 60.0, sudo: bool = False) -> object:
        from ddtree_ops.host import Result

        self.log.append((self.name, " ".join(argv)))
        return Result(tuple(argv), 0, "", "")


def test_rank_0_stops_first_and_starts_first(lab_inventory: Path) -> None:
    """Rank 0 is stopped first (its ShutdownReq stops the other nodes' schedulers) and started
    first (it hosts the TCPStore the others connect to)."""
    from ddtree_ops.service import restart_in_order
    from ddtree_ops.service_nodes import Service

    svc = Service.load(Inventory.load(REPO / "profiles", str(lab_inventory)), "pro6000-pair")
    log: list[tuple[str, str]] = []
    starts = restart_in_order([RecordingHost("ct201", log), RecordingHost("ct202", log)], svc)  # type: ignore[list-item]
    steps = [(host, "stop" if "systemctl stop" in cmd else "start") for host, cmd in log]
    assert steps == [("ct201", "stop"), ("ct202", "stop"), ("ct201", "start"), ("ct202", "start")]
    assert [s.rank for s in starts] == [0, 1]
