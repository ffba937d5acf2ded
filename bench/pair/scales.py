"""The three sizes the one training script runs at: gpu (the H200), cpu (this machine, minutes),
test (inside the test suite). Step counts, never a clock: a run is the same run wherever it stops.
The test scale trains on the corpus shipped in the repository (the same on every machine); the
others on the machine's own Python sources, whose hash their train_meta.json records (corpus.py).

The gpu budget (the whole of train.py at most ~240 s on one H200, see docs/pair.md for the
arithmetic, `flops()` below): target 8 x 512, 29 M parameters, 2500 steps of 64 x 512 tokens
(82 M tokens, 0.19 GFLOP a token = 15.5 PFLOP); the draft's data 24,576 greedy continuations of
192 tokens; the draft 2 layers, 900 steps of 128 sequences with 24 blocks of 16 each (4.5 PFLOP).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class TargetScale:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    seq_len: int
    batch: int
    steps: int
    lr: float
    warmup: int
    weight_decay: float = 0.1
    eval_every: int = 0          # 0: held-out loss only at the end


@dataclass(frozen=True)
class DraftScale:
    layers: int
    target_layer_ids: tuple[int, ...]
    block_size: int
    prompt_len: int              # continuation prompts cut from training text
    gen_len: int                 # the target's greedy continuation per prompt
    gen_seqs: int
    gen_batch: int
    batch: int
    anchors: int                 # blocks per sequence per step
    steps: int
    lr: float
    warmup: int
    gamma: float                 # loss weight exp(-(k - 1) / gamma) at depth k (DFlash's decay)
    eval_seqs: int = 64


@dataclass(frozen=True)
class Scale:
    name: str
    corpus_bytes: int
    tokenizer_bytes: int         # the BPE is trained on the first this-many bytes of training text
    max_file_bytes: int
    heldout_mod: int
    vocab: int
    target: TargetScale
    draft: DraftScale
    eval_windows: int = 64       # held-out windows of seq_len for loss and peakedness
    prompts: int = 64
    prompt_len: int = 64
    max_position: int = 2048
    text: str = "machine"        # the corpus: "machine" (this machine's Python sources) or "shipped" (corpus.py)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


SCALES: dict[str, Scale] = {
    "gpu": Scale(
        name="gpu", corpus_bytes=96_000_000, tokenizer_bytes=16_000_000, max_file_bytes=1 << 20, heldout_mod=50,
        vocab=4096,
        target=TargetScale(hidden=512, layers=8, heads=8, kv_heads=4, head_dim=64, intermediate=1536, seq_len=512,
                           batch=64, steps=2500, lr=1.5e-3, warmup=150, eval_every=500),
        draft=DraftScale(layers=2, target_layer_ids=(1, 6), block_size=16, prompt_len=64, gen_len=192,
                         gen_seqs=24576, gen_batch=4096, batch=128, anchors=24, steps=900, lr=1.5e-3, warmup=60,
                         gamma=7.0, eval_seqs=256)),
    "cpu": Scale(
        name="cpu", corpus_bytes=4_000_000, tokenizer_bytes=2_000_000, max_file_bytes=1 << 20, heldout_mod=25,
        vocab=1024,
        target=TargetScale(hidden=128, layers=4, heads=4, kv_heads=2, head_dim=32, intermediate=384, seq_len=128,
                           batch=16, steps=300, lr=3e-3, warmup=30, eval_every=100),
        draft=DraftScale(layers=2, target_layer_ids=(0, 2), block_size=16, prompt_len=32, gen_len=96,
                         gen_seqs=384, gen_batch=128, batch=16, anchors=8, steps=250, lr=2e-3, warmup=25,
                         gamma=7.0, eval_seqs=32),
        eval_windows=32, prompts=16, prompt_len=32),
    "test": Scale(
        name="test", corpus_bytes=600_000, tokenizer_bytes=600_000, max_file_bytes=1 << 18, heldout_mod=10,
        vocab=384,
        target=TargetScale(hidden=64, layers=4, heads=2, kv_heads=1, head_dim=32, intermediate=192, seq_len=128,
                           batch=16, steps=200, lr=4e-3, warmup=20),
        draft=DraftScale(layers=1, target_layer_ids=(0, 2), block_size=8, prompt_len=32, gen_len=64,
                         gen_seqs=256, gen_batch=128, batch=16, anchors=8, steps=200, lr=3e-3, warmup=20,
                         gamma=4.0, eval_seqs=32),
        eval_windows=16, prompts=6, prompt_len=32, text="shipped"),
}


def flops(scale: Scale) -> dict[str, float]:
    """Matmul + attention FLOPs of each phase (training = 3 x forward), for the budget and for the
    achieved throughput a run reports. Attention is counted in full (T x T): the deterministic
    math kernel computes the masked half too."""
    t, d = scale.target, scale.draft
    dim, heads, kv, hd, layers, vocab = t.hidden, t.heads, t.kv_heads, t.head_dim, t.layers, scale.vocab
    per_layer = dim * heads * hd + 2 * dim * kv * hd + heads * hd * dim + 3 * dim * t.intermediate

    def fwd(ctx: float, n_layers: int = layers, head: bool = True) -> float:
        return 2 * (n_layers * per_layer + (dim * vocab if head else 0)) + 4 * ctx * heads * hd * n_layers

    seq = d.prompt_len + d.gen_len
    blocks = d.anchors * d.block_size
    draft_seq = (seq * fwd(seq, head=False)                                   # the frozen target's features
                 + 3 * seq * 2 * (len(d.target_layer_ids) * dim * dim + d.layers * 2 * dim * kv * hd)   # fc, ctx K/V
                 + 3 * blocks * (2 * d.layers * per_layer + 4 * (seq + blocks) * heads * hd * d.layers)
                 + 3 * d.anchors * (d.block_size - 1) * 2 * dim * vocab)     # the shared head
    return {
        "target_train": t.steps * t.batch * t.seq_len * 3 * fwd(t.seq_len),
        "continuations": (d.gen_seqs + d.eval_seqs) * (d.prompt_len * fwd(d.prompt_len)
                                                        + d.gen_len * fwd(d.prompt_len + d.gen_len / 2)),
        "draft_train": d.steps * d.batch * draft_seq,
    }
