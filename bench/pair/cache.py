"""A trained pair kept under a key of its inputs, in the engine's cache directory.

    out, meta, trained = cached_pair(SCALES["test"], SEED)

The key is a hash of everything that decides the files train.py writes: the corpus (the shipped
text's recorded hash, or the hash of the machine's text as read), the seed, the scale's sizes,
the device, the training code (bench/pair's modules and the draft model in
ddtree_ops/engine/dflash.py, by content) and the versions of torch, transformers and tokenizers
(their arithmetic and file formats). The pair lives in `cache_root()/pairs/<scale>-<seed>-<key>`;
a second call with the same inputs finds it and trains nothing, a changed input trains a new one
beside it. A directory is used only when its `cache_key.json` holds the same inputs and its weight
files still have the SHA-256 its train_meta.json recorded; otherwise it is trained again (train.run
writes beside the destination and moves the result into place, so a crash leaves no half pair).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [p for p in (str(HERE), str(REPO)) if p not in sys.path]

CODE = (HERE / "train.py", HERE / "corpus.py", HERE / "target.py", HERE / "draft_train.py", HERE / "scales.py",
        REPO / "ddtree_ops" / "engine" / "dflash.py")
PACKAGES = ("torch", "transformers", "tokenizers")


def code_digest(files: tuple[Path, ...] = CODE) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def corpus_digest(scale: Any) -> str:
    """The shipped text's recorded hash, or the hash of what a run would read from this machine."""
    import corpus

    if scale.text == "shipped":
        return corpus.SHIPPED_SHA256
    files = corpus.sources(scale.text, scale.max_file_bytes)
    train = [f for f in files if not corpus.is_heldout(f, scale.heldout_mod)]
    held = [f for f in files if corpus.is_heldout(f, scale.heldout_mod)]
    keys, texts = corpus.read_texts(train, scale.corpus_bytes)
    hkeys, htexts = corpus.read_texts(held, max(scale.corpus_bytes // scale.heldout_mod, 200_000))
    return corpus.text_digest(keys + hkeys, texts + htexts)


def versions() -> dict[str, str]:
    return {p: importlib.metadata.version(p) for p in PACKAGES}


def key_inputs(scale: Any, seed: int, device: str) -> dict[str, Any]:
    """As JSON gives them back (tuples as lists), so a stored copy compares equal."""
    inputs = {"corpus": corpus_digest(scale), "seed": int(seed), "scale": scale.to_json(), "device": device,
              "code": code_digest(), "versions": versions()}
    return json.loads(json.dumps(inputs))


def cache_key(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def pairs_root() -> Path:
    from ddtree_ops.engine.models import cache_root

    return cache_root() / "pairs"


def usable(dest: Path, inputs: dict[str, Any]) -> dict[str, Any] | None:
    """The pair's meta when `dest` holds a whole pair made from `inputs`, else None."""
    import train

    try:
        if json.loads((dest / "cache_key.json").read_text()) != inputs:
            return None
        meta = json.loads((dest / "train_meta.json").read_text())
        for name, digest in meta["sha256"].items():
            path = dest / (name if "/" in name else f"target/{name}")
            if train.sha256(path) != digest:
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return meta


def cached_pair(scale: Any, seed: int, device: str = "cpu", root: Path | None = None,
                progress: Any = None) -> tuple[Path, dict[str, Any], bool]:
    """(the pair's directory, its train_meta, whether it was trained now)."""
    import train

    inputs = key_inputs(scale, seed, device)
    dest = (root or pairs_root()) / f"{scale.name}-{seed}-{cache_key(inputs)}"
    meta = usable(dest, inputs)
    if meta is not None:
        return dest, meta, False
    if progress is not None:
        progress(f"training the {scale.name} pair (seed {seed}) into {dest}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    nondeterministic = train.setup(seed, device, None)
    train.run(scale, dest, seed, device, nondeterministic)
    tmp = dest / "cache_key.json.tmp"
    tmp.write_text(json.dumps(inputs, indent=1, sort_keys=True) + "\n")
    tmp.replace(dest / "cache_key.json")
    return dest, json.loads((dest / "train_meta.json").read_text()), True
