"""The pair's text and tokenizer: Python sources, a byte-level BPE.

Two sources of text, by the scale's `text`:
- "shipped" (the `test` scale, which the test suite trains): 43 modules of CPython 3.11.7's
  standard library, kept in the repository (`text/cpython-3.11.7-lib.jsonl.xz`, PSF License,
  `text/README.md`; `make_text.py` wrote it) and checked against `SHIPPED_SHA256` on every read.
  The same on every machine, so the tokenizer and the weights depend only on the seed and on
  the float arithmetic of the machine's torch.
- "machine" (the `cpu` and `gpu` scales): the Python sources on the machine itself, the standard
  library (`sysconfig.get_paths()['stdlib']`, its own site-packages left out) and every
  `site.getsitepackages()` directory. Which files exist differs from machine to machine (a Python
  version and its packages), so the corpus, the tokenizer and every weight do too; the run's
  `train_meta.json` records the hash of the text it read (`text_digest`), so two runs can be told
  to have read the same corpus or not.

Each file has a key (`stdlib/<relpath>` or `site/<relpath>`), and everything is ordered by the
SHA-1 of that key, not by walk order or by name: the same files give the same corpus, and a byte
cap takes a spread of packages rather than the first ones in the alphabet. A file is held out when
its key's hash says so (one in `heldout_mod`), decided before any training, so held-out text is
never trained on.
"""

from __future__ import annotations

import hashlib
import json
import lzma
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
SHIPPED = Path(__file__).resolve().parent / "text" / "cpython-3.11.7-lib.jsonl.xz"
SHIPPED_SHA256 = "39d268e3a3b1293df628bc764cc8163e6dd324f4b7bf90286999c5369c32076f"   # of the JSON lines


@dataclass(frozen=True)
class SourceFile:
    key: str
    path: Path | None            # None: the text is in memory (the shipped corpus)
    size: int
    text: str | None = None

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


def shipped_sources(path: Path = SHIPPED, sha256: str = SHIPPED_SHA256) -> list[SourceFile]:
    """The shipped corpus, in hash order; refused unless its content hash is the recorded one
    (a changed file would silently make another pair)."""
    try:
        data = lzma.decompress(path.read_bytes())
    except (OSError, lzma.LZMAError) as exc:
        raise ValueError(f"{path}: cannot read the shipped corpus ({exc})") from None
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise ValueError(f"{path}: content sha256 {got} is not the recorded {sha256} (corpus.SHIPPED_SHA256); "
                         "the shipped corpus changed")
    files = []
    for n, line in enumerate(data.decode("utf-8").splitlines(), 1):
        doc = json.loads(line)
        if not isinstance(doc, dict) or not isinstance(doc.get("key"), str) or not isinstance(doc.get("text"), str):
            raise ValueError(f"{path}: line {n} is not {{\"key\": str, \"text\": str}}")
        files.append(SourceFile(doc["key"], None, len(doc["text"].encode("utf-8")), doc["text"]))
    return sorted(files, key=lambda f: (f.digest, f.key))


def sources(text: str, max_file_bytes: int) -> list[SourceFile]:
    """The scale's files: "shipped" (fixed, in the repository) or "machine" (this machine's)."""
    if text == "shipped":
        return [f for f in shipped_sources() if f.size <= max_file_bytes]
    if text == "machine":
        return python_sources(max_file_bytes)
    raise ValueError(f"unknown corpus text {text!r}: expected 'shipped' or 'machine'")


def text_digest(keys: list[str], texts: list[str]) -> str:
    """SHA-256 over the (key, text) pairs in order: the corpus a run read, as one hash."""
    h = hashlib.sha256()
    for key, text in zip(keys, texts):
        for part in (key, text):
            b = part.encode("utf-8")
            h.update(len(b).to_bytes(8, "big"))
            h.update(b)
    return h.hexdigest()


def is_heldout(f: SourceFile, heldout_mod: int) -> bool:
    return (f.digest >> 20) % heldout_mod == 0


def read_texts(files: list[SourceFile], cap_bytes: int) -> tuple[list[str], list[str]]:
    """(keys, texts) of the files in order until `cap_bytes`; undecodable files are skipped."""
    keys, texts, total = [], [], 0
    for f in files:
        if total >= cap_bytes:
            break
        try:
            text = f.text if f.text is not None else f.path.read_text(encoding="utf-8")  # type: ignore[union-attr]
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
