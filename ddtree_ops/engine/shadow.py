"""Shadow-linear accounting: commit the chain, measure the tree beside it, decide on evidence.

Per round the chain's verify result is what is committed. On a share of rounds the tree built
from the same draft distributions is verified too, against the same context, and its exact
acceptance recorded (the target's logits under every tree node); on every round a lower bound
is derived from the chain's logits alone (the tree follows the chain's spine as far as the chain
accepted, then gains a token if the chain's bonus is a sibling there). Verify costs are recorded
for both, since the tree's extra acceptance has to pay for its wider forward.

The promotion call uses a paired test over rounds (the vLLM port's lesson: compare real step
counts of the same rounds, not a trace replayed under another policy) on the cost-adjusted
difference tree_tokens - r * chain_tokens, r being the measured cost ratio per round. It is
still a counterfactual measurement: the rounds follow the chain's commits. `engine verify`
also runs chain and tree end to end, whose per-prompt round counts are the real A/B.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ddtree_ops.engine.tree_shape import SPINE_BONUS, spine_for
from ddtree_ops.treestats import INCONCLUSIVE, KEEP_CHAIN, PROMOTE, Counters, ModeSums, Verdict, bs_bucket, verdict

if TYPE_CHECKING:       # the accounting itself runs on lists: no torch needed to import it
    from ddtree_ops.engine.tree import Tree



@dataclass
class RoundRecord:
    chain_tokens: int                     # tokens this round, bonus included (len of accepted path)
    chain_verify_s: float
    chain_nodes: int
    tree_lower: int                       # lower bound on the tree's tokens from chain logits only
    draft_s: float = 0.0
    tree_tokens: int | None = None        # exact, on sampled rounds
    tree_verify_s: float | None = None
    tree_build_s: float | None = None
    tree_nodes: int | None = None
    sibling_depths: list[int] = field(default_factory=list)   # depths where the tree path left rank 0


def spine_lower_bound(tree: Tree, chain_tokens: list[int], chain_accepted: int, bonus: int) -> int:
    """What the tree surely accepts given only the chain's verify: tokens incl. the bonus.

    Greedy: along the chain's accepted tokens the target's choices are the same under the tree
    (same ancestors), so the tree walks the spine as far as it holds it; if it holds all of it,
    the chain's bonus is the target's choice there too, and if that is a child in the tree the
    tree accepts one node more. Deeper gains need the target's logits under that sibling.
    """
    children = tree.children()
    node, depth = 0, 0
    for tok in chain_tokens[1:chain_accepted + 1]:
        nxt = children[node].get(tok)
        if nxt is None:
            return depth + 1
        node, depth = nxt, depth + 1
    return depth + 1 + (1 if bonus in children[node] else 0)


def sign_test(diffs: list[float]) -> tuple[float, float, int]:
    """One-sided exact sign tests. Returns (p that median > 0, p that median < 0, n non-zero)."""
    return sign_test_counts(sum(1 for d in diffs if d > 0), sum(1 for d in diffs if d < 0))


def sign_test_counts(pos: int, neg: int) -> tuple[float, float, int]:
    n = pos + neg
    if n == 0:
        return 1.0, 1.0, 0
    return half_binomial_tail(n, pos), half_binomial_tail(n, neg), n


def half_binomial_tail(n: int, k: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2), in floats and in time that does not grow with n.

    The serving path runs the sign test at every report over every round so far: summing
    `math.comb(n, i)` as big integers cost O(n^2) bits per report, and on the H200 (tax run 6,
    share 1.0, batch 8) it took the decode rate from 1,909 to 57 tok/s as the rounds grew. The
    upper tail above the mode is summed term by term from k, each term the last one times
    (n - i) / (i + 1), until the terms no longer change the sum; the lower side by symmetry."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if 2 * k <= n:                               # P(X >= k) = 1 - P(X >= n - k + 1)
        return 1.0 - half_binomial_tail(n, n - k + 1)
    term = math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - n * math.log(2.0))
    total, i = 0.0, k
    while i <= n and term > total * 1e-17:
        total += term
        term *= (n - i) / (i + 1)
        i += 1
    return min(1.0, total)


@dataclass
class ShadowReport:
    rounds: int
    sampled_rounds: int
    tau_chain: float
    tau_chain_sampled: float | None
    tau_tree: float | None
    tau_tree_lower: float
    chain_hist: dict[int, int]
    tree_hist: dict[int, int]
    sibling_hits: list[int]                # per depth 1..L: rounds whose tree path used a rank>0 node
    chain_cost_s: float | None             # mean draft + verify seconds per round
    tree_cost_s: float | None              # mean draft + build + verify seconds per round
    cost_ratio: float | None
    projected_speedup: float | None        # (tau_tree / tau_chain) / cost_ratio on sampled rounds
    p_tree_better: float | None
    p_tree_worse: float | None
    recommendation: str
    reason: str
    dropped_rounds: int = 0                # sampled greedy rounds whose request ended before the walk was decided
    cost_source: str = ""                  # where cost_ratio came from (DDTREE_VERIFY_COST_RATIO, a bench table)
    speedup_lower: float | None = None     # one-sided lower bound of projected_speedup (treestats.verdict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ShadowLedger:
    """Accumulates rounds; `report()` gives the figures and the call."""

    def __init__(self, horizon: int, min_rounds: int = 20, alpha: float = 0.05) -> None:
        self.horizon, self.min_rounds, self.alpha = horizon, min_rounds, alpha
        self.records: list[RoundRecord] = []

    def add(self, record: RoundRecord) -> None:
        self.records.append(record)

    def _bound_report(self, ratio: float) -> ShadowReport:
        return _bound_report_impl(self, ratio)

    def report(self, cost_ratio: float | None = None) -> ShadowReport:
        """Exact tree figures from the sampled rounds. Without any (the serving path), the paired
        test runs on the lower bound with the given cost ratio: enough to justify a promotion,
        never a rejection, since the exact tree can only do better than its bound."""
        recs = self.records
        sampled = [r for r in recs if r.tree_tokens is not None]
        if not sampled and cost_ratio is not None:
            return self._bound_report(cost_ratio)
        mean = lambda xs: statistics.fmean(xs) if xs else None  # noqa: E731
        hits = [0] * self.horizon
        for r in sampled:
            for d in r.sibling_depths:
                if 1 <= d <= self.horizon:
                    hits[d - 1] += 1
        chain_cost = mean([r.draft_s + r.chain_verify_s for r in sampled])
        tree_cost = mean([r.draft_s + (r.tree_build_s or 0.0) + (r.tree_verify_s or 0.0) for r in sampled])
        ratio = cost_ratio
        if ratio is None and chain_cost and tree_cost:
            ratio = tree_cost / chain_cost
        tau_tree = mean([float(r.tree_tokens) for r in sampled])  # type: ignore[arg-type]
        tau_chain_s = mean([float(r.chain_tokens) for r in sampled])
        speedup = None
        if tau_tree and tau_chain_s and ratio:
            speedup = (tau_tree / tau_chain_s) / ratio
        p_better = p_worse = None
        if ratio is None or len(sampled) < self.min_rounds:
            call, why = INCONCLUSIVE, (f"{len(sampled)} sampled rounds; need at least {self.min_rounds} "
                                       "with both verify costs measured")
        else:
            diffs = [float(r.tree_tokens) - ratio * r.chain_tokens for r in sampled]  # type: ignore[arg-type]
            p_better, p_worse, n = sign_test(diffs)
            if p_better < self.alpha and statistics.fmean(diffs) > 0:
                call, why = PROMOTE, (f"tree beats chain after its {ratio:.2f}x verify cost in {n} paired "
                                      f"rounds (sign test p={p_better:.3g}); confirm with an A/B of real "
                                      "step counts before switching")
            elif p_worse < self.alpha:
                call, why = KEEP_CHAIN, (f"the tree's extra acceptance does not pay for its {ratio:.2f}x "
                                         f"verify cost (sign test p={p_worse:.3g} that it is worse)")
            else:
                call, why = INCONCLUSIVE, (f"no significant difference over {n} non-tied rounds "
                                           f"(p better={p_better:.3g}, p worse={p_worse:.3g})")
        return ShadowReport(
            rounds=len(recs), sampled_rounds=len(sampled),
            tau_chain=mean([float(r.chain_tokens) for r in recs]) or 0.0,
            tau_chain_sampled=tau_chain_s, tau_tree=tau_tree,
            tau_tree_lower=mean([float(r.tree_lower) for r in recs]) or 0.0,
            chain_hist=dict(sorted(Counter(r.chain_tokens for r in recs).items())),
            tree_hist=dict(sorted(Counter(r.tree_tokens for r in sampled).items())),  # type: ignore[arg-type]
            sibling_hits=hits, chain_cost_s=chain_cost, tree_cost_s=tree_cost, cost_ratio=ratio,
            projected_speedup=speedup, p_tree_better=p_better, p_tree_worse=p_worse,
            recommendation=call, reason=why,
        )


def _bound_report_impl(ledger: ShadowLedger, ratio: float) -> ShadowReport:
    recs = ledger.records
    diffs = [r.tree_lower - ratio * r.chain_tokens for r in recs]
    p_better, p_worse, n = sign_test(diffs)
    if len(recs) >= ledger.min_rounds and p_better < ledger.alpha and statistics.fmean(diffs) > 0:
        call, why = PROMOTE, (f"even the tree's lower bound beats the chain after a {ratio:.2f}x verify cost "
                              f"({n} paired rounds, sign test p={p_better:.3g}); confirm with a real A/B")
    else:
        call, why = INCONCLUSIVE, ("lower-bound accounting only (no exact tree verify on this path): "
                                   f"it cannot show the tree is worse; p better={p_better:.3g} over {n} rounds")
    hits = [0] * ledger.horizon
    for r in recs:
        for d in r.sibling_depths:
            if 1 <= d <= ledger.horizon:
                hits[d - 1] += 1
    tau_chain = statistics.fmean([float(r.chain_tokens) for r in recs]) if recs else 0.0
    tau_lower = statistics.fmean([float(r.tree_lower) for r in recs]) if recs else 0.0
    return ShadowReport(
        rounds=len(recs), sampled_rounds=0, tau_chain=tau_chain, tau_chain_sampled=None, tau_tree=None,
        tau_tree_lower=tau_lower, chain_hist=dict(sorted(Counter(r.chain_tokens for r in recs).items())),
        tree_hist={}, sibling_hits=hits, chain_cost_s=None, tree_cost_s=None, cost_ratio=ratio,
        projected_speedup=(tau_lower / tau_chain) / ratio if tau_chain and ratio else None,
        p_tree_better=p_better, p_tree_worse=None, recommendation=call, reason=why)


def format_report(rep: ShadowReport) -> str:
    """One log line (the SGLang worker prints it every N rounds)."""
    tree = f"{rep.tau_tree:.3f}" if rep.tau_tree is not None else "n/a"
    ratio = f"{rep.cost_ratio:.2f}" if rep.cost_ratio is not None else "n/a"
    line = (f"DDTREE shadow: rounds={rep.rounds} sampled={rep.sampled_rounds} "
            f"tau_chain={rep.tau_chain:.3f} tau_tree={tree} tau_tree_lower={rep.tau_tree_lower:.3f} "
            f"cost_ratio={ratio} sibling_hits={rep.sibling_hits} recommendation={rep.recommendation}")
    if rep.cost_source:         # the serving path: where the ratio came from, rounds it could not decide
        line += f" cost_from={rep.cost_source} dropped={rep.dropped_rounds}"
    return line


class BoundTally:
    """Running totals of lower-bound rounds: what `ShadowLedger` would report over the same rounds
    with a cost ratio, in constant memory (a server accounts millions of rounds)."""

    def __init__(self, horizon: int, min_rounds: int = 20, alpha: float = 0.05,
                 cost_ratio: float | None = None) -> None:
        self.horizon, self.min_rounds, self.alpha, self.cost_ratio = horizon, min_rounds, alpha, cost_ratio
        self.rounds = self.chain_sum = self.lower_sum = self.pos = self.neg = 0
        self.diff_sum = 0.0
        self.chain_hist: Counter[int] = Counter()
        self.hits = [0] * horizon

    def add(self, chain_tokens: int, lower: int) -> None:
        self.rounds += 1
        self.chain_sum += chain_tokens
        self.lower_sum += lower
        self.chain_hist[chain_tokens] += 1
        if lower > chain_tokens and chain_tokens <= self.horizon:
            self.hits[chain_tokens - 1] += 1          # the sibling sits one below the accepted chain
        if self.cost_ratio is not None:
            d = lower - self.cost_ratio * chain_tokens
            self.diff_sum += d
            self.pos += d > 0
            self.neg += d < 0

    def report(self) -> ShadowReport:
        n, ratio = self.rounds, self.cost_ratio
        tau_chain = self.chain_sum / n if n else 0.0
        tau_lower = self.lower_sum / n if n else 0.0
        p_better = None
        if ratio is None:
            call, why = INCONCLUSIVE, ("lower-bound accounting only, and no tree/chain verify cost ratio "
                                       "(DDTREE_VERIFY_COST_RATIO) to weigh it against")
        else:
            p_better, _p_worse, nz = sign_test_counts(self.pos, self.neg)
            if n >= self.min_rounds and p_better < self.alpha and self.diff_sum > 0:
                call, why = PROMOTE, (f"even the tree's lower bound beats the chain after a {ratio:.2f}x verify "
                                      f"cost ({nz} paired rounds, sign test p={p_better:.3g}); confirm with a real A/B")
            else:
                call, why = INCONCLUSIVE, ("lower-bound accounting only (no exact tree verify on this path): "
                                           f"it cannot show the tree is worse; p better={p_better:.3g} over {nz} rounds")
        return ShadowReport(
            rounds=n, sampled_rounds=0, tau_chain=tau_chain, tau_chain_sampled=None, tau_tree=None,
            tau_tree_lower=tau_lower, chain_hist=dict(sorted(self.chain_hist.items())), tree_hist={},
            sibling_hits=list(self.hits), chain_cost_s=None, tree_cost_s=None, cost_ratio=ratio,
            projected_speedup=(tau_lower / tau_chain) / ratio if tau_chain and ratio else None,
            p_tree_better=p_better, p_tree_worse=None, recommendation=call, reason=why)


def mean_test(n: int, d_sum: float, d_sq: float) -> tuple[float, float]:
    """One-sided tests that the mean of n paired differences is above / below 0, from running
    sums (normal approximation: the serving path has thousands of rounds). Returns (p above,
    p below). A zero spread with a non-zero mean is decisive."""
    if n < 2:
        return 1.0, 1.0
    mean = d_sum / n
    var = max(0.0, (d_sq - n * mean * mean) / (n - 1))
    if var == 0.0:
        return (0.0, 1.0) if mean > 0 else (1.0, 0.0) if mean < 0 else (1.0, 1.0)
    z = mean / math.sqrt(var / n)
    upper = 0.5 * math.erfc(z / math.sqrt(2.0))
    return upper, 1.0 - upper


class ExactTally:
    """Running totals of rounds whose tree acceptance is exact (the greedy walk over the tokens
    committed after the round, or the served tree's own walk), paired with the chain's tokens of the
    same round: the counts and the first and second moments that `treestats` decides from.

    The verdict weighs the tree's tokens against the chain's at the cost ratio r (the tree's
    verify round costs r chain rounds): the tree pays when mean(tree - r * chain) > 0, i.e.
    tau_tree / tau_chain > r on the same rounds. The mean, not the median: throughput is a mean,
    and with r > 1 the median round is a tie that the tree loses, however often it gains."""

    def __init__(self, horizon: int) -> None:
        self.horizon = horizon
        self.n = self.chain_sum = self.tree_sum = 0
        self.chain_sq = self.tree_sq = self.tree_chain = 0
        self.tree_hist: Counter[int] = Counter()
        self.hits = [0] * horizon

    def add(self, chain_tokens: int, tree_tokens: int, sibling_depths: list[int]) -> None:
        self.n += 1
        self.chain_sum += chain_tokens
        self.tree_sum += tree_tokens
        self.chain_sq += chain_tokens * chain_tokens
        self.tree_sq += tree_tokens * tree_tokens
        self.tree_chain += tree_tokens * chain_tokens
        self.tree_hist[tree_tokens] += 1
        for d in sibling_depths:
            if 1 <= d <= self.horizon:
                self.hits[d - 1] += 1

    def test(self, ratio: float) -> tuple[float, float, float]:
        """(mean of tree - r * chain, p tree better, p tree worse)."""
        d_sum = self.tree_sum - ratio * self.chain_sum
        d_sq = self.tree_sq - 2 * ratio * self.tree_chain + ratio * ratio * self.chain_sq
        p_up, p_down = mean_test(self.n, d_sum, d_sq)
        return (d_sum / self.n if self.n else 0.0), p_up, p_down


class OnlineShadow:
    """Accounting fed by a serving engine's verify rounds (the SGLang worker's path).

    Shadow mode: inputs are what a DFlash verify already has: per-row draft top-K per depth, the
    verified block (root + chain), the accepted length and the bonus. Per row it builds the tree with
    the host heap and records the spine lower bound in running totals. Under greedy decoding the
    tree's exact acceptance follows later, once the tokens committed after the round are known
    (`observe_exact`). Tree mode (`sglang_tree`): every served tree round gives its exact pair at
    once. Either way the verdict is `treestats.verdict` over `counters()`, the same sums the worker
    exports on /metrics; figures go to the log every `report_every` rounds and to `on_report`.
    """

    def __init__(self, budget: int, horizon: int, report_every: int = 200,
                 on_report: Any = None, min_rounds: int = 20, cost_ratio: float | None = None,
                 cost_source: str = "", alpha: float = 0.05, mode: str = "shadow", spine: bool | None = None) -> None:
        self.budget, self.horizon, self.report_every = budget, horizon, max(1, report_every)
        self.spine = spine              # the tree a served tree would be: `heap_tree(..., self.spine)`
        self.cost_ratio, self.cost_source = cost_ratio, cost_source
        self.min_rounds, self.alpha, self.mode = min_rounds, alpha, mode
        self.tally = BoundTally(horizon, min_rounds=min_rounds, cost_ratio=cost_ratio)
        self.exact = ExactTally(horizon)
        self.dropped = 0                      # greedy rounds that could not be decided (the line's dropped=)
        self.drops: Counter[str] = Counter()  # every round without an exact pair, by reason
        self.cost: dict[tuple[str, str], list[float]] = {}    # (arm, bs bucket) -> [seconds, forwards]
        self.silent: str | None = None
        self.on_report = on_report

    def counters(self) -> Counters:
        """The running sums as `treestats` reads them off /metrics (`sglang_metrics` exports these)."""
        ex = self.exact
        sums = ModeSums(rounds=float(self.rounds), exact=float(ex.n), chain=float(ex.chain_sum),
                        tree=float(ex.tree_sum), chain_sq=float(ex.chain_sq), tree_sq=float(ex.tree_sq),
                        tree_chain=float(ex.tree_chain), dropped={k: float(v) for k, v in self.drops.items()})
        ratios = {self.cost_source or "configured": self.cost_ratio} if self.cost_ratio is not None else {}
        return Counters(modes={self.mode: sums}, verify={k: (v[0], v[1]) for k, v in self.cost.items()},
                        cost_ratios=ratios, silent=self.silent)

    @property
    def rounds(self) -> int:
        return self.tally.rounds

    def add_cost(self, arm: str, bs: int, seconds: float) -> None:
        """One verify forward of `bs` rows, of the tree or the chain, and its device seconds."""
        slot = self.cost.setdefault((arm, bs_bucket(bs)), [0.0, 0.0])
        slot[0] += seconds
        slot[1] += 1

    def verdict(self) -> Verdict:
        return verdict(self.counters(), min_exact=self.min_rounds, alpha=self.alpha, mode=self.mode)

    def report(self) -> ShadowReport:
        rep = self.tally.report()
        rep.dropped_rounds = self.dropped
        v = self.verdict()
        rep.cost_ratio, rep.cost_source = v.r, v.r_source or self.cost_source
        rep.projected_speedup, rep.p_tree_better, rep.p_tree_worse = v.speedup, v.p_better, v.p_worse
        rep.recommendation, rep.reason = v.recommendation, v.reason
        rep.speedup_lower = v.lower
        ex = self.exact
        if ex.n:
            rep.sampled_rounds = ex.n
            rep.tau_tree = ex.tree_sum / ex.n
            rep.tau_chain_sampled = ex.chain_sum / ex.n
            rep.tree_hist = dict(sorted(ex.tree_hist.items()))
            rep.sibling_hits = list(ex.hits)
        return rep

    def maybe_report(self) -> None:
        if self.rounds % self.report_every == 0 and self.on_report is not None:
            self.on_report(self.report())

    def observe(self, draft_tokens: Any, draft_scores: Any, candidates: Any, accept_len: Any, bonus: Any) -> list[int]:
        """draft_tokens/draft_scores [bs, L, K] (scores quantised as in `tree.quantize_logprobs`),
        candidates [bs, L + 1], accept_len [bs] (drafts accepted, bonus excluded), bonus [bs];
        tensors or nested lists (the SGLang worker hands over lists from pinned host buffers)."""
        toks, scores = _rows(draft_tokens), _rows(draft_scores)
        cands, acc, bon = _rows(candidates), _rows(accept_len), _rows(bonus)
        bounds = []
        for b, row in enumerate(cands):
            children, _ranks = heap_tree(toks[b], scores[b], self.budget, self.spine)
            bounds.append(self.observe_row(children, row, int(acc[b]), int(bon[b])))
        return bounds

    def observe_row(self, children: list[dict[int, int]], chain: list[int], accepted: int, bonus: int) -> int:
        """One row whose tree is built (`heap_tree`): its lower bound into the running totals."""
        lower = spine_bound(children, chain, accepted, bonus)
        self.tally.add(accepted + 1, lower)
        self.maybe_report()
        return lower

    def observe_exact(self, chain_tokens: int, tree_tokens: int, sibling_depths: list[int]) -> None:
        """One sampled round's exact tree figure (`greedy_walk`), decided some rounds after it."""
        self.exact.add(chain_tokens, tree_tokens, sibling_depths)

    def drop(self, rounds: int = 1, reason: str = "request-ended") -> None:
        """Sampled greedy rounds that could not be decided (their request ended first, the pending
        store was full, the root was not where the request's tokens put it): counted, never guessed."""
        self.dropped += rounds
        self.drops[reason] += rounds

    def unpaired(self, reason: str, rounds: int = 1) -> None:
        """Rounds accounted with no exact pair by design (a sampled request: its committed tokens are
        samples, not the target's greedy choices): counted under their reason, not in `dropped`."""
        self.drops[reason] += rounds


def _rows(x: Any) -> list[Any]:
    return x.tolist() if hasattr(x, "tolist") else list(x)


def heap_tree(tok: list[list[int]], sc: list[list[int]], budget: int,
              spine: bool | None = None) -> tuple[list[dict[int, int]], list[int]]:
    """`build_tree_heap` on plain lists: the same heap, the same pop order and node numbering,
    the same shape (`spine`; None: the default there, `tree_shape.spine_for`), without the tensors
    (the serving path runs it for every sampled row, where tensor construction cost more than the
    heap). Returns each node's children (token -> node) and each node's rank at its depth (root: 0)."""
    depth = len(tok)
    spine = spine_for(budget, depth, spine)
    k = len(tok[0]) if depth else 0
    children: list[dict[int, int]] = [{}]
    ranks = [0]
    keys = [SPINE_BONUS if spine else 0]
    on_spine = [spine]
    heap = [(-(keys[0] + sc[0][0]), 1, 0, 0)] if budget > 0 and depth > 0 and k > 0 else []
    push, pop = heapq.heappush, heapq.heappop
    while heap and len(keys) - 1 < budget:
        neg, d, p, r = pop(heap)
        node = len(keys)
        children.append({})
        children[p][tok[d - 1][r]] = node
        keys.append(-neg)
        ranks.append(r)
        on_spine.append(on_spine[p] and r == 0)
        if r + 1 < k:
            push(heap, (-(keys[p] + sc[d - 1][r + 1] - (SPINE_BONUS if on_spine[p] else 0)), d, p, r + 1))
        if d < depth:
            push(heap, (neg - sc[d][0], d + 1, node, 0))
    return children, ranks


def spine_bound(children: list[dict[int, int]], chain: list[int], accepted: int, bonus: int) -> int:
    """`spine_lower_bound` on `heap_tree`'s children."""
    node, got = 0, 0
    for t in chain[1:accepted + 1]:
        nxt = children[node].get(t)
        if nxt is None:
            return got + 1
        node, got = nxt, got + 1
    return got + 1 + (1 if bonus in children[node] else 0)


def heap_spine_bound(tok: list[list[int]], sc: list[list[int]], budget: int, chain: list[int],
                     accepted: int, bonus: int, spine: bool | None = None) -> tuple[int, int]:
    """`spine_lower_bound(build_tree_heap(...), ...)` on plain lists. Returns (bound, tree size)."""
    children, _ranks = heap_tree(tok, sc, budget, spine)
    return spine_bound(children, chain, accepted, bonus), len(children)


def greedy_walk(children: list[dict[int, int]], ranks: list[int], continuation: Any,
                horizon: int) -> tuple[int, list[int]] | None:
    """What the tree accepts under greedy verification, given the target's greedy continuation of
    the round's root (the tokens committed after it, known some rounds later): the longest prefix
    of the continuation that is a path in the tree, plus the target's own next token. Returns
    (tokens incl. that bonus, depths where the path took a rank > 0 node), or None while the
    continuation is too short to decide (the walk still matches at its end, above the horizon)."""
    node, depth, siblings = 0, 0, []
    for tok in continuation:
        if depth >= horizon or not children[node]:
            break
        nxt = children[node].get(int(tok))
        if nxt is None:
            return depth + 1, siblings
        node, depth = nxt, depth + 1
        if ranks[nxt] > 0:
            siblings.append(depth)
    if depth >= horizon or not children[node]:
        return depth + 1, siblings
    return None
