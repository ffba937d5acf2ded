"""Tree verification: one target forward over root + nodes, the walk, KV compaction.

The walk follows the target's own choice at each node (argmax at temperature 0, one sample per
node otherwise) and never looks at draft probabilities, so every emitted token is the target's
choice given exactly the emitted prefix: the output equals plain decoding (greedy) or has its
distribution (sampling). A chain is a tree with one child per node and goes through the same
code; only the attention mask is skipped for it, since a chain's visibility is causal.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ddtree_ops.engine.tree import Tree


@dataclass(frozen=True)
class SamplingParams:
    """The request's sampling transforms, applied to target logits before the per-node choice."""

    temperature: float = 0.0
    top_k: int = 0            # 0: off
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    def validate(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


class Sampler(Protocol):
    def __call__(self, probs: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One token per row of `probs` [N, V]; `positions` [N] are the drawn tokens' positions."""
        ...


class MultinomialSampler:
    """An independent draw per node, as in production."""

    def __init__(self, generator: torch.Generator | None = None) -> None:
        self.generator = generator

    def __call__(self, probs: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return torch.multinomial(probs, 1, generator=self.generator).view(-1)


class PositionalSampler:
    """Inverse-CDF draws with one uniform per absolute position (seeded by seed and position).

    Tree nodes at one depth share a position, hence a uniform; only one node per depth is ever
    on the accepted path, so each emitted token still gets a fresh independent uniform and the
    output distribution is untouched. The coupling makes tree or chain sampling reproduce AR
    sampling token for token, which turns a distributional claim into an exact, failable test.
    """

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)

    def uniform(self, position: int) -> float:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + int(position))
        return float(torch.rand((), generator=gen, dtype=torch.float64))

    def __call__(self, probs: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cdf = torch.cumsum(probs.double().cpu(), dim=-1)
        cdf = cdf / cdf[:, -1:]
        u = torch.tensor([[self.uniform(p)] for p in positions.tolist()], dtype=torch.float64)
        tokens = torch.searchsorted(cdf, u, right=True).clamp_max_(probs.shape[-1] - 1)
        return tokens.view(-1).to(probs.device)


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus, keeping at least the top token)."""
    scaled = logits.float() / params.temperature
    if params.top_k > 0 and params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p      # mass strictly above each token
        sorted_p = sorted_p.masked_fill(before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def target_choices(logits: torch.Tensor, params: SamplingParams, positions: torch.Tensor,
                   sampler: Sampler | None) -> torch.Tensor:
    """The target's own choice at every node: `logits` [N, V] -> tokens [N]."""
    if params.greedy:
        return torch.argmax(logits, dim=-1)
    if sampler is None:
        raise ValueError("temperature > 0 needs a sampler")
    return sampler(sampling_probs(logits, params), positions + 1)


def walk(children: list[dict[int, int]], post: list[int]) -> tuple[list[int], int]:
    """Follow the target's choices down the tree: accepted node indices (root first), next bonus."""
    accepted = [0]
    cur, nxt = 0, post[0]
    while nxt in children[cur]:
        cur = children[cur][nxt]
        accepted.append(cur)
        nxt = post[cur]
    return accepted, nxt


def walk_device(tree: Tree, visibility: torch.Tensor, post: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same walk without a host loop (the GPU idle bubble the vLLM port measured).

    A node is accepted when its token is its parent's target choice and so is every ancestor's;
    siblings are distinct, so the accepted nodes form one path. Returns (accepted indices, bonus).
    """
    match = torch.ones_like(tree.tokens, dtype=torch.bool)
    match[1:] = tree.tokens[1:] == post[tree.parents[1:]]
    accepted = ~(visibility & ~match.unsqueeze(0)).any(dim=1)
    deepest = torch.argmax(torch.where(accepted, tree.depths, -1))
    path = torch.nonzero(visibility[deepest], as_tuple=False).view(-1)   # ascending = root first
    return path, post[deepest]


def tree_mask(visibility: torch.Tensor, past: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [1, 1, N, past + N]: all committed tokens visible, tree tokens per visibility."""
    n = visibility.shape[0]
    allowed = torch.cat([torch.ones((n, past), dtype=torch.bool, device=visibility.device), visibility], dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=visibility.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.view(1, 1, n, past + n)


def kv_length(cache: Any) -> int:
    return int(cache.get_seq_length())


def _kv_layers(cache: Any) -> list[Any]:
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"unsupported KV cache type {type(cache).__name__}: expected a DynamicCache")
    return list(layers)


def crop_kv(cache: Any, length: int) -> None:
    for layer in _kv_layers(cache):
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            layer.keys = layer.keys[..., :length, :]
            layer.values = layer.values[..., :length, :]


def compact_kv(cache: Any, start: int, accepted: list[int]) -> bool:
    """Keep only the accepted path's entries of the block appended at `start`.

    Returns True when entries moved. A path of 0, 1, ..., a - 1 is already in place (every
    chain, and a tree whose path stays on the first-popped nodes): then only the tail is cut.
    """
    n = len(accepted)
    moved = accepted != list(range(n))
    for layer in _kv_layers(cache):
        if getattr(layer, "keys", None) is None or not layer.keys.numel():
            continue
        if moved:
            src = torch.tensor(accepted, dtype=torch.long, device=layer.keys.device) + start
            layer.keys[..., start:start + n, :] = layer.keys.index_select(-2, src)
            layer.values[..., start:start + n, :] = layer.values.index_select(-2, src)
        layer.keys = layer.keys[..., :start + n, :]
        layer.values = layer.values[..., :start + n, :]
    return moved


@dataclass
class VerifyResult:
    accepted: list[int]         # node indices, root first
    tokens: list[int]           # tree tokens on the accepted path (root first)
    bonus: int                  # the target's choice after the path: next round's root
    post: list[int]             # the target's choice at every node
    cache: Any                  # the KV cache, compacted to the path (or cropped if not kept)
    hidden: torch.Tensor | None  # captured target features of the accepted nodes
    seconds: float = 0.0        # forward + walk, wall clock
    compacted: bool = False


def forward(model: Any, ids: torch.Tensor, positions: torch.Tensor, cache: Any,
            mask: torch.Tensor | None = None, hidden_layers: tuple[int, ...] = ()
            ) -> tuple[torch.Tensor, Any, torch.Tensor | None]:
    """One target forward: (fp32 logits [N, V], cache, concatenated features of `hidden_layers`)."""
    device = next(model.parameters()).device
    out = model(input_ids=ids.view(1, -1).to(device), position_ids=positions.view(1, -1).to(device),
                attention_mask=mask, use_cache=True, output_hidden_states=bool(hidden_layers),
                **{cache_kwarg(model): cache})
    hidden = torch.cat([out.hidden_states[i][0] for i in hidden_layers], dim=-1) if hidden_layers else None
    return out.logits[0].float(), output_cache(out), hidden


def output_cache(out: Any) -> Any:
    """The KV cache a forward returned, under either name (see `cache_kwarg`)."""
    return out["cache"] if "cache" in out.keys() else out.past_key_values


def cache_kwarg(model: Any) -> str:
    """transformers 5.2x renamed `past_key_values` to `cache`; the GPU host runs an older 5.x."""
    name = getattr(type(model), "_ddtree_cache_kwarg", None)
    if name is None:
        params = inspect.signature(type(model).forward).parameters
        name = "cache" if "cache" in params else "past_key_values"
        type(model)._ddtree_cache_kwarg = name
    return name


def verify(model: Any, cache: Any, tree: Tree, start: int, params: SamplingParams,
           sampler: Sampler | None = None, keep: bool = True,
           hidden_layers: tuple[int, ...] = ()) -> VerifyResult:
    """Forward over root + nodes, walk, then compact the KV to the accepted path (`keep`) or drop
    the whole block (a shadow measurement)."""
    if kv_length(cache) != start:
        raise ValueError(f"KV cache holds {kv_length(cache)} tokens, expected {start}")
    t0 = time.perf_counter()
    device = next(model.parameters()).device
    mask = None if tree.is_chain() else tree_mask(tree.visibility().to(device), start, model.dtype)
    positions = tree.positions(start)
    logits, cache, hidden = forward(model, tree.tokens, positions, cache, mask, hidden_layers)
    post = target_choices(logits, params, positions.to(logits.device), sampler).tolist()
    accepted, bonus = walk(tree.children(), post)
    seconds = time.perf_counter() - t0
    if keep:
        moved = compact_kv(cache, start, accepted)
    else:
        crop_kv(cache, start)
        moved = False
    if hidden is not None:
        hidden = hidden[torch.tensor(accepted, device=hidden.device)]
    tokens = tree.tokens.tolist()
    return VerifyResult(accepted=accepted, tokens=[tokens[i] for i in accepted], bonus=int(bonus),
                        post=post, cache=cache, hidden=hidden, seconds=seconds, compacted=moved)


def top_gap(logits: torch.Tensor) -> float:
    """Top-1 minus top-2 logit: how close a greedy choice was to flipping."""
    two = torch.topk(logits.float(), 2).values
    return float(two[0] - two[1])
