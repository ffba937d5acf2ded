"""Per-kernel GPU time of the fused tree build (CUDA only), from the PyTorch profiler (CUPTI).

`engine_bench.py treebuild` times whole graphs; this splits one build into its kernels, the
gaps between them and their launch shapes, which is what a kernel change needs:

    python bench/profile_treebuild.py --budgets 256,1024 [--reps 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine_bench import draft_like_logits  # noqa: E402

from ddtree_ops.engine.tree import TreeBuilder  # noqa: E402


def kernel_times(builder: TreeBuilder, reps: int) -> tuple[dict[str, float], float]:
    """Median GPU time per kernel name over `reps` graph replays, and the median span of one
    replay (first kernel start to last kernel end)."""
    from torch.profiler import ProfilerActivity, profile

    assert builder.graph is not None
    for _ in range(5):
        builder.graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            builder.graph.replay()
            torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    per: dict[str, list[float]] = defaultdict(list)
    spans: list[float] = []
    n = len(kernels) // reps if reps else 0
    for r in range(reps):
        group = kernels[r * n:(r + 1) * n]
        if not group:
            continue
        spans.append(group[-1].time_range.end - group[0].time_range.start)
        for e in group:
            per[e.name].append(e.time_range.end - e.time_range.start)
    return {name: statistics.median(v) for name, v in per.items()}, statistics.median(spans) if spans else float("nan")


def prefix_times(logits: torch.Tensor, budget: int, reps: int) -> dict[str, float]:
    """Event-timed graph replays of the build's first 1, 2 and 3 kernels, then all three with
    the visibility (cleared by the filter, marked by the selection): the marginal cost of each
    as a user of the graph sees it (launch floor and gaps included)."""
    from engine_bench import capture_graph, graph_time

    from ddtree_ops.engine import tree_kernels
    from ddtree_ops.engine.tree import budget_topk

    device = logits.device
    k = budget_topk(budget, int(logits.shape[1]))
    counters = torch.zeros(3 * int(logits.shape[0]), dtype=torch.int32, device=device)
    root = torch.ones(1, dtype=torch.int64, device=device)
    scratch = torch.zeros(1, device=device)
    vis = torch.empty(tree_kernels.vis_bytes(budget), dtype=torch.int8, device=device)

    def upto(n: int) -> None:
        if n == 0:
            scratch.add_(1)
            return
        if n == 1:
            tree_kernels._row_stats(logits, k, counters[: int(logits.shape[0])])
            return
        tokens, scores = tree_kernels.topk_rows(logits, k, counters, clear=vis if n >= 4 else None)
        if n >= 3:
            tree_kernels.select_nodes(scores, tokens, budget, root, vis if n >= 4 else None)

    names = ("empty", "stats", "+filter", "+select", "all with visibility")
    return {name: graph_time(capture_graph(lambda n=n: upto(n), device), device, reps) * 1e6
            for n, name in enumerate(names)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budgets", default="256,1024")
    parser.add_argument("--depth", type=int, default=15)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    device = torch.device("cuda")
    for budget in (int(b) for b in args.budgets.split(",")):
        logits = draft_like_logits(args.depth, args.vocab, device, seed=0)
        builder = TreeBuilder(args.depth, args.vocab, budget, device, logits_dtype=logits.dtype, how="fused")
        builder.capture()
        builder.build(logits, 1)
        times, span = kernel_times(builder, args.reps)
        parts = "  ".join(f"{name.lstrip('_')} {t:6.1f}" for name, t in times.items())
        print(f"B={budget:5d}  span {span:6.1f} us  kernels {sum(times.values()):6.1f} us  | {parts}", flush=True)
        print("         graph prefixes (event-timed, us): " + "  ".join(
            f"{name} {t:6.1f}" for name, t in prefix_times(logits, budget, 100).items()), flush=True)


if __name__ == "__main__":
    main()
