"""Host cost of the DDTREE shadow accounting per verify round, new path against the old, one run.

    python bench/shadow_accounting.py [--rounds 2000]

The SGLang worker hands each sampled round's draft top-K, verified block, accepted lengths and
bonus to `OnlineShadow.observe`. Before, that built a `Tree` of tensors per row
(`build_tree_heap`), walked it (`spine_lower_bound`) and appended a `RoundRecord` per row to a
ledger that was never trimmed; now it runs the same heap on lists (`heap_spine_bound`) into
constant-memory totals (`BoundTally`). Both are timed here on identical inputs, interleaved, with
the tree and the bound checked equal; memory is what the accounting keeps (tracemalloc over 2,000 rounds, scaled to 10,000).
The copies to the host are not part of either figure: the worker now starts them without waiting
and accounts a round once its event has completed, where the old path synchronised on `.cpu()`.

    python bench/shadow_accounting.py --serving [--json FILE]

times the whole host side of a sampled round as the SGLang worker now runs it on the scheduler's
thread (issue 22): the round's parts packed and copied in one go (`RoundTransfer`, CPU tensors
here), then `InlineAccountant.account` (one `tolist`, the heap tree per row, the bound, the tree
kept for the greedy walk) and `HorizonBook.resolve` (the walk, once the continuation is
committed), block 16 (L = 15) as the Qwen3-8B-shape runs use. What it costs at share 1.0 against
a verify round of the 8B shape (about 10 ms at batch 1) says whether the accounting has to leave
the scheduler's thread (DDTREE_SHADOW_ACCOUNT_THREAD).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from ddtree_ops.engine.shadow import (  # noqa: E402
    OnlineShadow,
    RoundRecord,
    ShadowLedger,
    spine_lower_bound,
)
from ddtree_ops.engine.tree import DraftTopK, build_tree_heap, topk_logprobs  # noqa: E402


class OldOnline:
    """The accounting as the plugin ran it before (per row: tensors, a Tree, a record)."""

    def __init__(self, budget: int, horizon: int) -> None:
        self.budget, self.ledger = budget, ShadowLedger(horizon)

    def observe(self, toks: Any, scores: Any, cands: Any, acc: Any, bonus: Any) -> list[int]:
        toks, scores = toks.cpu(), scores.cpu()
        rows, a_list, b_list = cands.tolist(), acc.tolist(), bonus.tolist()
        out = []
        for b, row in enumerate(rows):
            tree = build_tree_heap(DraftTopK(tokens=toks[b], scores=scores[b]), self.budget, row[0])
            lower = spine_lower_bound(tree, row, int(a_list[b]), int(b_list[b]))
            out.append(lower)
            a = int(a_list[b])
            self.ledger.add(RoundRecord(chain_tokens=a + 1, chain_verify_s=0.0, chain_nodes=len(row), tree_lower=lower,
                                        tree_nodes=tree.size, sibling_depths=[a + 1] if lower > a + 1 else []))
        return out


def inputs(bs: int, horizon: int, k: int, vocab: int, seed: int) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(seed)
    toks, scores = topk_logprobs(torch.randn(bs, horizon, vocab, generator=g), k)
    cands = torch.cat([torch.zeros(bs, 1, dtype=torch.long), toks[:, :, 0]], dim=1)   # DFlash's argmax chain
    acc = torch.randint(0, horizon + 1, (bs,), generator=g)
    bonus = toks[torch.arange(bs), torch.clamp(acc, max=horizon - 1), 1]             # often a sibling
    return toks, scores, cands, acc, bonus


def per_round_us(fn: Any, args: tuple[Any, ...], rounds: int) -> float:
    t = time.perf_counter()
    for _ in range(rounds):
        fn(*args)
    return (time.perf_counter() - t) / rounds * 1e6


def retained_bytes(make: Any, args: tuple[Any, ...], rounds: int) -> int:
    acct = make()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for _ in range(rounds):
        acct.observe(*args)
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return used


class _Req:
    """A greedy request whose committed continuation is already known (the walk decides at once)."""

    def __init__(self, tokens: list[int]) -> None:
        self.origin_input_ids, self.output_ids = [0], tokens
        self.sampling_params = type("P", (), {"top_k": 1, "temperature": 1.0})()

    def finished(self) -> bool:
        return False


def serving(rounds: int) -> list[dict[str, Any]]:
    from ddtree_ops.engine.sglang_account import InlineAccountant, RoundMeta
    from ddtree_ops.engine.sglang_transfer import RoundTransfer

    horizon, vocab, out = 15, 4096, []
    for bs in (1, 8):
        for budget in (16, 64):
            k = min(budget, vocab)
            toks, scores, cands, acc, bonus = inputs(bs, horizon, k, vocab, seed=bs * 7 + budget)
            commit = (acc + 1).to(torch.int32)
            # each row's continuation: its chain's accepted drafts and the bonus, then more chain
            reqs = [_Req([0] + cands[b, 1:int(acc[b]) + 1].tolist() + [int(bonus[b])] + cands[b, 1:].tolist())
                    for b in range(bs)]
            prefix = torch.ones(bs, dtype=torch.long)            # root: after the 1-token prompt, output 0
            cands[:, 0] = 0
            times = []
            for _ in range(5):
                acct = OnlineShadow(budget, horizon, report_every=10**9, cost_ratio=1.1, cost_source="bench")
                transfer = RoundTransfer()
                inline = InlineAccountant(acct, transfer, horizon, max_pending=10**6)
                t = time.perf_counter()
                for _ in range(rounds // 5):
                    meta = RoundMeta(bs, horizon + 1, k, reqs, [True] * bs, 0)
                    inline.submit(transfer.send([toks.view(bs * horizon, k), scores.view(bs * horizon, k), cands,
                                                 commit, bonus, prefix], meta))
                    inline.poll()
                times.append((time.perf_counter() - t) / (rounds // 5) * 1e6)
                assert acct.exact.n == inline.rows == rounds // 5 * bs, "every round decided"
            us = statistics.median(times)
            out.append({"batch": bs, "budget": budget, "us_per_sampled_round": round(us, 1),
                        "share_1_of_10ms_round_pct": round(us / 100.0, 2),
                        "share_025_of_10ms_round_pct": round(us / 400.0, 2)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1000)
    ap.add_argument("--json", type=Path, help="write the table here too")
    ap.add_argument("--serving", action="store_true", help="the serving path as the worker runs it now")
    args = ap.parse_args(argv)
    if args.serving:
        rows = serving(args.rounds)
        print(f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
              f"python {platform.python_version()}, torch {torch.__version__}")
        print("| batch | budget | host us per sampled round | % of a 10 ms round at share 1.0 | at share 0.25 |")
        print("|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['batch']} | {r['budget']} | {r['us_per_sampled_round']} | {r['share_1_of_10ms_round_pct']} | "
                  f"{r['share_025_of_10ms_round_pct']} |")
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        return 0
    horizon, vocab = 7, 1024                  # block 8, as the H200 runs use
    rows = []
    for bs in (1, 8):
        for budget in (7, 16, 64):
            k = min(budget, vocab)
            data = inputs(bs, horizon, k, vocab, seed=bs * 100 + budget)
            old, new = OldOnline(budget, horizon), OnlineShadow(budget, horizon, report_every=10**9)
            lists = tuple(t.tolist() for t in data)
            assert old.observe(*data) == new.observe(*lists), "the two paths disagree"
            old_t, new_t = [], []
            for _ in range(5):                 # interleaved, so drift on a shared machine hits both
                old_t.append(per_round_us(OldOnline(budget, horizon).observe, data, args.rounds // 5))
                new_t.append(per_round_us(OnlineShadow(budget, horizon, report_every=10**9).observe, lists,
                                          args.rounds // 5))
            # 2,000 rounds under tracemalloc, scaled to 10,000 (what the old ledger keeps grows linearly)
            mem_old = 5 * retained_bytes(lambda: OldOnline(budget, horizon), data, 2_000)
            mem_new = 5 * retained_bytes(lambda: OnlineShadow(budget, horizon, report_every=10**9), lists, 2_000)
            rows.append({"batch": bs, "budget": budget, "old_us": round(statistics.median(old_t), 1),
                         "new_us": round(statistics.median(new_t), 1),
                         "speedup": round(statistics.median(old_t) / statistics.median(new_t), 1),
                         "old_bytes_per_10k_rounds": mem_old, "new_bytes_per_10k_rounds": mem_new})
    print(f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
          f"python {platform.python_version()}, torch {torch.__version__}")
    print("| batch | budget | old us/round | new us/round | speedup | old KiB kept per 10k rounds | new |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['budget']} | {r['old_us']} | {r['new_us']} | {r['speedup']}x | "
              f"{r['old_bytes_per_10k_rounds'] / 1024:.0f} | {r['new_bytes_per_10k_rounds'] / 1024:.1f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
