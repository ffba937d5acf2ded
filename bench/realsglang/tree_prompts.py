"""The lossless set's prompts for a pair: windows of the shipped corpus in the pair's own tokenizer.

    python bench/realsglang/tree_prompts.py --pair DIR --out bench/realsglang/tree_prompts.json

The pair's own prompts.json holds 16 (the `cpu` scale) or 64 held-out windows; the lossless check asks
for 64 x 128 tokens at any scale, so the prompts are cut the pair's way (`corpus.cut_prompts`: evenly
spaced, none spanning two files) from the CPython text shipped in the repository, and written with the
SHA-256 of the tokenizer they were made with (`tree.py` refuses them for a pair with another one).
Whether the text was in the pair's training set does not matter here: the check compares servers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pair"))

import corpus  # noqa: E402  (bench/pair/corpus.py)


def tokenizer_sha256(pair: Path) -> str:
    return hashlib.sha256((pair / "target" / "tokenizer.json").read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--count", type=int, default=64)
    ap.add_argument("--length", type=int, default=32)
    args = ap.parse_args(argv)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(args.pair / "target" / "tokenizer.json"))
    files = corpus.shipped_sources()
    tokens = corpus.stream(corpus.encode(tok, [f.text or "" for f in files]))
    prompts = corpus.cut_prompts(tokens, args.count, args.length)
    doc = {"prompts": prompts, "tokenizer_sha256": tokenizer_sha256(args.pair), "source": str(corpus.SHIPPED.name),
           "count": args.count, "length": args.length}
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc) + "\n")
    tmp.replace(args.out)
    print(f"{len(prompts)} prompts of {args.length} tokens -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
