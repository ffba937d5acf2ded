#!/usr/bin/env python3
"""Train the model pair in one run: a small Qwen3 target and its DFlash draft.

    python3 bench/pair/train.py --out /tmp/pair                  # the H200 (scale gpu, ~4 minutes)
    python3 bench/pair/train.py --out /tmp/pair-cpu --scale cpu  # this machine, a few minutes

Writes DIR/target/ and DIR/draft/ (config.json, model.safetensors, tokenizer files), and
DIR/train_curve.json, DIR/train_meta.json, DIR/prompts.json. What it does, in order:
1. the corpus: the shipped CPython modules (scale test) or the machine's own Python sources
   (cpu, gpu), held-out files picked by hash, the text's hash recorded (corpus.py);
2. a byte-level BPE trained on the training files;
3. the target trained from scratch (target.py), rounded to bf16, its held-out loss and peakedness;
4. the measurement prompts cut from held-out text (prompts.json);
5. the target's greedy continuations of training-text prompts, the draft's only data;
6. the draft trained with DFlash's block objective (draft_train.py), its held-out agreement.

Deterministic: every random choice comes from `--seed` (torch generators, no clock). On CUDA it
runs with `torch.use_deterministic_algorithms` and the math attention kernel (the fused ones have
non-deterministic backward passes); see docs/pair.md for what is and is not bit-reproducible.
Runs under the machine's own torch/transformers (before any PYTHONPATH change on the device);
the checkpoints it writes load with transformers 5.12.1, which SGLang 0.5.17 pins.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]          # bench/pair modules, then the repo (ddtree_ops)

SEED = 20261203


def say(msg: str) -> None:
    print(f"[pair {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def setup(seed: int, device: str, threads: int | None) -> list[str]:
    """Determinism switches; returns a list that collects any 'non-deterministic' warnings."""
    if device.startswith("cuda"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")   # before cuBLAS starts
    import torch

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    seen: list[str] = []
    original = warnings.showwarning

    def record(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        text = str(message)
        if "determinis" in text and text not in seen:
            seen.append(text[:300])
        original(message, category, filename, lineno, file, line)

    warnings.showwarning = record
    return seen


def main(argv: list[str] | None = None) -> int:
    from scales import SCALES

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/pair"), help="output directory (replaced at the end)")
    ap.add_argument("--scale", choices=sorted(SCALES), default="gpu")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda for --scale gpu, else cpu)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = ap.parse_args(argv)
    scale = SCALES[args.scale]
    device = args.device or ("cuda" if scale.name == "gpu" else "cpu")
    nondeterministic = setup(args.seed, device, args.threads)
    run(scale, args.out, args.seed, device, nondeterministic)
    return 0


def run(scale: Any, out: Path, seed: int, device: str, nondeterministic: list[str] | None = None) -> dict[str, Any]:
    import torch
    import tokenizers
    import transformers
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import corpus
    import draft_train
    import target as target_mod
    from scales import flops
    from ddtree_ops.engine.dflash import DFlashDraft, DraftSpec, check_capture, check_pair, save_draft

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("pair: --device cuda but torch sees no GPU")
    walls: dict[str, float] = {}
    t_all = t = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t
        walls[name] = round(time.perf_counter() - t, 2)
        t = time.perf_counter()

    # 1-2. corpus and tokenizer
    files = corpus.sources(scale.text, scale.max_file_bytes)
    train_files = [f for f in files if not corpus.is_heldout(f, scale.heldout_mod)]
    held_files = [f for f in files if corpus.is_heldout(f, scale.heldout_mod)]
    train_keys, train_texts = corpus.read_texts(train_files, scale.corpus_bytes)
    held_keys, held_texts = corpus.read_texts(held_files, max(scale.corpus_bytes // scale.heldout_mod, 200_000))
    tok_texts, size = [], 0
    for text in train_texts:
        if size >= scale.tokenizer_bytes:
            break
        tok_texts.append(text)
        size += len(text)
    tok = corpus.train_tokenizer(tok_texts, scale.vocab)
    lap("tokenizer")
    train_stream = corpus.stream(corpus.encode(tok, train_texts))
    held_stream = corpus.stream(corpus.encode(tok, held_texts))
    lap("encode")
    say(f"corpus: {len(train_keys)} training files ({sum(map(len, train_texts)) / 1e6:.1f} MB, {len(train_stream):,} "
        f"tokens), {len(held_keys)} held-out files ({len(held_stream):,} tokens); vocab {tok.get_vocab_size()}")
    if tok.get_vocab_size() != scale.vocab:
        raise SystemExit(f"pair: the BPE reached {tok.get_vocab_size()} tokens, not {scale.vocab}: too little text")

    tokens = torch.tensor(train_stream, dtype=torch.long, device=device)
    held = torch.tensor(held_stream, dtype=torch.long)
    T = scale.target.seq_len
    n_windows = min(scale.eval_windows, (held.shape[0] - 1) // (T + 1))
    windows = held[:n_windows * (T + 1)].view(n_windows, T + 1)

    # 3. the target
    tcfg = target_mod.target_config(scale, transformers.__version__)
    torch.manual_seed(seed)
    model = target_mod.build_model(tcfg, device)
    # a fresh context for each phase (sdpa_kernel's is single-use); on CPU every backend stays
    # allowed, so the CPU runs keep their kernels and the same path is exercised here
    backends = [SDPBackend.MATH] if device.startswith("cuda") else \
        [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]

    def attention() -> Any:
        return sdpa_kernel(backends)

    with attention():
        curve_t, evals = target_mod.train(
            model, scale, tokens, seed, device, progress=say,
            evaluate=lambda m, k: target_mod.heldout_stats(m, windows[:k], device)["heldout_loss"])
    lap("target_train")
    model = target_mod.round_to_bf16(model, device)
    stats = target_mod.heldout_stats(model, windows, device)
    lap("target_eval")
    say(f"target: held-out loss {stats['heldout_loss']:.3f}, top-1 acc {stats['heldout_top1_acc']:.3f}, "
        f"top-1 p > 0.5 at {stats['share_top1_p_gt_0.5']:.1%} of positions")

    # 4. prompts for every later measurement, from held-out text
    prompts = corpus.cut_prompts(held_stream, scale.prompts, scale.prompt_len)

    # 5. the draft's data: the target's greedy continuations of training text (and of held-out text,
    #    for the draft's own evaluation)
    d = scale.draft
    gen = torch.Generator().manual_seed(seed + 2)
    starts = torch.randint(0, tokens.shape[0] - d.prompt_len, (d.gen_seqs,), generator=gen)
    seed_prompts = tokens.cpu()[starts[:, None] + torch.arange(d.prompt_len)]
    seqs = target_mod.greedy_continue(model, seed_prompts, d.gen_len, d.gen_batch, device)
    held_starts = torch.linspace(0, held.shape[0] - d.prompt_len - 1, d.eval_seqs).long()
    held_seqs = target_mod.greedy_continue(model, held[held_starts[:, None] + torch.arange(d.prompt_len)],
                                           d.gen_len, d.gen_batch, device)
    lap("continuations")
    say(f"continuations: {seqs.shape[0]} x {d.gen_len} tokens from the target")

    # 6. the draft
    spec = DraftSpec(hidden_size=scale.target.hidden, num_layers=d.layers, num_heads=scale.target.heads,
                     num_kv_heads=scale.target.kv_heads, head_dim=scale.target.head_dim,
                     intermediate_size=scale.target.intermediate, vocab_size=scale.vocab, block_size=d.block_size,
                     target_layer_ids=d.target_layer_ids, mask_token_id=tok.token_to_id(corpus.MASK),
                     num_target_layers=scale.target.layers, max_position_embeddings=scale.max_position)
    check_pair(spec, tcfg, "pair")
    check_capture(model, spec.target_layer_ids)
    torch.manual_seed(seed + 4)
    draft = DFlashDraft(spec)
    draft.init_weights()
    draft.to(device)
    with attention():
        curve_d = draft_train.train(draft, model, seqs, scale, seed, device, progress=say)
    lap("draft_train")
    draft = draft.to(torch.bfloat16)
    if not device.startswith("cuda"):
        draft = draft.float()
    draft_stats = draft_train.evaluate(draft, model, held_seqs, d.prompt_len, device)
    lap("draft_eval")
    say(f"draft: held-out depth agreement {draft_stats['depth_agreement'][:4]}..., teacher-forced chain tau "
        f"{draft_stats['teacher_forced_chain_tau']:.2f}")

    # outputs, written beside the destination and moved into place at the end
    out = Path(out)
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    target_mod.save(model, tcfg, tmp / "target")
    save_draft(draft, tmp / "draft", transformers_version=transformers.__version__)
    for sub in ("target", "draft"):
        corpus.write_tokenizer(tok, tmp / sub)
    (tmp / "prompts.json").write_text(json.dumps({
        "prompts": prompts, "text": [tok.decode(p, skip_special_tokens=False) for p in prompts],
        "source": f"held-out files (1 in {scale.heldout_mod} by key hash), evenly spaced windows of "
                  f"{scale.prompt_len} tokens"}) + "\n")
    (tmp / "train_curve.json").write_text(json.dumps({
        "seed": seed, "scale": scale.name, "target_loss": curve_t, "target_heldout": evals,
        "draft_loss": curve_d}) + "\n")
    lap("save")
    walls["total"] = round(time.perf_counter() - t_all, 2)
    n_target = sum(p.numel() for p in model.parameters())
    n_draft = sum(p.numel() for p in draft.parameters())
    meta = {
        "seed": seed, "scale": scale.to_json(), "device": device,
        "gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else None,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "tokenizers": tokenizers.__version__},
        "corpus": {"text": scale.text, "sha256": corpus.text_digest(train_keys + held_keys, train_texts + held_texts),
                   "train_files": len(train_keys), "heldout_files": len(held_keys),
                   "train_bytes": sum(map(len, train_texts)), "train_tokens": len(train_stream),
                   "heldout_tokens": len(held_stream), "chars_per_token": round(sum(map(len, train_texts)) /
                                                                              max(1, len(train_stream)), 3),
                   "files_seen": len(files)},
        "target": {"params": n_target, "config": {k: tcfg[k] for k in ("hidden_size", "num_hidden_layers",
                                                                          "num_attention_heads", "num_key_value_heads",
                                                                          "intermediate_size", "vocab_size")},
                   "tokens_seen": scale.target.steps * scale.target.batch * T, **stats,
                   "heldout_windows": n_windows},
        "draft": {"params": n_draft, "layers": d.layers, "block_size": d.block_size,
                  "target_layer_ids": list(d.target_layer_ids), "mask_token_id": spec.mask_token_id,
                  "continuations": int(seqs.shape[0]), "continuation_tokens": int(seqs.shape[0]) * d.gen_len,
                  "labels_seen": d.steps * d.batch * d.anchors * (d.block_size - 1), **draft_stats},
        "prompts": {"count": len(prompts), "length": scale.prompt_len},
        "wall_s": walls,
        "flops": {k: float(f"{v:.4g}") for k, v in flops(scale).items()},
        "achieved_tflop_s": {k: float(f"{v / walls[w] / 1e12:.3g}") for (k, v), w in
                             zip(flops(scale).items(), ("target_train", "continuations", "draft_train")) if walls[w] > 0},
        "sha256": {"tokenizer.json": sha256(tmp / "target" / "tokenizer.json"),
                   "target/model.safetensors": sha256(tmp / "target" / "model.safetensors"),
                   "draft/model.safetensors": sha256(tmp / "draft" / "model.safetensors")},
        "nondeterministic_warnings": list(nondeterministic or []),
    }
    (tmp / "train_meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    old = out.with_name(out.name + f".old-{os.getpid()}")
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
    say(f"wrote {out} in {walls['total']:.0f} s (target {n_target / 1e6:.1f} M params, draft {n_draft / 1e6:.1f} M)")
    return meta


if __name__ == "__main__":
    sys.exit(main())
