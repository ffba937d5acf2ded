"""The DFlash draft's training: the block-diffusion objective on the target's own greedy text.

Every sequence is a prompt from training text plus the target's greedy continuation of it (so a
label is what the target itself would emit, and the draft learns to agree with the target, not
with the corpus). One step takes a batch of sequences, runs the frozen target once over them to
get the features at the draft's layers, and places `anchors` blocks per sequence at random
positions a inside the continuation. A block is [x_a, MASK, ..., MASK] at positions a..a+b-1; it
sees the context features of positions < a (the committed tokens at that round: the root x_a is
not in the draft's context, exactly as in SGLang's decode), and its own block without a causal
order; other blocks are invisible. Block row k >= 1 is scored against x_{a+k} with the target's
LM head, weighted exp(-(k - 1) / gamma) (DFlash's decay: an early miss ends the chain, so early
depths matter most). The target's embedding and head are frozen and shared, as when served.

The forward is `ddtree_ops.engine.dflash.DFlashDraft`, the module the engine drafts with.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from ddtree_ops.engine.dflash import DFlashDraft, DraftSpec, expected_chain_tau
from scales import Scale
from target import autocast, lr_at, param_groups


@torch.no_grad()
def features(target: Any, seqs: torch.Tensor, spec: DraftSpec, device: str) -> torch.Tensor:
    """The target's captured features [B, T, K * d]: Hugging Face hidden_states[id + 1], the
    residual stream before layer id + 1, which is what SGLang's Qwen3 captures."""
    with autocast(device):                      # the decoder stack only: no logits are needed here
        out = target.model(input_ids=seqs, output_hidden_states=True)
    return torch.cat([out.hidden_states[i] for i in spec.capture_layers], dim=-1)


def sample_anchors(batch: int, low: int, high: int, count: int, gen: torch.Generator) -> torch.Tensor:
    """`count` distinct anchor positions in [low, high] per row, sorted: [B, count]."""
    choices = high - low + 1
    if choices < count:
        raise ValueError(f"only {choices} anchor positions for {count} anchors a sequence")
    order = torch.argsort(torch.rand(batch, choices, generator=gen), dim=1)[:, :count]
    return torch.sort(order + low, dim=1).values


def block_inputs(seqs: torch.Tensor, anchors: torch.Tensor, spec: DraftSpec
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Block token ids and positions [B, n*b], labels and label validity [B, n, b-1], and the
    attention mask [B, 1, n*b, T + n*b] (True = visible) for anchors [B, n] in seqs [B, T]."""
    b, n, bs = seqs.shape[0], anchors.shape[1], spec.block_size
    t = seqs.shape[1]
    dev = seqs.device
    ids = torch.full((b, n, bs), spec.mask_token_id, dtype=torch.long, device=dev)
    ids[:, :, 0] = seqs.gather(1, anchors)
    offsets = torch.arange(bs, device=dev)
    positions = anchors[..., None] + offsets                          # [B, n, bs]
    label_pos = positions[..., 1:]
    valid = label_pos < t
    labels = seqs.gather(1, label_pos.clamp(max=t - 1).reshape(b, -1)).view(b, n, bs - 1)
    ctx_visible = torch.arange(t, device=dev)[None, None, :] < anchors[..., None]        # [B, n, T]
    ctx_visible = ctx_visible[:, :, None, :].expand(b, n, bs, t).reshape(b, n * bs, t)
    block_of = torch.arange(n * bs, device=dev) // bs
    own_block = (block_of[:, None] == block_of[None, :])[None].expand(b, -1, -1)
    mask = torch.cat([ctx_visible, own_block], dim=-1)[:, None]
    return ids.view(b, n * bs), positions.view(b, n * bs), labels, valid, mask


def block_logits(draft: DFlashDraft, target: Any, seqs: torch.Tensor, feats: torch.Tensor, anchors: torch.Tensor,
                 device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Draft logits [B, n, b-1, V] for every block, with labels and validity."""
    spec = draft.spec
    ids, positions, labels, valid, mask = block_inputs(seqs, anchors, spec)
    b, t = seqs.shape
    with autocast(device):
        ctx = draft.project(feats)
        kv = draft.context_kv(ctx, torch.arange(t, device=seqs.device)[None].expand(b, t))
        with torch.no_grad():
            embeds = target.get_input_embeddings()(ids)
        hidden = draft(embeds, positions, kv, mask)
        hidden = hidden.view(b, anchors.shape[1], spec.block_size, -1)[:, :, 1:]
        logits = target.get_output_embeddings()(hidden)
    return logits.float(), labels, valid


def train(draft: DFlashDraft, target: Any, seqs: torch.Tensor, scale: Scale, seed: int, device: str,
          progress: Callable[[str], None] = lambda s: None) -> list[float]:
    d = scale.draft
    spec = draft.spec
    opt = torch.optim.AdamW(param_groups(draft, 0.01), lr=d.lr, betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if device.startswith("cuda") else {}))
    gen = torch.Generator().manual_seed(seed + 3)
    t = seqs.shape[1]
    depth = torch.arange(1, spec.block_size, device=device, dtype=torch.float32)
    decay = torch.exp(-(depth - 1) / d.gamma)
    losses = torch.zeros(d.steps, device=device)
    order = torch.randperm(seqs.shape[0], generator=gen)
    cursor = 0
    draft.train()
    for step in range(d.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, d.steps, d.lr, d.warmup)
        if cursor + d.batch > order.shape[0]:             # a new epoch, a new order
            order, cursor = torch.randperm(seqs.shape[0], generator=gen), 0
        rows = order[cursor:cursor + d.batch]
        cursor += d.batch
        x = seqs[rows.to(seqs.device)].to(device)
        feats = features(target, x, spec, device)
        anchors = sample_anchors(x.shape[0], d.prompt_len, t - 2, d.anchors, gen).to(device)
        logits, labels, valid = block_logits(draft, target, x, feats, anchors, device)
        weight = valid.float() * decay
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
        loss = (ce * weight.reshape(-1)).sum() / weight.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses[step] = loss.detach()
        if (step + 1) % max(1, d.steps // 10) == 0:
            progress(f"draft step {step + 1}/{d.steps}: loss {float(losses[step]):.3f}")
    draft.eval()
    return [round(float(v), 4) for v in losses.cpu()]


@torch.inference_mode()
def evaluate(draft: DFlashDraft, target: Any, seqs: torch.Tensor, prompt_len: int, device: str,
             batch: int = 16) -> dict[str, Any]:
    """On held-out continuations, with every position of the continuation as an anchor: the
    per-depth agreement of the draft's argmax with the target's greedy token, and the chain's
    tokens per round that agreement implies (1 + the leading run of agreeing depths)."""
    spec = draft.spec
    t = seqs.shape[1]
    correct_rows = []
    for i in range(0, seqs.shape[0], batch):
        x = seqs[i:i + batch].to(device)
        last = t - spec.block_size                          # anchors whose whole block has labels
        anchors = torch.arange(prompt_len, last + 1, device=device)[None].expand(x.shape[0], -1)
        feats = features(target, x, spec, device)
        logits, labels, _ = block_logits(draft, target, x, feats, anchors.contiguous(), device)
        correct_rows.append((logits.argmax(-1) == labels).reshape(-1, spec.block_size - 1).cpu())
    correct = torch.cat(correct_rows)
    return {"anchors": int(correct.shape[0]),
            "depth_agreement": [round(float(v), 4) for v in correct.float().mean(0)],
            "teacher_forced_chain_tau": round(expected_chain_tau(correct), 4)}
