"""The Triton tree-build kernels give the heap's tree, in both shapes (the spine tree and the
plain best-first one), run on the CPU by Triton's interpreter.

The kernels are what the GPU path runs (CUDA graphs in `TreeBuilder(how="fused")`); the same
source runs here under TRITON_INTERPRET=1, which Triton reads when a kernel is decorated, so the
cases run in a child process that sets it before anything imports Triton. Timings on a GPU are
in BENCHMARKS.md, not here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")
pytestmark = pytest.mark.engine

CHILD = textwrap.dedent('''
    import json, os, sys
    assert os.environ["TRITON_INTERPRET"] == "1"
    import torch
    from ddtree_ops.engine import tree as T

    results = []
    for case in json.loads(sys.argv[1]):
        g = torch.Generator().manual_seed(case["seed"])
        logits = torch.randn(case["L"], case["V"], generator=g) * case["scale"]
        if case["ties"]:
            logits = logits.round()              # many exactly equal log-probs in every row
        k = T.budget_topk(case["B"], case["V"])
        top_ref, top_fused = T.draft_topk(logits, k), T.draft_topk_fused(logits, k)
        row = {"case": case, "nodes": {}, "differs": False,
               "topk_same": torch.equal(top_ref.tokens, top_fused.tokens) and torch.equal(top_ref.scores, top_fused.scores),
               "stats_vs_torch": float((T.log_probs(logits) - torch.log_softmax(logits, -1)).abs().max())}
        trees = {}
        for spine in (True, False):
            ref = T.build_tree_heap(top_ref, case["B"], 7, spine=spine)
            # one shape from logits, the other from the same fused top-K (the interpreter is slow)
            fused = (T.build_tree_fused(logits, case["B"], 7, spine=spine) if spine else
                     T.build_tree_vectorized(top_fused, case["B"], 7, fused=True, spine=spine))
            builder = T.TreeBuilder(case["L"], case["V"], case["B"], "cpu", logits_dtype=torch.float32, how="fused",
                                    spine=spine)
            builder.root_token.fill_(7)
            for x in (torch.randn(case["L"], case["V"], generator=g), logits):   # the second build reuses
                builder.logits.copy_(x)                                           # the first's counters and visibility buffer
                builder._run()
            n = ref.size
            out = builder.out
            name = "spine" if spine else "plain"
            row[name] = {
                "tree_same": all(torch.equal(getattr(ref, f), getattr(fused, f)) for f in ("tokens", "parents", "depths", "ranks")),
                "builder_same": torch.equal(out["tokens"][:n], ref.tokens) and torch.equal(out["parents"][:n], ref.parents),
                "visibility_same": torch.equal(out["visibility"][:n, :n], ref.visibility()),
            }
            row["nodes"][name] = n
            trees[name] = ref
        row["differs"] = not torch.equal(trees["spine"].tokens, trees["plain"].tokens) or not torch.equal(
            trees["spine"].parents, trees["plain"].parents)
        results.append(row)
    print(json.dumps(results))
''')

CASES = [
    {"L": 1, "V": 5, "B": 1, "scale": 1.0, "ties": False, "seed": 1},
    {"L": 3, "V": 40, "B": 8, "scale": 2.0, "ties": True, "seed": 2},
    {"L": 4, "V": 300, "B": 24, "scale": 3.0, "ties": False, "seed": 3},
    {"L": 5, "V": 1000, "B": 40, "scale": 1.0, "ties": True, "seed": 4},
    {"L": 2, "V": 3, "B": 16, "scale": 1.0, "ties": False, "seed": 5},   # fewer prefixes than B: 3 + 9
    {"L": 6, "V": 200, "B": 64, "scale": 0.1, "ties": False, "seed": 6},  # flat rows: wide trees
]


@pytest.fixture(scope="module")
def results() -> list[dict]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(CASES)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("shape", ["spine", "plain"])
@pytest.mark.parametrize("i", range(len(CASES)))
def test_fused_kernels_build_the_heap_tree(results: list[dict], i: int, shape: str) -> None:
    r = results[i]
    assert r["topk_same"], f"top-K kernel differs from torch.topk order on {r['case']}"
    assert r[shape]["tree_same"], f"fused {shape} tree differs from the heap's on {r['case']}"
    assert r[shape]["builder_same"] and r[shape]["visibility_same"], f"TreeBuilder(fused, {shape}) differs on {r['case']}"


def test_the_cases_tell_the_two_shapes_apart(results: list[dict]) -> None:
    """Where the plain tree already holds the chain both shapes are one tree; most cases here
    are not like that, so a kernel that ignored the shape would fail above."""
    assert sum(r["differs"] for r in results) >= 3


def test_fused_log_softmax_matches_torch(results: list[dict]) -> None:
    assert max(r["stats_vs_torch"] for r in results) < 1e-5


def test_a_budget_larger_than_the_prefix_space_gives_every_prefix(results: list[dict]) -> None:
    assert results[4]["nodes"] == {"spine": 1 + 3 + 9, "plain": 1 + 3 + 9}
