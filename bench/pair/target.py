"""The target: a Qwen3ForCausalLM (Hugging Face's own class, so the weight names are the ones
SGLang's Qwen3 loader reads), trained from scratch on the corpus, then rounded to bfloat16 (what
is saved and served) before anything is measured or generated with it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ddtree_ops.engine.verify import cache_kwarg, output_cache
from scales import Scale


def target_config(scale: Scale, transformers_version: str) -> dict[str, Any]:
    """config.json in the shape SGLang 0.5.17 served (bench/realsglang/models/tiny-qwen3)."""
    t = scale.target
    return {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 0, "dtype": "bfloat16", "eos_token_id": 0, "head_dim": t.head_dim, "hidden_act": "silu",
        "hidden_size": t.hidden, "initializer_range": 0.02, "intermediate_size": t.intermediate,
        "layer_types": ["full_attention"] * t.layers, "max_position_embeddings": scale.max_position,
        "max_window_layers": t.layers, "model_type": "qwen3", "num_attention_heads": t.heads,
        # no pad id: transformers would make it the embedding's padding_idx, zeroing <|endoftext|>'s row
        "num_hidden_layers": t.layers, "num_key_value_heads": t.kv_heads, "pad_token_id": None,
        "rms_norm_eps": 1e-6, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "sliding_window": None, "tie_word_embeddings": False, "transformers_version": transformers_version,
        "use_cache": True, "use_sliding_window": False, "vocab_size": scale.vocab,
    }


def build_model(config: dict[str, Any], device: str) -> Any:
    from transformers import Qwen3Config, Qwen3ForCausalLM  # the training machine's transformers

    cfg = Qwen3Config(**{k: v for k, v in config.items() if k not in ("architectures", "transformers_version", "dtype")})
    cfg._attn_implementation = "sdpa"
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg)
    return model


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warmup, then cosine down to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac)))


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def autocast(device: str) -> Any:
    """bfloat16 autocast on CUDA; plain float32 on CPU (CPU bf16 matmuls are slower there)."""
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def train(model: Any, scale: Scale, tokens: torch.Tensor, seed: int, device: str,
          evaluate: Callable[[Any, int], float] | None = None,
          progress: Callable[[str], None] = lambda s: None) -> tuple[list[float], list[dict[str, float]]]:
    """Next-token cross-entropy on random windows of the training stream. Returns the loss of
    every step and the held-out loss at `eval_every` steps."""
    t = scale.target
    n = int(tokens.shape[0])
    if n <= t.seq_len + 1:
        raise ValueError(f"training stream of {n} tokens is shorter than one window of {t.seq_len + 1}")
    opt = torch.optim.AdamW(param_groups(model, t.weight_decay), lr=t.lr, betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if device.startswith("cuda") else {}))
    gen = torch.Generator().manual_seed(seed + 1)
    span = torch.arange(t.seq_len + 1)
    losses = torch.zeros(t.steps, device=device)
    evals: list[dict[str, float]] = []
    model.train()
    for step in range(t.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, t.steps, t.lr, t.warmup)
        offsets = torch.randint(0, n - t.seq_len - 1, (t.batch,), generator=gen)
        x = tokens[(offsets[:, None] + span).to(tokens.device)].to(device)
        with autocast(device):
            logits = model(input_ids=x[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses[step] = loss.detach()
        if t.eval_every and evaluate is not None and (step + 1) % t.eval_every == 0 and step + 1 < t.steps:
            model.eval()
            evals.append({"step": step + 1, "heldout_loss": round(evaluate(model, 8), 4)})
            model.train()
        if (step + 1) % max(1, t.steps // 10) == 0:
            progress(f"target step {step + 1}/{t.steps}: loss {float(losses[step]):.3f}")
    model.eval()
    return [round(float(v), 4) for v in losses.cpu()], evals


def round_to_bf16(model: Any, device: str) -> Any:
    """The weights as saved: bfloat16. On CUDA the model then runs in bf16 (as SGLang serves it);
    on CPU in float32 holding the bf16-rounded values (exact, and faster there)."""
    for p in model.parameters():
        p.data = p.data.to(torch.bfloat16)
    if not device.startswith("cuda"):
        model.float()
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()


@torch.inference_mode()
def heldout_stats(model: Any, windows: torch.Tensor, device: str, batch: int = 16) -> dict[str, float]:
    """Held-out loss (nats/token), top-1 accuracy, and how peaked the next-token distributions are:
    the share of positions whose top-1 probability exceeds 0.5 (and 0.9)."""
    total = acc = over50 = over90 = 0.0
    count = 0
    for i in range(0, windows.shape[0], batch):
        x = windows[i:i + batch].to(device)
        with autocast(device):
            logits = model(input_ids=x[:, :-1]).logits.float()
        logp = torch.log_softmax(logits, dim=-1)
        y = x[:, 1:]
        total += float(-logp.gather(-1, y[..., None]).sum())
        top_p, top_i = logp.max(dim=-1)
        acc += float((top_i == y).sum())
        over50 += float((top_p > math.log(0.5)).sum())
        over90 += float((top_p > math.log(0.9)).sum())
        count += y.numel()
    return {"heldout_loss": round(total / count, 4), "heldout_top1_acc": round(acc / count, 4),
            "share_top1_p_gt_0.5": round(over50 / count, 4), "share_top1_p_gt_0.9": round(over90 / count, 4),
            "positions": count}


@torch.inference_mode()
def greedy_continue(model: Any, prompts: torch.Tensor, new_tokens: int, batch: int, device: str,
                    progress: Callable[[str], None] = lambda s: None) -> torch.Tensor:
    """The target's own greedy continuations, batched, with a KV cache: [N, P] -> [N, P + new]."""
    outs = []
    key = cache_kwarg(model)
    for i in range(0, prompts.shape[0], batch):
        x = prompts[i:i + batch].to(device)
        with autocast(device):                  # logits of the last position only: [B, 1, V], not [B, P, V]
            out = model(input_ids=x, use_cache=True, logits_to_keep=1)
        cache = output_cache(out)
        nxt = out.logits[:, -1].argmax(-1)
        gen = [nxt]
        for _ in range(new_tokens - 1):
            with autocast(device):
                out = model(input_ids=nxt[:, None], use_cache=True, logits_to_keep=1, **{key: cache})
            cache = output_cache(out)
            nxt = out.logits[:, -1].argmax(-1)
            gen.append(nxt)
        outs.append(torch.cat([x, torch.stack(gen, dim=1)], dim=1))
        progress(f"continuations {min(i + batch, prompts.shape[0])}/{prompts.shape[0]}")
    return torch.cat(outs)


def save(model: Any, config: dict[str, Any], dest: Path) -> None:
    from safetensors.torch import save_file  # a transformers dependency

    dest.mkdir(parents=True, exist_ok=True)
    tensors = {n: p.detach().to("cpu", torch.bfloat16).contiguous() for n, p in model.state_dict().items()}
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
