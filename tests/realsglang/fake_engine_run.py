"""LAB STAND-IN for bench/pair/engine_run.py (the pair helper's engine decode of a trained pair):
the contract's arguments and output keys, figures made up, for the truth group's dry run here."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("--pair", required=True, type=Path)
ap.add_argument("--budget", type=int, required=True)
ap.add_argument("--max-new", type=int, required=True)
ap.add_argument("--out", required=True, type=Path)
ap.add_argument("--device", default="cpu")
ap.add_argument("--prompts", type=int, default=32)
ap.add_argument("--no-shadow", action="store_true")
a = ap.parse_args()
prompts = json.loads((a.pair / "prompts.json").read_text())["prompts"][:a.prompts]
a.out.write_text(json.dumps({"tau_chain": 2.4, "tau_tree": 2.9, "budget": a.budget, "lossless": True,
                             "tok_s_chain": 100.0, "tok_s_tree": 110.0, "tok_s_ar": 50.0,
                             "rounds_chain": 10 * len(prompts), "rounds_tree": 8 * len(prompts),
                             "prompts_asked": a.prompts, "no_shadow": a.no_shadow, "standin": "fake_engine_run.py",
                             "prompts": len(prompts), "max_new": a.max_new, "complete": True}))
