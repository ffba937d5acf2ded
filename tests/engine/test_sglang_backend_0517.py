"""SGLang 0.5.17's tree verify backend (`sglang_backend_0517`) on CPU: what can be checked without a GPU.

- The mask, read the way 0.5.17's triton TARGET_VERIFY reads it (per row n x (prefix + n), rows one
  after another, the tree's columns after the prefix's): every node sees the prefix, itself and its
  ancestors, nothing else, for rows of different prefix lengths.
- The commit: after the permutation, index prefix + d of the row holds the slot whose KV the verify
  computed for the accepted node at depth d (at position prefix + d), and the row owns the same slots.
- The backend's shape against 0.5.17's own source (the reference wheel `make install` keeps): every
  attribute it reads off DFlash's worker exists there, every SGLang name it imports is defined where it
  imports it from, every keyword it passes is a parameter of the function it calls, and the facts its
  design rests on (the mask layout, the graph-width check, the dummy slot 0) are in the source.
- The plugin wheel declares it for 0.5.17; the tree worker refuses to start where it says it cannot
  serve, and hands it the scheduler's forward arguments (the overlap scheduler's `on_publish`).

What runs only on the GPU (the forward, the allocator, the KV) is `bench/realsglang/tree.py`'s, and its
logs are in tests/data/real-sglang/.
"""

from __future__ import annotations

import ast
import inspect
import random
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from dflash_fakes import sglang_file

from ddtree_ops.engine import sglang_backend_0517 as be
from ddtree_ops.engine.sglang_backend import build_tree, walk

pytestmark = pytest.mark.engine
RELEASE = "0.5.17"


def random_tree(rng: random.Random, depth: int = 6, vocab: int = 7, budget: int = 14) -> Any:
    tok = [rng.sample(range(vocab), vocab) for _ in range(depth)]
    sc = [sorted((rng.random() for _ in range(vocab)), reverse=True) for _ in range(depth)]
    return build_tree(tok, sc, budget, root_token=rng.randrange(vocab))


def ancestors(tree: Any, node: int) -> set[int]:
    """Node and its ancestors, from the children maps (not from `parents`, which the mask is built from)."""
    up = {child: parent for parent, kids in enumerate(tree.children) for child in kids.values()}
    out = {node}
    while node in up:
        node = up[node]
        out.add(node)
    return out


def read_mask(flat: torch.Tensor, prefix: list[int], n: int) -> list[list[tuple[set[int], bool]]]:
    """0.5.17's triton extend kernel's reading: mask_indptr is the running sum of n * (prefix + n); row i
    of request b starts at i * (prefix + n); the extend columns start after the prefix's."""
    indptr, out = 0, []
    for p in prefix:
        rows = []
        for i in range(n):
            base = indptr + i * (p + n)
            prefix_ok = bool(flat[base:base + p].all()) if p else True
            rows.append(({j for j in range(n) if bool(flat[base + p + j])}, prefix_ok))
        out.append(rows)
        indptr += n * (p + n)
    assert indptr == flat.numel(), "the mask's length is not what the kernel's mask_indptr covers"
    return out


@pytest.mark.parametrize("seed", range(4))
def test_each_node_sees_its_prefix_itself_and_its_ancestors_only(seed: int) -> None:
    rng = random.Random(seed)
    trees = [random_tree(rng, budget=rng.randint(4, 14)) for _ in range(3)]
    lay = be.layout(trees)
    prefix = [rng.randint(0, 9) for _ in trees]
    rows = read_mask(be.verify_mask(be.tree_mask(lay.parents), prefix), prefix, lay.n)
    for b, tree in enumerate(trees):
        for i in range(lay.n):
            seen, prefix_ok = rows[b][i]
            assert prefix_ok
            if i < tree.size:
                assert seen == ancestors(tree, i), (b, i)
            else:                                   # padding: the root and itself, never reached by a walk
                assert seen == {0, i}
                assert all(i not in kids.values() for kids in tree.children)
    # positions: the root's + depth
    assert all(d == trees[b].depths[i] for b in range(len(trees)) for i, d in enumerate(lay.depths[b][:trees[b].size]))


def test_layout_refuses_a_child_before_its_parent() -> None:
    tree = random_tree(random.Random(0))
    assert tree.size > 3
    broken = build_tree([[1, 2]], [[0.9, 0.1]], 2, root_token=0)
    broken.parents = [-1, 2, 0]                 # node 1 hangs off node 2, which comes after it
    with pytest.raises(ValueError, match="parents first"):
        be.layout([tree, broken])


@pytest.mark.parametrize("seed", range(6))
def test_the_commit_puts_the_accepted_path_at_its_positions_and_keeps_the_rows_slots(seed: int) -> None:
    rng = random.Random(seed)
    tree = random_tree(rng, budget=15)
    n, prefix = tree.size, rng.randint(0, 20)
    row = rng.sample(range(1, 1000), prefix + n + 5)           # req_to_token of one request (slot 0 is SGLang's dummy)
    before = list(row)
    loc = row[prefix:prefix + n]                               # the verify wrote node i's KV to loc[i]
    kv = {loc[i]: (prefix + tree.depths[i], i) for i in range(n)}   # what it computed there: (position, node)
    predict = [rng.choice([rng.randrange(7), *tree.children[i]]) for i in range(n)]
    path, bonus = walk(tree, predict)
    order = be.commit_order(path, n)
    row[prefix:prefix + n] = [loc[j] for j in order]          # what `req_to_token[rpi, cols] = loc.gather(perm)` does
    for d, node in enumerate(path):
        assert kv[row[prefix + d]] == (prefix + d, node)
    assert sorted(row) == sorted(before) and row[:prefix] == before[:prefix] and row[prefix + n:] == before[prefix + n:]
    out = be.emitted(tree, path, bonus, 16)
    assert out[:len(path)] == [tree.tokens[x] for x in path[1:]] + [bonus] and len(out) == 16


def test_refusals_name_what_cannot_be_served() -> None:
    assert be.refusals(page_size=1, attention="triton", draft_window=None, mamba=False, tp_size=1) == []
    said = " | ".join(be.refusals(page_size=16, attention="fa3", draft_window=512, mamba=True, tp_size=2))
    for name in ("--page-size 16", "--attention-backend fa3", "--speculative-draft-window-size", "mamba", "--tp-size 2"):
        assert name in said


# ------------------------------------------------------------------ the backend against 0.5.17's source


def source(relpath: str) -> str:
    src = sglang_file(RELEASE, relpath)
    if src is None:
        pytest.skip(f"no sglang {RELEASE} reference wheel (make install fetches it)")
    return src


def class_members(src: str, name: str) -> set[str]:
    cls = next(n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ClassDef) and n.name == name)
    out = {f.name for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                and isinstance(node.ctx, ast.Store):
            out.add(node.attr)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
    return out


BACKEND = ast.parse(Path(inspect.getfile(be)).read_text())


def test_every_worker_attribute_the_backend_reads_is_dflash_workers_or_the_mixins() -> None:
    from ddtree_ops.engine.sglang_tree import TreeWorkerMixin

    have = class_members(source("sglang/srt/speculative/dflash_worker_v2.py"), "DFlashWorkerV2")
    have |= class_members(source("sglang/srt/speculative/base_spec_worker.py"), "BaseSpecWorker")  # its base
    have |= set(vars(TreeWorkerMixin))
    used = {n.attr for n in ast.walk(BACKEND)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "worker"}
    assert used and not used - have, f"not on 0.5.17's DFlashWorkerV2: {sorted(used - have)}"
    assert {"_draft_block_ids_buf", "_append_target_hidden_to_draft_kv_by_loc", "target_worker"} <= used


def imports() -> list[tuple[str, str]]:
    return [(n.module, a.name) for n in ast.walk(BACKEND) if isinstance(n, ast.ImportFrom) and n.module
            and n.module.startswith("sglang") for a in n.names]


def test_every_sglang_name_it_imports_is_defined_where_it_imports_it_from() -> None:
    found = imports()
    assert len(found) >= 10
    for module, name in found:
        tree = ast.parse(source(module.replace(".", "/") + ".py"))
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        defined |= {(a.asname or a.name) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
                    for a in n.names}
        assert name in defined, f"{module} defines no {name} in sglang {RELEASE}"


# the functions and classes the backend calls with keywords: where 0.5.17 defines them
CALLEES = {
    "alloc_for_spec_decode": ("sglang/srt/mem_cache/allocation.py", None),
    "assign_extend_cache_locs_func": ("sglang/kernels/ops/speculative/cache_locs.py", None),
    "apply_dflash_verify_logits_adjustments": ("sglang/srt/speculative/dflash_utils.py", None),
    "_append_target_hidden_to_draft_kv_by_loc": ("sglang/srt/speculative/dflash_worker_v2.py", "DFlashWorkerV2"),
    "_make_next_draft_input_decode": ("sglang/srt/speculative/dflash_worker_v2.py", "DFlashWorkerV2"),
    "_greedy_sample_from_vocab_parallel_head": ("sglang/srt/speculative/dflash_worker_v2.py", "DFlashWorkerV2"),
    "forward_batch_generation": ("sglang/srt/managers/tp_worker.py", "TpModelWorker"),
    "DFlashVerifyInput": ("sglang/srt/speculative/dflash_info.py", "class"),
    "ForwardBatch": ("sglang/srt/model_executor/forward_batch_info.py", "class"),
    "GenerationBatchResult": ("sglang/srt/managers/utils.py", "class"),
}


def params(relpath: str, owner: str | None, name: str) -> set[str]:
    tree = ast.parse(source(relpath))
    if owner == "class":        # a dataclass: its annotated fields
        cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)
        return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    scope: Any = tree
    if owner:
        scope = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == owner)
    fn = next(n for n in ast.walk(scope) if isinstance(n, ast.FunctionDef) and n.name == name)
    a = fn.args
    return {x.arg for x in a.args + a.kwonlyargs + a.posonlyargs}


def test_every_keyword_it_passes_is_a_parameter_in_0517() -> None:
    calls = [n for n in ast.walk(BACKEND) if isinstance(n, ast.Call) and n.keywords]
    checked = set()
    for call in calls:
        f = call.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        if name not in CALLEES:
            continue
        if name == "forward_batch_generation" and isinstance(f.value, ast.Name):   # DFlash's own, by class
            continue
        relpath, owner = CALLEES[name]
        allowed = params(relpath, owner, name)
        given = {k.arg for k in call.keywords if k.arg}
        assert given <= allowed, f"{name}: {sorted(given - allowed)} not in sglang {RELEASE}'s {sorted(allowed)}"
        checked.add(name)
    assert checked == set(CALLEES), f"not called with keywords any more: {set(CALLEES) - checked}"


def squash(src: str) -> str:
    return re.sub(r"\s+", "", src)


def test_the_facts_the_design_rests_on_are_in_0517s_source() -> None:
    triton = squash(source("sglang/srt/layers/attention/triton_backend.py"))
    # eager TARGET_VERIFY: the mask comes from spec_info, laid out n x (prefix + n) a row
    assert "custom_mask=spec_info.custom_mask" in triton
    assert "seq_mask_len=num_draft_tokens*(forward_batch.seq_lens+num_draft_tokens)" in triton
    assert "num_draft_tokens=int(spec_info.draft_token_num)" in triton
    kernel = squash(source("sglang/kernels/ops/attention/extend_attention.py"))
    assert "*(cur_seq_len+window_kv_offset)+window_kv_offset+cur_seq_len_prefix+start_n+offs_n[None,:]" in kernel
    # a verify of another width than DFlash's block is not replayed on DFlash's graph
    graphs = squash(source("sglang/srt/model_executor/runner/decode_cuda_graph_runner.py"))
    assert "spec_info.num_tokens_per_req!=self.captured_req_width" in graphs
    # slot 0 is the pool's dummy write target (the probe's KV goes there)
    assert "Thepaddedslot0isusedforwritingdummyoutputsfrompaddedtokens." in squash(
        source("sglang/srt/mem_cache/allocator/token.py"))
    # DFlash reserves 2 x its block a row; the tree's extra slots are recorded on the request, and freed with it
    info = squash(source("sglang/srt/speculative/dflash_info_v2.py"))
    assert "reserved_len=max(cur_alloc_len,committed_len+2*block_size)" in info
    alloc = squash(source("sglang/srt/mem_cache/allocation.py"))
    assert "req.kv.kv_allocated_len=max(req.kv.kv_allocated_len,int(nxt_kv_lens_cpu[i]))" in alloc
    common = squash(source("sglang/srt/mem_cache/common.py"))
    assert "start_p,end_p=effective_kv_committed_len,req.kv.kv_allocated_len" in common
    # the scheduler reads a spec-v2 result's tokens at the stride it declares
    out = squash(source("sglang/srt/managers/scheduler_components/batch_result_processor.py"))
    assert "accept_tokens=next_token_ids[i*stride:i*stride+accept_lens[i]]" in out


# ------------------------------------------------------------------ declared, and refused or served by the worker


def test_the_plugin_wheel_declares_it_for_0517_and_it_loads_without_sglang() -> None:
    import configparser

    from ddtree_ops.engine.sglang_backend import BACKEND_GROUP, declared
    from ddtree_ops.wheel import ENTRY_POINTS

    cp = configparser.ConfigParser(delimiters=("=",))
    cp.optionxform = str                     # type: ignore[assignment,method-assign]
    cp.read_string(ENTRY_POINTS)
    found = dict(cp[BACKEND_GROUP])
    assert declared(found, "0.5.17.post1") == "ddtree_ops.engine.sglang_backend_0517:Backend"
    assert declared(found, "0.5.23") is None
    backend = be.Backend()
    assert "0.5.17" in backend.name


def test_the_tree_worker_refuses_to_start_on_what_the_backend_cannot_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    from test_engine_treemode import TreeTarget

    from ddtree_ops.engine import sglang_tree
    from dflash_fakes import shadow_env

    shadow_env(monkeypatch, DDTREE_MODE="tree", DDTREE_BUDGET="8")
    monkeypatch.setattr(sglang_tree, "find_backend", lambda version: (be.Backend(), ""))

    class Worker(sglang_tree.TreeWorkerMixin, TreeTarget):
        server_args = type("Args", (), {"page_size": 16, "attention_backend": "fa3", "tp_size": 1,
                                        "speculative_draft_window_size": None})()

    with pytest.raises(RuntimeError, match=r"--page-size 16: .*page size 1[\s\S]*--attention-backend fa3"):
        Worker(seed=1)
    Worker.server_args = type("Args", (), {"page_size": 1, "attention_backend": "triton", "tp_size": 1,
                                           "speculative_draft_window_size": None})()
    Worker(seed=1)                           # the same worker on what it serves starts


def test_the_tree_round_gets_the_schedulers_forward_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    from test_engine_treemode import FakeBackend, tree_worker

    from dflash_fakes import FakeBatch, FakeRequest

    got: list[dict[str, Any]] = []

    class Recording(FakeBackend):
        def tree_round(self, worker: Any, batch: Any, build: Any, **forward: Any) -> Any:
            got.append(forward)
            return super().tree_round(worker, batch, build)

    w = tree_worker(monkeypatch, Recording(), DDTREE_CHAIN_SHARE="0")
    req = FakeRequest([1, 2, 3])
    w.forward_batch_generation(FakeBatch("extend", [req]))
    publish = object()
    w.forward_batch_generation(FakeBatch("decode", [req], [len(w.seqs[id(req)]) - 1]), on_publish=publish)
    assert got == [{"on_publish": publish}]
