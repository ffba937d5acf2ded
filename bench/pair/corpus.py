"""The pair's text and tokenizer: the Python sources on the machine itself, a byte-level BPE.

Files come from the standard library (`sysconfig.get_paths()['stdlib']`, its own site-packages
left out) and from every `site.getsitepackages()` directory. Each file has a key
(`stdlib/<relpath>` or `site/<relpath>`), and everything is ordered by the SHA-1 of that key, not
by walk order or by name: the same files give the same corpus, and a byte cap takes a spread of
packages rather than the first ones in the alphabet. A file is held out when its key's hash says
so (one in `heldout_mod`), decided before any training, so held-out text is never trained on.

What is not the same across machines: which files exist (a Python version and its packages);
so the corpus, the tokenizer and then every weight differ from one machine to another.
"""

from __future__ import annotations

import hashlib
import json
import os
import site
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EOS = "<|endoftext|>"
MASK = "<|MASK|>"
SPECIAL = (EOS, MASK)          # ids 0 and 1: the document separator / eos, and DFlash's mask token
SKIP_DIRS = {"__pycache__", "site-packages", "dist-packages"}


@dataclass(frozen=True)
class SourceFile:
    key: str
    path: Path
    size: int

    @property
    def digest(self) -> int:
        return int.from_bytes(hashlib.sha1(self.key.encode()).digest()[:8], "big")


def source_roots() -> list[tuple[str, Path]]:
    roots: list[tuple[str, Path]] = [("stdlib", Path(sysconfig.get_paths()["stdlib"]))]
    seen = {roots[0][1].resolve()}
    for d in site.getsitepackages():
        p = Path(d)
        if p.is_dir() and p.resolve() not in seen:
            seen.add(p.resolve())
            roots.append(("site", p))
    return roots


def python_sources(max_file_bytes: int, roots: list[tuple[str, Path]] | None = None) -> list[SourceFile]:
    """Every .py file under the roots (no caches, no nested site-packages), in hash order.
    Files over `max_file_bytes` (generated tables, vendored bundles) are left out."""
    found: dict[str, SourceFile] = {}
    for kind, root in roots or source_roots():
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".dist-info"))
            for name in sorted(filenames):
                if not name.endswith(".py"):
                    continue
                path = Path(dirpath) / name
                try:
                    size = path.stat().st_size
                except OSError:
                    continue
                if 0 < size <= max_file_bytes:
                    key = f"{kind}/{path.relative_to(root).as_posix()}"
                    found.setdefault(key, SourceFile(key, path, size))
    return sorted(found.values(), key=lambda f: (f.digest, f.key))


def is_heldout(f: SourceFile, heldout_mod: int) -> bool:
    return (f.digest >> 20) % heldout_mod == 0


def read_texts(files: list[SourceFile], cap_bytes: int) -> tuple[list[str], list[str]]:
    """(keys, texts) of the files in order until `cap_bytes`; undecodable files are skipped."""
    keys, texts, total = [], [], 0
    for f in files:
        if total >= cap_bytes:
            break
        try:
            text = f.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        keys.append(f.key)
        texts.append(text)
        total += len(text)
    return keys, texts


def train_tokenizer(texts: list[str], vocab_size: int) -> Any:
    """Byte-level BPE with the two special tokens at ids 0 and 1. The trainer breaks count ties
    by the pair itself, so the same texts give the same merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # the training run's own

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL), min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    for i, s in enumerate(SPECIAL):
        if tok.token_to_id(s) != i:
            raise RuntimeError(f"special token {s} got id {tok.token_to_id(s)}, expected {i}")
    return tok


def encode(tok: Any, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def stream(docs: list[list[int]]) -> list[int]:
    """Documents joined by the separator, as the target sees them in training."""
    out: list[int] = []
    for ids in docs:
        out.extend(ids)
        out.append(0)
    return out


def cut_prompts(tokens: list[int], count: int, length: int) -> list[list[int]]:
    """`count` windows of `length` tokens at evenly spaced offsets, each moved forward past any
    document separator so no prompt spans two files. Deterministic, no randomness."""
    n = len(tokens)
    if n < length * 2:
        raise ValueError(f"held-out text of {n} tokens is too short for prompts of {length}")
    stride = max(1, (n - length) // count)
    prompts: list[list[int]] = []
    start = 0
    while len(prompts) < count and start + length <= n:
        window = tokens[start:start + length]
        if 0 in window:
            start += window.index(0) + 1
            continue
        prompts.append(window)
        start = max(start + length, len(prompts) * stride)
    if len(prompts) < count:
        raise ValueError(f"held-out text gave only {len(prompts)} clean prompts of {length} tokens, wanted {count}")
    return prompts


def write_tokenizer(tok: Any, dest: Path) -> None:
    """tokenizer.json + tokenizer_config.json in the shape SGLang 0.5.17 loaded with transformers
    5.12.1 (bench/realsglang/models/tiny-qwen3): the tokenizers backend, eos = pad = <|endoftext|>."""
    dest.mkdir(parents=True, exist_ok=True)
    tok.save(str(dest / "tokenizer.json"))
    config = {"backend": "tokenizers", "bos_token": None, "eos_token": EOS, "mask_token": MASK,
              "model_max_length": 2048, "pad_token": EOS, "tokenizer_class": "TokenizersBackend", "unk_token": None}
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
