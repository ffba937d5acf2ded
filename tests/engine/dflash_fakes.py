"""Stand-ins for SGLang's DFlash V2 worker in the plugin's CPU tests, and each supported release's
real source (its `dflash_worker_v2.py` cannot be imported without the GPU stack, so it is read).

`FakeDFlash` has the shape both releases share where the mixin hooks in: `init_cuda_graphs`
builds the draft sampler before the capture; a verify round runs the draft (a graph replay calls
the captured sampler, as SGLang's capture tail hook did at capture; without a graph, the eager
head), keeps the verified block in `_draft_block_tokens_buf`, and returns the committed lengths
and the bonus. Its sampler is the release's own `_DflashDraftSampler`, built from that release's
source (`real_sampler_class`).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import pathlib
import types
import zipfile
from functools import lru_cache
from typing import Any

import pytest
import torch

from ddtree_ops.lab.standin.shadow import ForwardMode  # the stand-in of SGLang's ForwardMode, as the plugin asks it

VERSIONS = ("0.5.17", "0.5.23")


@lru_cache(maxsize=None)
def dflash_worker_source(version: str) -> str | None:
    if version == "0.5.23":
        spec = importlib.util.find_spec("sglang")
        if spec is None or spec.origin is None:
            return None
        return (pathlib.Path(spec.origin).parent / "srt" / "speculative" / "dflash_worker_v2.py").read_text()
    return sglang_file(version, "sglang/srt/speculative/dflash_worker_v2.py")


@lru_cache(maxsize=None)
def sglang_file(version: str, relpath: str) -> str | None:
    """A file of an SGLang release: the installed one (0.5.23) or the reference wheel's."""
    if version == "0.5.23":
        spec = importlib.util.find_spec("sglang")
        if spec is None or spec.origin is None:
            return None
        return (pathlib.Path(spec.origin).parent.parent / relpath).read_text()
    from ddtree_ops.engine.sglang_settings import reference_wheel

    wheel = reference_wheel(version)
    if wheel is None:
        return None
    with zipfile.ZipFile(wheel) as z:
        return z.read(relpath).decode()


def class_node(src: str, name: str) -> ast.ClassDef:
    return next(n for n in ast.parse(src).body if isinstance(n, ast.ClassDef) and n.name == name)


@lru_cache(maxsize=None)
def real_sampler_class(version: str) -> type:
    """The release's `_DflashDraftSampler`, executed from its source (it needs only torch)."""
    src = dflash_worker_source(version)
    assert src is not None, f"no DFlash worker source for sglang {version}"
    node = class_node(src, "_DflashDraftSampler")
    scope: dict[str, Any] = {"torch": torch}
    exec(compile(ast.Module(body=[node], type_ignores=[]), f"<sglang {version} dflash_worker_v2>", "exec"), scope)
    return scope["_DflashDraftSampler"]


class FakeBatch:
    def __init__(self, mode: str, reqs: list[Any] | None = None, seq_lens: list[int] | None = None) -> None:
        self.forward_mode, self.is_extend_in_batch = ForwardMode(mode), False
        self.reqs = reqs
        self.seq_lens = torch.tensor(seq_lens, dtype=torch.int64) if seq_lens is not None else None


class FakeDFlash:
    """Hooked methods of DFlashWorkerV2, in the shape both checked releases share."""

    block_size = 4
    hidden = 8
    vocab = 20

    def __init__(self, accept: list[int], bonus: list[int], version: str = "0.5.17", graphs: bool = True,
                 fold: bool = True, max_bs: int = 8) -> None:
        self.accept, self.bonus, self.version, self.fold, self.max_bs = accept, bonus, version, fold, max_bs
        self.head = self.make_head()
        if "model_runner" not in self.__dict__:
            self.model_runner = types.SimpleNamespace(model_config=types.SimpleNamespace(vocab_size=self.vocab))
        self._draft_sampler: Any = None
        self.graph_rounds = self.eager_rounds = 0
        self.hidden_gen = torch.Generator().manual_seed(11)
        if graphs:
            self.init_cuda_graphs()

    # ---- DFlashWorkerV2.init_cuda_graphs: the sampler is built before the draft graph capture,
    # and SGLang's capture tail hook calls it during warm-up and capture
    def init_cuda_graphs(self) -> None:
        self._draft_sampler = self._maybe_build_draft_sampler()
        if self._draft_sampler is not None:
            for bs in range(self.max_bs, 0, -1):             # warm-ups of every captured size
                self._draft_sampler(torch.zeros(bs * self.block_size, self.hidden), None)

    def make_head(self) -> Any:
        return types.SimpleNamespace(weight=torch.randn(self.vocab, self.hidden, generator=torch.Generator().manual_seed(5)))

    def _maybe_build_draft_sampler(self) -> Any:
        if not self.fold:
            return None                                      # DFlash's `_eager(reason)`
        return real_sampler_class(self.version)(weight=self.head.weight, block_size=self.block_size,
                                                num_org=self.vocab, org_vocab_start=0, max_bs=self.max_bs)

    def _greedy_sample_from_vocab_parallel_head(self, *, hidden_states: Any, lm_head: Any, chunk_size: int = 256) -> Any:
        self.eager_rounds += 1
        return torch.argmax(hidden_states @ lm_head.weight.T, dim=-1)

    def head_draft(self, hidden: Any) -> Any:
        """DFlash's draft tokens [bs, L] from the draft's hidden states [bs, block, H]: the graph replays
        the captured sampler (a batch the graphs cover), else the eager head runs."""
        bs, L = hidden.shape[0], self.block_size - 1
        flat = hidden.reshape(bs * self.block_size, -1)
        if self._draft_sampler is not None and bs <= self.max_bs:
            self._draft_sampler(flat, None)
            return self._draft_sampler.out[:bs * L].view(bs, L)
        h = hidden[:, 1:, :].reshape(-1, hidden.shape[-1])
        return self._greedy_sample_from_vocab_parallel_head(hidden_states=h, lm_head=self.head).view(bs, -1)

    def draft_hidden(self, bs: int) -> Any:
        return torch.randn(bs * self.block_size, self.hidden, generator=self.hidden_gen)

    def forward_batch_generation(self, batch: Any, on_publish: Any = None) -> Any:
        if batch.forward_mode.is_extend():
            return types.SimpleNamespace(accept_lens=None, next_draft_input=None)
        batch.forward_mode = ForwardMode("target_verify")   # real 0.5.17 hands the batch back so (its log)
        bs, width = len(self.accept), self.block_size
        hidden = self.draft_hidden(bs)
        if self._draft_sampler is not None and bs <= self.max_bs:    # draft_out.can_run_graph
            self._draft_sampler(hidden, None)        # the replay runs what the capture recorded
            draft = self._draft_sampler.out[:bs * (width - 1)].view(bs, width - 1)
            self.graph_rounds += 1
        else:
            h = hidden.view(bs, width, -1)[:, 1:, :].reshape(-1, self.hidden)
            draft = self._greedy_sample_from_vocab_parallel_head(hidden_states=h, lm_head=self.head).view(bs, -1)
        self.last_draft = draft.clone()
        self._draft_block_tokens_buf = torch.cat([torch.full((bs, 1), 1), draft], dim=1)
        commit = torch.tensor(self.accept, dtype=torch.int32) + 1
        return types.SimpleNamespace(accept_lens=commit,
                                     next_draft_input=types.SimpleNamespace(bonus_tokens=torch.tensor(self.bonus)))


# ------------------------------------------------------------------ greedy serving with a known target


class FakeRequest:
    """SGLang's Req as the shadow reads it: prompt, committed outputs, sampling params."""

    def __init__(self, prompt: list[int], greedy: bool = True, max_new: int = 10**9) -> None:
        self.origin_input_ids = list(prompt)
        self.output_ids: list[int] = []
        self.sampling_params = types.SimpleNamespace(top_k=1 if greedy else -1, temperature=1.0 if greedy else 0.7)
        self.max_new = max_new

    def finished(self) -> bool:
        return len(self.output_ids) >= self.max_new


def target_next(context: tuple[int, ...], vocab: int) -> int:
    """A deterministic 'target model': its greedy choice after a context."""
    h = 2166136261
    for t in context[-3:]:
        h = ((h ^ (t + 1)) * 16777619) % (1 << 32)
    return h % vocab


def draft_logits(want: list[int], depth: int, vocab: int, rng: Any) -> Any:
    """A draft's logits [depth, vocab] that put the target's token (`want`) at rank 0 (60%), 1 (30%)
    or 2 (10%) at each position, at random."""
    logits = torch.randn(depth, vocab, generator=rng) * 0.3
    for d in range(depth):
        others = [t for t in torch.randperm(vocab, generator=rng).tolist() if t != want[d]][:2]
        where = int(torch.randint(0, 10, (1,), generator=rng))
        ranked = ([want[d]] + others if where < 6 else [others[0], want[d], others[1]] if where < 9
                  else others + [want[d]])
        for bonus_logit, t in zip((4.0, 3.5, 3.0), ranked):
            logits[d, t] += bonus_logit
    return logits


class GreedyDFlash(FakeDFlash):
    """DFlash verifying against `target_next` for real: the draft's per-position logits (the head is
    the identity, so a draft position's hidden state is its logits) put the target's token at
    rank 0, rank 1 or rank 2 at random; the chain commits drafts while rank 0 is the target's, then
    the target's token. Each round also records what the engine's tree verification would accept
    (`build_tree_heap` + `verify.walk` with the target's choice at every node): the ground truth."""

    block_size = 5
    hidden = vocab = 24

    def __init__(self, budget: int, seed: int = 0, **kw: Any) -> None:
        self.budget = budget
        self.rng = torch.Generator().manual_seed(seed)
        self.truth: list[tuple[int, int]] = []       # (chain tokens, tree tokens) of every row, every round
        self.seqs: dict[int, list[int]] = {}
        super().__init__(accept=[], bonus=[], **kw)

    def make_head(self) -> Any:
        return types.SimpleNamespace(weight=torch.eye(self.vocab))

    def forward_batch_generation(self, batch: Any, on_publish: Any = None) -> Any:
        from ddtree_ops.engine.tree import build_tree_heap, draft_topk
        from ddtree_ops.engine.verify import walk

        if batch.forward_mode.is_extend():
            for r in batch.reqs:                       # prefill: the first token
                seq = self.seqs[id(r)] = list(r.origin_input_ids)
                seq.append(target_next(tuple(seq), self.vocab))
            return types.SimpleNamespace(accept_lens=None, next_draft_input=None)
        batch.forward_mode = ForwardMode("target_verify")
        L, V = self.block_size - 1, self.vocab
        bs = len(batch.reqs)
        hidden = torch.zeros(bs, self.block_size, V)
        chains, commits, bonuses = [], [], []
        for b, r in enumerate(batch.reqs):
            seq = self.seqs[id(r)]
            ctx, want = list(seq), []
            for _ in range(L + 1):                     # the target's greedy continuation of seq
                want.append(target_next(tuple(ctx), V))
                ctx.append(want[-1])
            logits = draft_logits(want, L, V, self.rng)
            hidden[b, 1:] = logits
            chain = torch.argmax(logits, dim=-1).tolist()
            a = 0
            while a < L and chain[a] == want[a]:
                a += 1
            chains.append(chain)
            commits.append(a + 1)
            bonuses.append(want[a])
            # the ground truth: the engine's tree, verified by the target at every node
            tree = build_tree_heap(draft_topk(logits, min(self.budget, V)), self.budget, seq[-1])
            path_tokens = tree.tokens.tolist()
            parents = tree.parents.tolist()
            post = []
            for node in range(tree.size):
                path, n = [], node
                while n > 0:
                    path.append(path_tokens[n])
                    n = parents[n]
                post.append(target_next(tuple(seq + path[::-1]), V))
            accepted, _ = walk(tree.children(), post)
            self.truth.append((a + 1, len(accepted)))
            seq.extend(want[:a + 1])                   # what the scheduler will append to output_ids
        draft = self.head_draft(hidden)
        assert draft.tolist() == chains
        roots = [self.seqs[id(r)][-1 - c] for r, c in zip(batch.reqs, commits)]
        self._draft_block_tokens_buf = torch.cat([torch.tensor(roots).view(bs, 1), draft], dim=1)
        return types.SimpleNamespace(accept_lens=torch.tensor(commits, dtype=torch.int32),
                                     next_draft_input=types.SimpleNamespace(bonus_tokens=torch.tensor(bonuses)))

    def committed(self, req: FakeRequest) -> list[int]:
        """What the scheduler has for the request after the last round (outputs after the prompt)."""
        return self.seqs[id(req)][len(req.origin_input_ids):]


def shadow_env(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    """Exactly these DDTREE_* settings for the plugin under test (none from the caller's shell)."""
    for key in list(os.environ):
        if key.startswith("DDTREE_"):
            monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
