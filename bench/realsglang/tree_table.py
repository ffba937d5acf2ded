"""The table of a tree-serving run on real SGLang (bench/realsglang/tree.py's JSON), for BENCHMARKS.md:

    python3 bench/realsglang/tree_table.py bench/results/tree_serving_h100.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def table(doc: dict[str, Any]) -> str:
    loss = doc["lossless"]
    lines = [f"{doc['gpu']}, SGLang {doc['sglang']}, budget {doc['budget']}; {loss['prompts']} prompts x "
             f"{loss['tokens']} greedy tokens, {loss['dtype']}", "",
             "| batch | comparison | identical prompts | prompts that differ | target's top-2 gap where they differ |",
             "|---|---|---|---|---|"]
    for name, pairs in loss["sets"].items():
        for what, got in pairs.items():
            if got is None:
                continue
            gaps = ", ".join(f"{g:.6f}" for g in got["top2_gaps_at_diffs"]) or "-"
            lines.append(f"| {name.rsplit('batch', 1)[-1]} | {what.replace('_', ' ')} | "
                         f"{got['identical_prompts']}/{got['prompts']} | {len(got['diffs'])} | {gaps} |")
    lines += ["", "| server | SGLang accept length | plugin: exact rounds | tau_tree served | tau_chain paired | "
                  "projected speedup (lower bound) |", "|---|---|---|---|---|---|"]
    for name, s in doc["servers"].items():
        v = s.get("verdict") or {}
        acc = s.get("sglang_accept_len")
        lines.append(f"| {name} | {'-' if acc is None else f'{acc:.3f}'} | {v.get('exact_rounds', '-')} | "
                     f"{v.get('tau_tree', '-')} | {v.get('tau_chain', '-')} | "
                     + (f"{v['speedup']:.3f} ({v['lower']:.3f}) at r {v['r']} ({v['r_source']})" if v else "-") + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(json.loads(Path(sys.argv[1]).read_text())))
