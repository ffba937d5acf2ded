"""Engine benchmarks: tree build, verify cost against tree size, decode tokens/s and tau by budget.

    python bench/engine_bench.py treebuild [--budgets 16,64,256,1024] [--vocab 151936] [--depth 15]
    python bench/engine_bench.py verify [--context 2048] [--layers 36]      # Qwen3-8B-shaped, random bf16
    python bench/engine_bench.py decode --model smollm2|gguf:PATH|random [--budgets 16,32,64]
    ... --out DIR writes one JSON per section; a table goes to stdout.

Runs on CPU (small sizes, to check the script; TRITON_INTERPRET=1 adds the fused path) and on a
GPU (the figures). Heap builds are timed from draft logits on the device to a host tree: top-k,
the device-to-host copy and the heap, both with the canonical top-k (`draft_topk`, ties by token
id, the reference every build is checked against) and in the reference's own style
(log_softmax + torch.topk). Vectorised builds are timed from the same logits to device tensors
(tokens, parents, depths, visibility), eager and as one CUDA graph replay: PyTorch selection
(top-k or sort) and the fused Triton path; the fused path's three launches are also timed one by
one (the selection with the visibility, as the builder runs it). GPU times are medians of
CUDA-event or synchronised wall-clock timings after warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from ddtree_ops.engine.tree import (  # noqa: E402
    DraftTopK,
    TreeBuilder,
    ancestor_matrix,
    budget_topk,
    build_tree_fused,
    build_tree_heap,
    draft_topk,
    draft_topk_fused,
    fused_available,
    log_probs,
    quantize_logprobs,
    select_tree,
)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_time(fn: Callable[[], Any], device: torch.device, reps: int, warm: int = 3) -> float:
    for _ in range(warm):
        fn()
    sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def graph_time(graph: Any, device: torch.device, reps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def draft_like_logits(depth: int, vocab: int, device: torch.device, seed: int) -> torch.Tensor:
    """Peaked like a trained drafter: one strong token per depth over a noisy rest, so trees
    branch near the top and deepen along the likely path."""
    import math

    gen = torch.Generator(device="cpu").manual_seed(seed)
    logits = torch.randn((depth, vocab), generator=gen)
    rows = torch.arange(depth)
    # top-1 probability ~0.8 at depth 1 falling to ~0.4 at depth L, a runner-up at ~1/8 of it
    p = torch.linspace(0.8, 0.4, depth)
    base = math.log(vocab) + 0.5
    first = torch.randint(0, vocab, (depth,), generator=gen)
    second = (first + 1 + torch.randint(0, vocab - 1, (depth,), generator=gen)) % vocab
    logits[rows, first] = base + torch.log(p / (1 - p))
    logits[rows, second] = base + torch.log(p / (1 - p)) - math.log(8.0)
    return logits.to(device=device, dtype=torch.bfloat16)


def reference_style_topk(logits: torch.Tensor, k: int) -> DraftTopK:
    """The reference's top-k: log_softmax(logits.float()) then torch.topk (tie order left to
    torch). Used only as the heap baseline's timing; trees are checked against `draft_topk`."""
    values, tokens = torch.topk(torch.log_softmax(logits.float(), dim=-1), k, dim=-1, sorted=True)
    return DraftTopK(tokens=tokens, scores=quantize_logprobs(values))


def capture_graph(fn: Callable[[], Any], device: torch.device) -> Any:
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def trees_equal(tree: Any, ref: Any) -> bool:
    return all(torch.equal(a.cpu(), b.cpu()) for a, b in ((tree.tokens, ref.tokens), (tree.parents, ref.parents),
                                                          (tree.depths, ref.depths), (tree.ranks, ref.ranks)))


def builder_matches(out: dict[str, torch.Tensor], ref: Any) -> bool:
    n = ref.size
    return (all(out[key][:n].cpu().tolist() == getattr(ref, key).tolist()
                for key in ("tokens", "parents", "depths", "ranks"))
            and bool(out["valid"][:n].all()) and not bool(out["valid"][n:].any())
            and torch.equal(out["visibility"][:n, :n].cpu(), ref.visibility()))


def check_fused(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """The fused build against the heap on many full-size inputs, ties and degenerate rows included."""
    vocab, depth, spine = args.vocab, args.depth, args.tree == "spine"
    cases: list[tuple[str, torch.Tensor]] = []
    gen = torch.Generator(device="cpu").manual_seed(1234)
    for seed in range(args.check_seeds):
        cases.append((f"draft-like/{seed}", draft_like_logits(depth, vocab, device, seed=1000 + seed)))
    for scale in (0.02, 0.5, 3.0, 12.0):
        cases.append((f"randn*{scale}", (torch.randn((depth, vocab), generator=gen) * scale).to(device, torch.bfloat16)))
    few = torch.randint(0, 4, (depth, vocab), generator=gen).float()          # four distinct values: ties everywhere
    cases.append(("four-values", few.to(device, torch.bfloat16)))
    cases.append(("uniform", torch.zeros((depth, vocab), device=device, dtype=torch.bfloat16)))
    finite = min(700, vocab // 2)
    masked = torch.full((depth, vocab), float("-inf"))
    masked[:, :finite] = torch.randn((depth, finite), generator=gen)      # fewer finite tokens than K at B = 1024
    cases.append((f"masked-{finite}", masked.to(device, torch.bfloat16)))
    adversarial = torch.randn((depth, vocab), generator=gen)
    adversarial[:, ::2048] += 8.0                                          # the best tokens share a lane
    cases.append(("one-lane", adversarial.to(device, torch.bfloat16)))
    results = []
    for name, logits in cases:
        for budget in args.budgets:
            k = budget_topk(budget, vocab)
            top = draft_topk(logits, k)
            fused_top = draft_topk_fused(logits, k)
            same_topk = torch.equal(top.tokens, fused_top.tokens) and torch.equal(top.scores, fused_top.scores)
            ref = build_tree_heap(top, budget, 3, spine=spine)
            same = trees_equal(build_tree_fused(logits, budget, 3, spine=spine), ref)
            results.append({"case": name, "budget": budget, "same_topk": same_topk, "same_tree": same,
                            "ties_in_topk": int((top.scores[:, 1:] == top.scores[:, :-1]).sum())})
            if not (same and same_topk):
                print(f"MISMATCH {name} B={budget} topk={same_topk} tree={same}", flush=True)
    ok = all(r["same_tree"] and r["same_topk"] for r in results)
    print(f"fused vs heap: {sum(r['same_tree'] and r['same_topk'] for r in results)}/{len(results)} cases identical "
          f"(top-k table and tree); ties in the top-k tables: {sum(r['ties_in_topk'] for r in results)}", flush=True)
    return {"all_identical": ok, "cases": results}


def bench_treebuild(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    cuda = device.type == "cuda"
    spine = args.tree == "spine"
    check = check_fused(args, device) if fused_available(device) and args.check_seeds else None
    rows = []
    for budget in args.budgets:
        logits = draft_like_logits(args.depth, args.vocab, device, seed=budget)
        k = budget_topk(budget, args.vocab)

        def heap() -> Any:
            return build_tree_heap(draft_topk(logits, k), budget, 1, spine=spine)   # tolist() inside = the D2H copy

        def heap_reference_style() -> Any:
            return build_tree_heap(reference_style_topk(logits, k), budget, 1, spine=spine)

        def vec() -> Any:
            top = draft_topk(logits, k)
            out = select_tree(top.scores, top.tokens, budget, spine=spine)
            return out, ancestor_matrix(torch.cat([out[1].new_tensor([-1]), out[1]]), args.depth)

        ref = heap()
        n = ref.size
        row: dict[str, Any] = {"budget": budget, "tree": args.tree, "k": k, "nodes": n,
                               "max_depth": int(ref.depths.max()),
                               "topk_s": median_time(lambda: draft_topk(logits, k), device, args.reps),
                               "topk_reference_style_s": median_time(lambda: reference_style_topk(logits, k), device, args.reps),
                               "heap_s": median_time(heap, device, args.reps),
                               "heap_reference_style_s": median_time(heap_reference_style, device, args.reps),
                               "vector_eager_s": median_time(vec, device, max(3, args.reps // 5))}
        hows = ("topk", "sort") + (("fused",) if fused_available(device) else ())
        for how in hows:
            builder = TreeBuilder(args.depth, args.vocab, budget, device, logits_dtype=logits.dtype, how=how,
                                  spine=spine)
            builder.capture()
            out = builder.build(logits, 1)
            row[f"same_tree_{how}"] = builder_matches(out, ref)
            if cuda:
                row[f"vector_graph_{how}_s"] = graph_time(builder.graph, device, args.reps)
        if fused_available(device):
            row["fused_eager_s"] = median_time(lambda: build_tree_fused(logits, budget, 1, spine=spine), device,
                                               args.reps)
            row["same_tree_fused_eager"] = trees_equal(build_tree_fused(logits, budget, 1, spine=spine), ref)
        if cuda and fused_available(device):
            # the fused build's parts, each as its own graph (each includes one launch)
            from ddtree_ops.engine import tree_kernels

            top = draft_topk_fused(logits, k)
            root = torch.ones(1, dtype=torch.int64, device=device)
            vis = torch.zeros(tree_kernels.vis_bytes(budget), dtype=torch.int8, device=device)
            scratch = torch.zeros(1, device=device)
            parts = {"empty_graph": lambda: scratch.add_(1),       # the floor of one-launch graph timing
                     "log_softmax_torch": lambda: torch.log_softmax(logits, dim=-1, dtype=torch.float32),
                     "stats_kernel": lambda: tree_kernels.log_softmax_stats(logits),
                     "topk_kernels": lambda: tree_kernels.topk_rows(logits, k),
                     "select_kernel": lambda: tree_kernels.select_nodes(top.scores, top.tokens, budget, root, vis,
                                                                        spine=spine)}
            for name, fn in parts.items():
                row[f"part_{name}_s"] = graph_time(capture_graph(fn, device), device, args.reps)
            for warps in (4, 8, 16):          # launch-shape sweep for the selection kernel
                row[f"sweep_select_w{warps}_s"] = graph_time(capture_graph(
                    lambda w=warps: tree_kernels.select_nodes(top.scores, top.tokens, budget, root, vis, num_warps=w,
                                                              spine=spine),
                    device), device, args.reps)
            # accuracy of the fused log-probs against torch.log_softmax
            row["logprob_max_abs_diff_vs_torch"] = float((log_probs(logits) - torch.log_softmax(
                logits, dim=-1, dtype=torch.float32)).abs().max())
        if cuda:
            row["vector_graph_s"] = min(row[f"vector_graph_{how}_s"] for how in hows)
        best = row.get("vector_graph_s", row["vector_eager_s"])
        row["speedup_vs_heap"] = row["heap_s"] / best
        row["speedup_vs_heap_reference_style"] = row["heap_reference_style_s"] / best
        rows.append(row)
        us = lambda key: row.get(key, float("nan")) * 1e6  # noqa: E731
        same = all(row[f"same_tree_{how}"] for how in hows)
        print(f"B={budget:5d} nodes={n:5d} depth={row['max_depth']:2d} same={same} "
              f"topk {us('topk_s'):7.1f} (ref-style {us('topk_reference_style_s'):7.1f}) us  "
              f"heap {us('heap_s'):8.1f} (ref-style {us('heap_reference_style_s'):8.1f}) us  "
              f"vec-eager {us('vector_eager_s'):8.1f} us  graph topk {us('vector_graph_topk_s'):7.1f} "
              f"sort {us('vector_graph_sort_s'):7.1f} fused {us('vector_graph_fused_s'):6.1f} us "
              f"(fused eager {us('fused_eager_s'):6.1f})  x{row['speedup_vs_heap']:.1f} "
              f"(x{row['speedup_vs_heap_reference_style']:.1f} vs ref-style heap)", flush=True)
        if "part_select_kernel_s" in row:
            print("        parts (graph each): " + "  ".join(f"{name} {us('part_' + name + '_s'):6.1f}"
                  for name in ("empty_graph", "log_softmax_torch", "stats_kernel", "topk_kernels", "select_kernel"))
                  + f"  |lp - torch| max {row['logprob_max_abs_diff_vs_torch']:.2e}",
                  flush=True)
            print("        sweep: " + "  ".join(f"{key[6:-2]} {us(key):6.1f}" for key in row if key.startswith("sweep_")),
                  flush=True)
    print("\n| B | nodes | heap (ref-style) | heap (canonical top-k) | fused graph | vs ref-style heap | same_tree |", flush=True)
    print("|---|---|---|---|---|---|---|", flush=True)
    for row in rows:
        print(f"| {row['budget']} | {row['nodes']} | {row['heap_reference_style_s'] * 1e6:.1f} us | "
              f"{row['heap_s'] * 1e6:.1f} us | {row.get('vector_graph_fused_s', float('nan')) * 1e6:.1f} us | "
              f"x{row['heap_reference_style_s'] / row.get('vector_graph_fused_s', float('nan')):.1f} | "
              f"{row.get('same_tree_fused')} |", flush=True)
    return {"depth": args.depth, "vocab": args.vocab, "rows": rows, "fused_check": check}


def bench_verify(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Cost of one target forward over N new tokens against a context of P, Qwen3-8B shapes.

    The engine's own path: DynamicCache, the chain without a mask (causal), the tree with the
    ancestor-only mask and depth positions; the cache is cropped back to P after each forward.
    Graph timings capture that forward once per N and replay it (the context stays P)."""
    from ddtree_ops.engine.models import shaped_like
    from ddtree_ops.engine.verify import crop_kv, forward, tree_mask

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = shaped_like("qwen3-8b", layers=args.layers, dtype=dtype, device=str(device))
    vocab = model.config.vocab_size
    ctx = args.context
    gen = torch.Generator(device="cpu").manual_seed(0)
    with torch.inference_mode():
        _, cache, _ = forward(model, torch.randint(0, vocab, (ctx,), generator=gen), torch.arange(ctx), None)
    rows = []
    for n in [n for n in args.sizes if n <= args.max_tokens]:
        # a bushy tree of n tokens (root + n - 1 nodes): node i's parent is (i - 1) // 2
        parents = torch.tensor([-1] + [(i - 1) // 2 for i in range(1, n)], device=device)
        vis = ancestor_matrix(parents)
        depths = (vis.sum(dim=1) - 1).cpu()
        ids = torch.randint(0, vocab, (n,), generator=gen).to(device)   # on the device: graph-capturable
        row: dict[str, Any] = {"tokens": n, "tree_depth": int(depths.max())}
        variants = (("chain", None, torch.arange(ctx, ctx + n, device=device)),
                    ("tree", tree_mask(vis, ctx, dtype), (ctx + depths).to(device)))
        for label, mask, pos in variants:
            def fwd(mask: Any = mask, pos: torch.Tensor = pos) -> Any:
                logits, _, _ = forward(model, ids, pos, cache, mask)
                crop_kv(cache, ctx)
                return logits
            with torch.inference_mode():
                row[f"{label}_eager_s"] = median_time(fwd, device, args.reps)
                if device.type == "cuda" and not args.no_graphs:
                    keep = [(layer.keys, layer.values) for layer in cache.layers]   # the context the graph reads
                    try:
                        graph = torch.cuda.CUDAGraph()
                        s = torch.cuda.Stream()
                        s.wait_stream(torch.cuda.current_stream())
                        with torch.cuda.stream(s):
                            for _ in range(2):
                                fwd()
                        torch.cuda.current_stream().wait_stream(s)
                        with torch.cuda.graph(graph):
                            forward(model, ids, pos, cache, mask)
                        for layer, (k, v) in zip(cache.layers, keep):
                            layer.keys, layer.values = k, v
                        row[f"{label}_graph_s"] = graph_time(graph, device, args.reps)
                        del graph
                    except Exception as exc:      # report, do not hide
                        for layer, (k, v) in zip(cache.layers, keep):
                            layer.keys, layer.values = k, v
                        row[f"{label}_graph_error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        print(f"N={n:5d} chain eager {row['chain_eager_s'] * 1e3:8.3f} ms graph "
              f"{row.get('chain_graph_s', float('nan')) * 1e3:8.3f} ms | tree eager {row['tree_eager_s'] * 1e3:8.3f} ms "
              f"graph {row.get('tree_graph_s', float('nan')) * 1e3:8.3f} ms", flush=True)
        for key in ("chain_graph_error", "tree_graph_error"):
            if key in row:
                print(f"  {key}: {row[key]}", flush=True)
    return {"model": "qwen3-8b-shaped (random weights)", "layers": args.layers, "context": ctx,
            "dtype": str(dtype), "rows": rows}


def load_decode_model(spec: str, device: torch.device) -> tuple[Any, str]:
    from ddtree_ops.engine.models import load_model, shaped_like

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if spec == "smollm2":
        model, _ = load_model("smollm2", dtype=dtype, device=str(device))
        return model, "SmolLM2-135M-Instruct (Q4_1 GGUF weights, converted)"
    if spec.startswith("gguf:"):
        from transformers import AutoModelForCausalLM

        path = Path(spec[5:])
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype,
                                                     attn_implementation="sdpa")
        return model.to(device).eval(), "SmolLM2-135M-Instruct (Q4_1 GGUF weights)"
    return shaped_like("smollm2-135m", dtype=dtype, device=str(device)), "SmolLM2-135M-shaped, RANDOM weights"


def bench_decode(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    from ddtree_ops.engine.decoder import Decoder
    from ddtree_ops.engine.drafters import NGramDrafter

    model, label = load_decode_model(args.model, device)
    prompts = json.loads(Path(args.prompts).read_text()) if args.prompts else None
    if prompts is None:
        from ddtree_ops.engine.models import load_model
        from ddtree_ops.engine.verify_cmd import PROMPTS, encode_prompt

        _, tok = load_model("smollm2")
        prompts = [encode_prompt(tok, t) for t in PROMPTS[: args.n_prompts]]
    prompts = prompts[: args.n_prompts]
    eos = int(getattr(model.config, "eos_token_id", None) or 2)
    drafter = NGramDrafter(model.config.vocab_size, horizon=args.horizon)
    Decoder(model).generate(prompts[0], 4, "ar")                    # warm-up
    runs: dict[str, Any] = {}
    for mode, budget in [("ar", 0), ("chain", args.horizon)] + [("tree", b) for b in args.budgets]:
        dec = Decoder(model, drafter, budget=max(budget, 1), eos_token_id=eos,
                      builder="vector" if device.type == "cuda" else "heap")
        tokens = rounds = 0
        secs = 0.0
        outs = []
        for ids in prompts:
            r = dec.generate(ids, args.max_new_tokens, mode)
            tokens += len(r.tokens)
            rounds += r.rounds
            secs += r.elapsed_s
            outs.append(r.tokens)
        key = mode if mode != "tree" else f"tree_B{budget}"
        runs[key] = {"tokens": tokens, "seconds": round(secs, 3), "tokens_per_s": round(tokens / secs, 2),
                     "rounds": rounds, "tau": round(sum(len(o) for o in outs) / rounds, 4) if rounds else None,
                     "same_as_ar": None if mode == "ar" else outs == runs.get("_ar_out")}
        if mode == "ar":
            runs["_ar_out"] = outs
            # tau convention: tokens per verify round incl. bonus; AR is 1 by definition
            runs[key]["tau"] = 1.0
        print(f"{key:10s} {runs[key]['tokens_per_s']:8.2f} tok/s  tau {runs[key]['tau']}  rounds {rounds}  "
              f"same_as_ar {runs[key]['same_as_ar']}", flush=True)
    runs.pop("_ar_out")
    return {"model": label, "device": str(device), "horizon": args.horizon, "max_new_tokens": args.max_new_tokens,
            "prompts": len(prompts), "drafter": "n-gram prompt lookup", "runs": runs}


def machine(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "device": str(device), "threads": torch.get_num_threads()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    info["cpu"] = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), None)
    return info


def main() -> None:
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sections", nargs="+", choices=["treebuild", "verify", "decode"])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--budgets", type=ints, default=[16, 64, 256, 1024])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--depth", type=int, default=15)
    ap.add_argument("--check-seeds", type=int, default=4, help="treebuild: draft-like inputs in the fused-vs-heap check")
    ap.add_argument("--tree", choices=("spine", "plain"), default="spine",
                    help="treebuild: the tree's shape (the spine tree, the default build, or plain best-first)")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--sizes", type=ints, default=[1, 2, 4, 8, 16, 17, 32, 33, 64, 65, 128, 129, 256, 257, 512, 513,
                                                   1024, 1025])
    ap.add_argument("--max-tokens", type=int, default=1025)
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--prompts", default=None, help="JSON list of token-id lists (pretokenised elsewhere)")
    ap.add_argument("--n-prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--horizon", type=int, default=15)
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    results: dict[str, Any] = {"machine": machine(device)}
    print(json.dumps(results["machine"]), flush=True)
    for section in args.sections:
        t0 = time.perf_counter()
        print(f"== {section}", flush=True)
        results[section] = {"treebuild": bench_treebuild, "verify": bench_verify, "decode": bench_decode}[section](args, device)
        results[section]["wall_s"] = round(time.perf_counter() - t0, 1)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"engine_{section}.json").write_text(json.dumps({"machine": results["machine"],
                                                                         **results[section]}, indent=2))
    if os.environ.get("ENGINE_BENCH_JSON"):
        print(json.dumps(results))


if __name__ == "__main__":
    main()
