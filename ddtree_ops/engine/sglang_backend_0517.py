"""The tree verify backend for SGLang 0.5.17 (issue 33): DDTree's tree verified inside SGLang's own round.

Declared in the plugin wheel's entry points (group `ddtree_ops.tree_verify`, name `0.5.17`), so the
tree worker (`sglang_tree.TreeWorkerMixin`) finds it on a host whose SGLang is 0.5.17. A tree round is
DFlash's round (`DFlashWorkerV2.forward_batch_generation` in 0.5.17) with the verify and the commit
changed, each step on SGLang's own machinery:

1. the draft: DFlash's draft block, forward and head, as 0.5.17 runs them (its buffers, its draft
   graph; the plugin's top-K is folded into that graph or taken on the eager head, `sglang_topk`);
2. the tree: each row's tree is built from that top-K by the worker (`build`, the shadow's own build,
   the spine inside) and laid out in node order (a parent before its children);
3. the verify: one TARGET_VERIFY forward of the target over every row's nodes, as DFlash's chain verify
   (`DFlashVerifyInput.prepare_for_verify`, `target_worker.forward_batch_generation(is_verify=True)`),
   with the nodes' positions (the root's + depth) and an ancestor-only custom mask in the layout
   0.5.17's attention backend reads in TARGET_VERIFY (per row, nodes x (prefix + nodes), row-major);
   the nodes' KV goes to the row's own reserved slots after the committed prefix;
4. the walk: the target's greedy choice at every node (argmax of its logits after DFlash's verify
   logit adjustments), followed down the tree (`sglang_backend.walk`): the accepted path and the bonus;
5. the commit: the accepted path's slots are moved to the front of the row's reserved range in
   `req_to_token` (a permutation of the slots the row owns: the KV computed at position prefix + depth
   is now at index prefix + depth, nothing is copied and no slot changes hands), then DFlash's own
   draft-KV append for the committed tokens, and a result in DFlash's shape (tokens, commit lengths,
   next draft input, new sequence lengths published to the overlap scheduler).

Choices, and why (docs/engine.md, "Tree serving"):
- Page size 1 only: the commit permutes slots, which a page of several tokens does not allow; a larger
  page size is refused at start (the worker says so and does not start).
- The attention backend must be `triton`: 0.5.17's triton backend reads the extend tokens' K/V from the
  forward itself and the custom mask in the layout above, for any number of tokens a row; the others
  are refused at start by name (not checked here).
- No CUDA graph for the tree verify: 0.5.17 captures the target's TARGET_VERIFY graphs at DFlash's
  block width with a causal mask and replays them only for that width (`can_run_graph` compares
  `num_tokens_per_req`), so a tree of another size runs eager. A second set of graphs at the tree's size
  with a mask buffer is not built (start-up time and memory on every server); the draft keeps its graph.
- The tree needs `prefix + nodes` reserved slots a row, where DFlash reserves its block twice over
  (`DFlashDraftInputV2.prepare_for_decode`); a row short of them gets the rest from SGLang's own
  allocator (`alloc_for_spec_decode`, which records them on the request so they are freed with it).
  Where that fails (no memory, the row's end of context) the round is DFlash's own.
- Greedy batches only: a batch with a sampled request, a grammar or logprobs is served by DFlash's own
  round (its target-only sampling verify), so temperature is served as DFlash serves it, never wrong.
- The walk and the tree build run on the host, so a tree round synchronises with the GPU twice (the
  draft's top-K, the target's choices): the overlap scheduler's overlap is lost on tree rounds.

`chain_round` and `probe` time the target's verify forward with CUDA events. A probe (shadow mode)
writes its KV to SGLang's dummy slot 0, never to a request's slots.

Imports of SGLang and torch are inside the methods: the module is loaded by the entry point where
SGLang's GPU stack exists, and its pure parts (the layout, the mask, the commit order) are tested on CPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ddtree_ops.engine.sglang_backend import RowTree, TreeRound, walk

logger = logging.getLogger("ddtree_ops.engine.sglang")

RELEASE = "0.5.17"
ATTENTION = "triton"
SHADOW_TIMED_EVERY = 8        # shadow mode: one chain round in this many has its verify timed (a sync)
FALLBACK = ("DDTREE tree: %s: this round is DFlash's own (said once; counted as dflash_rounds on the next "
            "report)")


# ------------------------------------------------------------------ pure: the layout, the mask, the commit


@dataclass
class Layout:
    """Every row's tree as the verify forward takes it: `n` nodes a row (smaller trees padded)."""

    n: int
    tokens: list[list[int]]
    depths: list[list[int]]
    parents: list[list[int]]
    sizes: list[int]


def layout(trees: list[RowTree]) -> Layout:
    """The rows' nodes in node order, padded to the largest tree with nodes that hang off the root (their
    token is never a child in `RowTree.children`, so no walk reaches one). Node order must put a parent
    before its children: the attention kernel's causal tiling skips columns past a row's own block."""
    n = max(t.size for t in trees)
    tokens, depths, parents = [], [], []
    for t in trees:
        for node in range(1, t.size):
            if not 0 <= t.parents[node] < node:
                raise ValueError(f"tree node {node} has parent {t.parents[node]}: the verify needs parents first")
        pad = n - t.size
        tokens.append(list(t.tokens) + [0] * pad)
        depths.append(list(t.depths) + [1] * pad)
        parents.append(list(t.parents) + [0] * pad)
    return Layout(n, tokens, depths, parents, [t.size for t in trees])


def tree_mask(parents: list[list[int]]) -> Any:
    """[rows, n, n] bool: node i may attend to node j when j is i or an ancestor of i. Built on the host
    in as many tensor steps as the deepest node's depth (row i takes in its parent's row, whose ancestors
    are complete one step earlier), not one Python step per (node, ancestor) pair."""
    import torch

    rows, n = len(parents), len(parents[0])
    par = torch.tensor(parents, dtype=torch.int64).clamp_(min=0)          # the root is its own parent
    mask = torch.eye(n, dtype=torch.bool).expand(rows, n, n).clone()
    row = torch.arange(rows)[:, None]
    while True:
        grown = mask | mask[row, par]
        if torch.equal(grown, mask):
            return mask
        mask = grown


def verify_mask(tree: Any, prefix: list[int]) -> Any:
    """The flat custom mask 0.5.17's triton backend reads in TARGET_VERIFY: per row b, n rows of
    (prefix[b] + n) columns, the prefix's columns allowed, then `tree[b]`; rows one after another
    (its mask_indptr is the running sum of n * (prefix[b] + n))."""
    import torch

    n = int(tree.shape[1])
    ones = torch.ones(n, max(prefix, default=0), dtype=torch.bool, device=tree.device)
    return torch.cat([torch.cat([ones[:, :p], tree[b]], dim=1).reshape(-1) for b, p in enumerate(prefix)])


def commit_order(path: list[int], n: int) -> list[int]:
    """Which node's slot goes to each of the row's n reserved indices after the commit: the accepted
    path first (index prefix + d holds the node at depth d), then the others in node order."""
    on = set(path)
    return list(path) + [i for i in range(n) if i not in on]


def emitted(tree: RowTree, path: list[int], bonus: int, width: int) -> list[int]:
    """The round's output tokens in DFlash's shape: the accepted drafts, the bonus, zeros to `width`."""
    out = [tree.tokens[node] for node in path[1:]] + [bonus]
    if len(out) > width:
        raise ValueError(f"a path of {len(path)} nodes does not fit DFlash's block of {width}")
    return out + [0] * (width - len(out))


def refusals(*, page_size: int, attention: str | None, draft_window: Any, mamba: bool, tp_size: int) -> list[str]:
    """What this backend cannot serve, each said at start by name."""
    out = []
    if int(page_size or 1) != 1:
        out.append(f"--page-size {page_size}: the sglang {RELEASE} tree verify backend commits the accepted path "
                   "by moving slots, which needs page size 1")
    if attention and attention != ATTENTION:
        out.append(f"--attention-backend {attention}: the sglang {RELEASE} tree verify backend needs "
                   f"{ATTENTION} (its TARGET_VERIFY reads a custom mask for any tree size)")
    if draft_window is not None:
        out.append("--speculative-draft-window-size: the tree verify backend does not rebuild DFlash's compact "
                   "draft cache")
    if mamba:
        out.append("a target with mamba layers: the tree verify backend does not commit their state")
    if int(tp_size or 1) > 1:
        out.append(f"--tp-size {tp_size}: the tree verify backend runs on one GPU")
    return out


# ------------------------------------------------------------------ SGLang 0.5.17


class Backend:
    """SGLang 0.5.17's tree verify (see the module docstring)."""

    name = f"sglang {RELEASE} TARGET_VERIFY with an ancestor mask (triton, eager, page size 1)"

    def __init__(self) -> None:
        self.warned: set[str] = set()
        self.chain_calls = 0
        self.timer: Any = None
        self.fallbacks = 0

    # ---- what the worker asks at start
    def problems(self, worker: Any) -> list[str]:
        args = getattr(worker, "server_args", None)
        return refusals(page_size=getattr(args, "page_size", 1) or 1,
                        attention=_target_attention(args),
                        draft_window=getattr(args, "speculative_draft_window_size", None),
                        mamba=bool(getattr(worker, "_need_mamba_verify_commit", False)),
                        tp_size=getattr(args, "tp_size", 1) or 1)

    def once(self, key: str, message: str, *args: Any) -> None:
        if key not in self.warned:
            self.warned.add(key)
            logger.warning(message, *args)

    # ---- DFlash's own round
    def dflash_round(self, worker: Any, batch: Any, forward_kwargs: dict[str, Any], why: str) -> TreeRound:
        from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

        self.fallbacks += 1
        self.once(why.split(":")[0], FALLBACK, why)
        result = DFlashWorkerV2.forward_batch_generation(worker, batch, **forward_kwargs)
        return TreeRound(result, [], [], [], None)

    # ---- the tree round
    def tree_round(self, worker: Any, batch: Any, build: Any, **forward_kwargs: Any) -> TreeRound:
        import torch

        why = _not_greedy(batch)
        if why:
            return self.dflash_round(worker, batch, forward_kwargs, why)
        bs = len(batch.seq_lens)
        block = int(worker.block_size)
        width = block - 1
        both = torch.stack([batch.seq_lens.to(torch.int64), batch.spec_info.bonus_tokens.view(-1).to(torch.int64)])
        prefix, roots = both.tolist()                                           # one wait, not two
        self.draft(worker, batch, bs)
        tok, sc = worker.ddtree_round_topk(bs * width)
        trees = [build(tok[b * width:(b + 1) * width], sc[b * width:(b + 1) * width], roots[b]) for b in range(bs)]
        lay = layout(trees)
        why = self.reserve(worker, batch, prefix, lay.n)
        if why:
            return self.dflash_round(worker, batch, forward_kwargs, why)

        device = batch.seq_lens.device
        req_to_token = worker.model_runner.req_to_token_pool.req_to_token
        rpi = batch.req_pool_indices.to(torch.int64)
        prefix_t = torch.tensor(prefix, dtype=torch.int64, device=device)
        offs = torch.arange(lay.n, dtype=torch.int64, device=device)
        cols = prefix_t[:, None] + offs[None, :]
        loc = req_to_token[rpi[:, None], cols].to(torch.int64)                       # [bs, n]
        tokens = torch.tensor(lay.tokens, dtype=torch.int64, device=device)
        positions = (prefix_t[:, None] + torch.tensor(lay.depths, dtype=torch.int64, device=device)).reshape(-1)
        mask = verify_mask(tree_mask(lay.parents), prefix).to(device, non_blocking=True)   # built on the host

        start, end = _events()
        chains = all(par[i] == i - 1 for par, size in zip(lay.parents, lay.sizes) for i in range(1, size)) \
            and all(size == lay.n for size in lay.sizes)
        logits_output = self.verify(worker, batch, tokens.reshape(-1), positions, loc.reshape(-1), lay.n, mask,
                                    [p + lay.n for p in prefix], start, end, causal_ok=chains)
        logits = logits_output.next_token_logits
        sampling_info = batch.sampling_info
        if sampling_info is not None:
            from sglang.srt.speculative.dflash_utils import apply_dflash_verify_logits_adjustments

            apply_dflash_verify_logits_adjustments(next_token_logits=logits, sampling_info=sampling_info,
                                                   draft_token_num=lay.n)
        predict = torch.argmax(logits, dim=-1).view(bs, lay.n).tolist()             # waits for the verify
        seconds = start.elapsed_time(end) / 1000.0

        paths, bonus, out, order = [], [], [], []
        for b, tree in enumerate(trees):
            path, bon = walk(tree, predict[b][:tree.size])
            paths.append(path)
            bonus.append(bon)
            out.append(emitted(tree, path, bon, block))
            order.append(commit_order(path, lay.n))
        # the commit: the path's slots to the front of the row's reserved range (a permutation)
        perm = torch.tensor(order, dtype=torch.int64, device=device)
        req_to_token[rpi[:, None], cols] = loc.gather(1, perm).to(req_to_token.dtype)
        commit = torch.tensor([len(p) for p in paths], dtype=torch.int32, device=device)
        new_seq_lens = batch.seq_lens + commit.to(batch.seq_lens.dtype)
        on_publish = forward_kwargs.get("on_publish")
        if on_publish is not None:
            on_publish(new_seq_lens)
        self.draft_kv(worker, logits_output.hidden_states, lay.n, paths, rpi, prefix_t, block, commit)
        logits_output.hidden_states = None
        bonus_t = torch.tensor(bonus, dtype=torch.int64, device=device)
        result = _result(worker, logits_output, torch.tensor(out, dtype=torch.int64, device=device).reshape(-1),
                         commit, bonus_t, new_seq_lens, block)
        return TreeRound(result, trees, paths, [predict[b][:t.size] for b, t in enumerate(trees)], seconds)

    def draft(self, worker: Any, batch: Any, bs: int) -> Any:
        """DFlash's draft block, forward and head, as 0.5.17's forward_batch_generation runs them (the
        non-compact draft cache; the eager block preparation); the draft forward's output."""
        import torch
        from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
        from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        draft_input = batch.spec_info
        if not isinstance(draft_input, DFlashDraftInputV2):
            raise RuntimeError("DDTREE tree: expected DFlash's draft input on the running batch")
        batch.seq_lens.record_stream(torch.get_device_module(worker.device).current_stream())
        target_model = worker.target_worker.model_runner.model
        embed_module = target_model.get_input_embeddings()
        lm_head = target_model.lm_head
        block = int(worker.block_size)
        worker._ensure_draft_block_buffers(bs)
        block_ids = worker._draft_block_ids_buf[:bs]
        positions_2d = worker._draft_block_positions_buf[:bs]
        loc_2d = worker._draft_verify_out_cache_loc_buf[:bs]
        prefix_lens = batch.seq_lens
        block_ids.fill_(int(worker._mask_token_id))
        block_ids[:, 0].copy_(draft_input.bonus_tokens)
        torch.add(prefix_lens.unsqueeze(1), worker._block_pos_offsets, out=positions_2d)
        loc = assign_extend_cache_locs_func(
            req_pool_indices=batch.req_pool_indices, req_to_token=worker.model_runner.req_to_token_pool.req_to_token,
            start_offset=prefix_lens, end_offset=prefix_lens + block, batch_size=bs, draft_token_num=block,
            device=worker.device)
        loc_2d.copy_(loc.view(bs, block))
        input_embeds = embed_module(block_ids).view(bs * block, -1)
        seq_lens_cpu = worker._draft_seq_lens_cpu_buf[:bs]
        if batch.seq_lens_cpu is not None:
            seq_lens_cpu.copy_(batch.seq_lens_cpu)
            seq_lens_cpu.add_(block)
            seq_lens_sum = int(seq_lens_cpu.sum())
        elif draft_input.reserved_seq_lens_cpu is not None:
            seq_lens_cpu.copy_(draft_input.reserved_seq_lens_cpu)
            seq_lens_sum = int(draft_input.reserved_seq_lens_sum)
        else:
            seq_lens_cpu.copy_(prefix_lens.to("cpu", dtype=torch.int32))
            seq_lens_sum = int(prefix_lens.sum().item())
        forward_batch = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY, batch_size=bs, input_ids=block_ids.flatten(),
            req_pool_indices=batch.req_pool_indices, seq_lens=prefix_lens, out_cache_loc=loc_2d.reshape(-1),
            seq_lens_sum=seq_lens_sum, seq_lens_cpu=seq_lens_cpu, positions=positions_2d.reshape(-1),
            input_embeds=input_embeds, spec_algorithm=SpeculativeAlgorithm.DFLASH,
            spec_info=worker._draft_block_spec_info, capture_hidden_mode=CaptureHiddenMode.NULL)
        with torch.inference_mode():
            draft_out = worker.draft_model_runner.forward(forward_batch)
        if not (worker._draft_sampler is not None and draft_out.can_run_graph):
            hidden = draft_out.logits_output.hidden_states
            if hidden is None:
                raise RuntimeError("DDTREE tree: the DFlash draft model returned no hidden states")
            hidden = hidden.view(bs, block, -1)
            # the plugin's head hook takes the top-K here (the mixin's _greedy_sample_from_vocab_parallel_head)
            worker._greedy_sample_from_vocab_parallel_head(hidden_states=hidden[:, 1:, :].reshape(-1, hidden.shape[-1]),
                                                           lm_head=lm_head)
        return draft_out

    def reserve(self, worker: Any, batch: Any, prefix: list[int], n: int) -> str:
        """Each row's slots prefix .. prefix + n - 1 reserved for it; '' when they are, else why not."""
        import torch
        from sglang.srt.mem_cache.allocation import alloc_for_spec_decode

        req_to_token = worker.model_runner.req_to_token_pool.req_to_token
        if max(p + n for p in prefix) > int(req_to_token.shape[1]):
            return "a row's tree reaches past its context's slots"
        short = [(i, int(r.kv.kv_allocated_len), p + n) for i, (r, p) in enumerate(zip(batch.reqs, prefix))
                 if p + n > int(r.kv.kv_allocated_len)]
        if not short:
            return ""
        idx = [i for i, _, _ in short]
        device = batch.seq_lens.device
        cur_cpu = torch.tensor([c for _, c, _ in short], dtype=torch.int32)
        nxt_cpu = torch.tensor([x for _, _, x in short], dtype=torch.int32)
        try:
            alloc_for_spec_decode(batch.tree_cache, batch.req_to_token_pool, reqs=[batch.reqs[i] for i in idx],
                                  req_pool_indices=batch.req_pool_indices[torch.tensor(idx, device=device)],
                                  cur_kv_lens=cur_cpu.to(device), cur_kv_lens_cpu=cur_cpu,
                                  nxt_kv_lens=nxt_cpu.to(device), nxt_kv_lens_cpu=nxt_cpu,
                                  num_needed_tokens=int((nxt_cpu - cur_cpu).sum()), batch=batch)
        except RuntimeError as exc:              # out of KV memory: this round is DFlash's, which needs less
            return f"no KV slots for the tree ({str(exc).splitlines()[0]})"
        return ""

    def verify(self, worker: Any, batch: Any, tokens: Any, positions: Any, out_cache_loc: Any, n: int, mask: Any,
               host_seq_lens: list[int], start: Any, end: Any, causal_ok: bool = False) -> Any:
        """One TARGET_VERIFY forward of the target over n tokens a row (DFlash's verify path). Eager unless n
        is DFlash's block width, where 0.5.17 replays its captured graph: allowed only for a causal mask
        (`causal_ok`: every row a whole chain), which is what that graph computes."""
        import torch
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
        from sglang.srt.speculative.dflash_info import DFlashVerifyInput

        verify_input = DFlashVerifyInput(draft_token=tokens, positions=positions, draft_token_num=n,
                                         custom_mask=mask, capture_hidden_mode=CaptureHiddenMode.FULL)
        saved = {k: getattr(batch, k) for k in ("out_cache_loc", "seq_lens_cpu", "seq_lens_sum")}
        batch.out_cache_loc = out_cache_loc
        batch.seq_lens_cpu = torch.tensor(host_seq_lens, dtype=torch.int64)
        batch.seq_lens_sum = int(sum(host_seq_lens))
        try:
            forward_batch, graph = verify_input.prepare_for_verify(batch, worker.target_worker)
        finally:
            batch.seq_lens_cpu, batch.seq_lens_sum = saved["seq_lens_cpu"], saved["seq_lens_sum"]
        if graph and not causal_ok:     # a graph captured for DFlash's causal block ignores the tree's mask
            raise RuntimeError(f"DDTREE tree: a verify of {n} nodes a row matched a captured graph's width")
        start.record()
        out = worker.target_worker.forward_batch_generation(batch=None, forward_batch=forward_batch, is_verify=True,
                                                            skip_attn_backend_init=True)
        end.record()
        return out.logits_output

    def draft_kv(self, worker: Any, hidden: Any, n: int, paths: list[list[int]], rpi: Any, prefix_t: Any,
                 block: int, commit: Any) -> None:
        """DFlash's own append of the committed tokens' target features to the draft's KV, at the
        committed indices (after the commit's permutation)."""
        import torch

        if hidden is None:
            raise RuntimeError("DDTREE tree: the verify returned no target hidden states for the draft")
        bs = len(paths)
        hidden = hidden.view(bs, n, -1)
        pick = torch.tensor([p + [0] * (block - len(p)) for p in paths], dtype=torch.int64, device=hidden.device)
        rows = torch.gather(hidden, 1, pick[:, :, None].expand(bs, block, hidden.shape[-1]))
        offs = torch.arange(block, dtype=torch.int64, device=hidden.device)
        cols = prefix_t[:, None] + offs[None, :]
        loc_2d = worker.model_runner.req_to_token_pool.req_to_token[rpi[:, None], cols].to(torch.int64)
        worker._append_target_hidden_to_draft_kv_by_loc(target_hidden=rows.reshape(bs * block, -1),
                                                        cache_loc=loc_2d.reshape(-1), cache_loc_2d=loc_2d,
                                                        positions=cols.reshape(-1), commit_lens=commit)

    # ---- chain rounds and probes, timed
    def chain_round(self, worker: Any, batch: Any, forward: Any) -> tuple[Any, float | None]:
        self.chain_calls += 1
        timer = self.verify_timer(worker)
        tree_mode = "_ddtree_tree_state" in vars(worker)
        timer.armed = tree_mode or self.chain_calls % SHADOW_TIMED_EVERY == 1
        try:
            result = forward()
        finally:
            armed, timer.armed = timer.armed, False
        if not armed or timer.last is None:
            return result, None
        start, end = timer.last
        timer.last = None
        end.synchronize()
        return result, start.elapsed_time(end) / 1000.0

    def verify_timer(self, worker: Any) -> Any:
        """CUDA events around the target's verify forward inside DFlash's own round (set once on the
        target worker: only its `is_verify=True` calls are timed, only while armed)."""
        if self.timer is None:
            self.timer = _VerifyTimer(worker.target_worker)
        return self.timer

    def probe(self, worker: Any, batch: Any, nodes: int) -> float | None:
        """A TARGET_VERIFY forward of `nodes` tokens a row over this batch under a custom mask (a chain's:
        the kernel and its work are a tree's), KV written to the dummy slot 0, the result discarded."""
        import torch

        if batch.seq_lens is None or len(batch.seq_lens) == 0:
            return None
        bs = len(batch.seq_lens)
        device = batch.seq_lens.device
        prefix = [int(x) for x in batch.seq_lens.tolist()]
        offs = torch.arange(nodes, dtype=torch.int64, device=device)
        positions = (batch.seq_lens.to(torch.int64)[:, None] + offs[None, :]).reshape(-1)
        chain = torch.tril(torch.ones(nodes, nodes, dtype=torch.bool, device=device)).expand(bs, nodes, nodes)
        mask = verify_mask(chain, prefix)
        keep = {k: getattr(batch, k) for k in ("out_cache_loc", "input_ids", "spec_info", "forward_mode")}
        start, end = _events()
        try:
            self.verify(worker, batch, torch.zeros(bs * nodes, dtype=torch.int64, device=device), positions,
                        torch.zeros(bs * nodes, dtype=torch.int64, device=device), nodes, mask,
                        [p + nodes for p in prefix], start, end, causal_ok=True)
            end.synchronize()
        finally:
            for k, v in keep.items():
                setattr(batch, k, v)
        return start.elapsed_time(end) / 1000.0


class _VerifyTimer:
    def __init__(self, target_worker: Any) -> None:
        self.armed = False
        self.last: Any = None
        inner = target_worker.forward_batch_generation

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not (self.armed and kwargs.get("is_verify")):
                return inner(*args, **kwargs)
            start, end = _events()
            start.record()
            out = inner(*args, **kwargs)
            end.record()
            self.last = (start, end)
            return out

        target_worker.forward_batch_generation = timed


def _events() -> tuple[Any, Any]:
    import torch

    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def _target_attention(args: Any) -> str | None:
    if args is None:
        return None
    return getattr(args, "decode_attention_backend", None) or getattr(args, "attention_backend", None)


def _not_greedy(batch: Any) -> str:
    """Why this batch is not a greedy tree round ('' when it is)."""
    if getattr(batch, "return_logprob", False):
        return "logprobs requested: DFlash refuses them"
    if getattr(batch, "has_grammar", False):
        return "a request with a grammar: served by DFlash's chain, whose grammar tree is linear"
    info = getattr(batch, "sampling_info", None)
    if info is not None and not info.is_all_greedy:
        return ("a sampled request in the batch: served by DFlash's own round (its target-only sampling verify); "
                "the tree serves greedy batches")
    return ""


def _result(worker: Any, logits_output: Any, next_token_ids: Any, commit: Any, bonus: Any, new_seq_lens: Any,
            block: int) -> Any:
    from sglang.srt.managers.scheduler import GenerationBatchResult

    next_draft_input = worker._make_next_draft_input_decode(bonus_tokens=bonus, new_seq_lens=new_seq_lens)
    return GenerationBatchResult(logits_output=logits_output, next_token_ids=next_token_ids, accept_lens=commit,
                                 can_run_cuda_graph=False, next_draft_input=next_draft_input,
                                 speculative_num_draft_tokens=block, new_seq_lens=new_seq_lens)
