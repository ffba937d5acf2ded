#!/usr/bin/env python3
"""The pair's table from its raw files: train_meta.json, train_curve.json, engine_run.json.

    python3 bench/pair/report.py bench/results/pair        # the H200 run
    python3 bench/pair/report.py bench/results/pair-cpu    # this machine's cpu-scale run

Markdown on stdout; a missing file leaves its rows out and says so on stderr.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def load(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        print(f"report: {path} is missing; its rows are left out", file=sys.stderr)
        return None
    return json.loads(path.read_text())


def rows(meta: dict[str, Any] | None, curve: dict[str, Any] | None, run: dict[str, Any] | None) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if meta:
        t, d, c, w = meta["target"], meta["draft"], meta["corpus"], meta["wall_s"]
        where = meta.get("gpu") or meta.get("device")
        out += [
            ("machine", f"{where}; torch {meta['versions']['torch']}, transformers {meta['versions']['transformers']}"),
            ("seed / scale", f"{meta['seed']} / {meta['scale']['name']}"),
            ("corpus", f"{c['train_files']} training files, {c['train_tokens']:,} tokens ({c['chars_per_token']} "
                       f"chars/token); {c['heldout_files']} held-out files, {c['heldout_tokens']:,} tokens"),
            ("target", f"Qwen3 {t['config']['num_hidden_layers']} x {t['config']['hidden_size']}, "
                       f"{t['params'] / 1e6:.1f} M params, {t['tokens_seen'] / 1e6:.1f} M tokens seen"),
            ("target held-out", f"loss {t['heldout_loss']:.3f} nats/token, top-1 acc {t['heldout_top1_acc']:.1%}, "
                                f"top-1 p > 0.5 at {t['share_top1_p_gt_0.5']:.1%} of positions "
                                f"(> 0.9 at {t['share_top1_p_gt_0.9']:.1%})"),
            ("draft", f"DFlash {d['layers']} layers, block {d['block_size']}, target layers {d['target_layer_ids']}, "
                      f"{d['params'] / 1e6:.2f} M params, {d['continuations']:,} continuations, "
                      f"{d['labels_seen'] / 1e6:.1f} M labels seen"),
            ("draft held-out agreement", "depth 1-4: " + ", ".join(f"{a:.2f}" for a in d["depth_agreement"][:4])
             + f"; teacher-forced chain tau {d['teacher_forced_chain_tau']:.2f}"),
            ("train wall (s)", ", ".join(f"{k} {v}" for k, v in w.items())),
        ]
        if meta.get("achieved_tflop_s"):
            out.append(("achieved TFLOP/s", ", ".join(f"{k} {v}" for k, v in meta["achieved_tflop_s"].items())))
    if curve:
        tl, dl = curve["target_loss"], curve["draft_loss"]
        out.append(("loss curve", f"target {tl[0]:.2f} -> {tl[-1]:.2f} over {len(tl)} steps; "
                                  f"draft {dl[0]:.2f} -> {dl[-1]:.2f} over {len(dl)} steps"))
    if run:
        out += [
            ("engine decode", f"{run['prompts']} prompts x {run['max_new']} tokens, budget {run['budget']}, "
                              f"{run['dtype']} on {run.get('gpu') or run['device']}, {run['reps']} turns"),
            ("lossless vs AR greedy", f"{run['lossless']} ({len(run['divergences'])} divergences)"),
            ("tau chain / tree", f"{run['tau_chain']:.3f} / {run['tau_tree']:.3f} "
                                 f"({run['rounds_chain']} / {run['rounds_tree']} rounds)"),
            ("tok/s AR / chain / tree", f"{run['tok_s_ar']} / {run['tok_s_chain']} / {run['tok_s_tree']}"),
            ("A/A (chain again / chain)", f"{run['aa_ratio']}; tree / chain {run['tree_over_chain']}; faster: "
                                          f"{run['faster']}"),
        ]
        sh = run.get("shadow")
        if sh:
            ratio = f"{sh['cost_ratio']:.3f}" if sh.get("cost_ratio") is not None else "n/a"
            out.append(("engine shadow", f"{sh['rounds']} rounds, tau_chain {sh['tau_chain']:.3f}, tau_tree "
                                         f"{(sh['tau_tree'] or 0):.3f} exact, lower bound {sh['tau_tree_lower']:.3f}, "
                                         f"cost ratio {ratio}, {sh['recommendation']}"))
    return out


def table_only(ap: Any, argv: list[str] | None, table: Any) -> Any:
    """The measurement scripts' shared front: `--table FILE` prints the table of a raw file written
    before (None is returned: nothing to run); otherwise `--out` is required and the arguments
    come back."""
    ap.add_argument("--out", type=Path, help="write the raw results here (JSON)")
    ap.add_argument("--table", type=Path, help="print the table of a file written before, and stop")
    args = ap.parse_args(argv)
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return None
    if not args.out:
        ap.error("--out or --table")
    return args


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: report.py RESULTS_DIR", file=sys.stderr)
        return 64
    d = Path(argv[0])
    table = rows(load(d / "train_meta.json"), load(d / "train_curve.json"), load(d / "engine_run.json"))
    if not table:
        return 1
    print(f"| {d.name} | |\n|---|---|")
    for k, v in table:
        print(f"| {k} | {v} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
