"""The DDTree verdict from the plugin's /metrics counters: parse a scrape, subtract two scrapes, decide.

The plugin (shadow mode: the chain is served and the tree accounted; tree mode: the tree is served and
its spine tells what the chain alone would have accepted) exports running sums as Prometheus counters
(`ddtree_*_total`), so any window between two scrapes is their difference. Over the window's exact
greedy rounds, each a pair (c chain tokens, t tree tokens), the tree pays when tau_tree / tau_chain
exceeds r, the verify cost of a tree round in chain rounds. From the sums of c, t, c^2, t^2 and t*c the
differences d = t - r*c have sum(d) = T - r*C and sum(d^2) = Tss - 2r*TC + r^2*Css for any r, so r can
be chosen after the scrape (an operator's, the one the server measured over the same window).

The projected speedup is S = (tau_tree / tau_chain) / r. Its one-sided lower bound at 1 - alpha is
the delta method on the ratio of paired means: Var(T/C) ~ sum((t - R*c)^2) / (n (n - 1) mean(c)^2)
with R = T/C; r is taken as known (a measured r comes from far more verify rounds than the pairs).
`recommendation` is promote-tree when that lower bound clears `bar` (1.0: the tree is faster), keep-chain
when the upper bound stays below 1, else inconclusive, always with its reason. The plugin's own report
line and its `recommendation` come from this function over its cumulative counters, so a verdict
recomputed from two scrapes of a server that was up for the whole window is the server's own answer.

Pure and standard-library only: the plugin imports it inside SGLang, `smoke` and `promote` on the
control machine.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Mapping

PROMOTE, KEEP_CHAIN, INCONCLUSIVE = "promote-tree", "keep-chain", "inconclusive"
MODES = ("shadow", "tree")
ARMS = ("tree", "chain")
# where the r in force came from (the `source` label of ddtree_cost_ratio)
FROM_ENV = "DDTREE_VERIFY_COST_RATIO"
FROM_MEASURED = "measured"
FROM_GIVEN = "given"
# at least this many verify forwards of each arm in a batch-size bucket before its cost counts
MIN_COST_ROUNDS = 20

# name -> field of ModeSums (the `mode` label); the counters' names are the contract with the plugin
SUMS = {"ddtree_rounds_total": "rounds", "ddtree_exact_rounds_total": "exact",
        "ddtree_chain_tokens_total": "chain", "ddtree_tree_tokens_total": "tree",
        "ddtree_chain_tokens_sq_total": "chain_sq", "ddtree_tree_tokens_sq_total": "tree_sq",
        "ddtree_tree_chain_tokens_total": "tree_chain"}
DROPPED = "ddtree_dropped_rounds_total"
VERIFY_SECONDS, VERIFY_ROUNDS = "ddtree_verify_seconds_total", "ddtree_verify_rounds_total"
COST_RATIO, SILENT = "ddtree_cost_ratio", "ddtree_silent"


def bs_bucket(bs: int) -> str:
    """The batch-size bucket a verify forward's cost is kept under: 1, 2, 4, 8, ... (the power of
    two at or above bs), so a ratio compares forwards of alike batches."""
    return str(1 << max(0, int(bs) - 1).bit_length())


@dataclass(frozen=True)
class ModeSums:
    """One mode's sums (rows: a verify round of one request)."""

    rounds: float = 0.0          # rows accounted
    exact: float = 0.0           # rows with an exact (chain, tree) pair (greedy)
    chain: float = 0.0           # sum c over exact rows
    tree: float = 0.0            # sum t
    chain_sq: float = 0.0        # sum c^2
    tree_sq: float = 0.0         # sum t^2
    tree_chain: float = 0.0      # sum t*c
    dropped: Mapping[str, float] = field(default_factory=dict)   # reason -> rows

    def minus(self, before: ModeSums) -> ModeSums:
        fields = {name: getattr(self, name) - getattr(before, name) for name in SUMS.values()}
        dropped = {k: v - before.dropped.get(k, 0.0) for k, v in self.dropped.items()}
        return ModeSums(**fields, dropped=dropped)

    def went_down(self, before: ModeSums) -> bool:
        return (any(getattr(self, n) < getattr(before, n) for n in SUMS.values())
                or any(self.dropped.get(k, 0.0) < v for k, v in before.dropped.items()))


@dataclass(frozen=True)
class Counters:
    """The ddtree counters of one scrape (or of a window between two)."""

    modes: Mapping[str, ModeSums] = field(default_factory=dict)
    verify: Mapping[tuple[str, str], tuple[float, float]] = field(default_factory=dict)  # (arm, bs) -> (s, n)
    cost_ratios: Mapping[str, float] = field(default_factory=dict)    # source -> r (gauges: last value)
    silent: str | None = None        # the reason of ddtree_silent{reason} == 1
    restarted: bool = False          # a window over which a counter went down: the server restarted

    def mode(self, name: str | None = None) -> tuple[str, ModeSums]:
        """The named mode's sums, or the one with the most rounds (a server runs one mode)."""
        if name is not None:
            return name, self.modes.get(name, ModeSums())
        if not self.modes:
            return "shadow", ModeSums()
        return max(self.modes.items(), key=lambda kv: (kv[1].rounds, kv[0] == "tree"))


_SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)')
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _labels(text: str | None) -> dict[str, str]:
    return {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(text or "")}


def parse_metrics(text: str) -> Counters | None:
    """The ddtree counters of a /metrics scrape (Prometheus text format); None when it has none
    (metrics off, no plugin, or an older plugin with gauges only)."""
    sums: dict[str, dict[str, float]] = {}
    dropped: dict[str, dict[str, float]] = {}
    verify: dict[tuple[str, str], list[float]] = {}
    ratios: dict[str, float] = {}
    silent = None
    seen = False
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or not m.group(1).startswith("ddtree_"):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if math.isnan(value):
            continue
        name, labels = m.group(1), _labels(m.group(2))
        if name in SUMS:
            seen = True
            mode = labels.get("mode", "shadow")
            sums.setdefault(mode, {})[SUMS[name]] = sums.get(mode, {}).get(SUMS[name], 0.0) + value
        elif name == DROPPED:
            seen = True
            per = dropped.setdefault(labels.get("mode", "shadow"), {})
            reason = labels.get("reason", "")
            per[reason] = per.get(reason, 0.0) + value
        elif name in (VERIFY_SECONDS, VERIFY_ROUNDS):
            seen = True
            slot = verify.setdefault((labels.get("arm", ""), labels.get("bs", "")), [0.0, 0.0])
            slot[0 if name == VERIFY_SECONDS else 1] += value
        elif name == COST_RATIO and "source" in labels and value > 0:
            ratios[labels["source"]] = value
        elif name == SILENT and value >= 1 and "reason" in labels:
            silent = labels["reason"]
    if not seen:
        return None
    modes = {mode: ModeSums(**sums.get(mode, {}), dropped=dropped.get(mode, {}))
             for mode in sorted(set(sums) | set(dropped))}
    return Counters(modes=modes, verify={k: (v[0], v[1]) for k, v in verify.items()}, cost_ratios=ratios,
                    silent=silent)


def window(before: Counters | None, after: Counters) -> Counters:
    """What happened between two scrapes: `after` minus `before`, counter by counter (gauges are
    `after`'s). A counter that went down means the server restarted in between: the window is then
    what `after` counted since that start (never a negative sum), with `restarted` set."""
    if before is None:
        return after
    went_down = any(after.modes.get(m, ModeSums()).went_down(s) for m, s in before.modes.items())
    went_down |= any(after.verify.get(k, (0.0, 0.0))[i] < v[i] for k, v in before.verify.items() for i in (0, 1))
    if went_down:
        return replace(after, restarted=True)
    modes = {m: s.minus(before.modes.get(m, ModeSums())) for m, s in after.modes.items()}
    verify = {k: (s - before.verify.get(k, (0.0, 0.0))[0], n - before.verify.get(k, (0.0, 0.0))[1])
              for k, (s, n) in after.verify.items()}
    return replace(after, modes=modes, verify=verify)


@dataclass(frozen=True)
class Verdict:
    mode: str
    rounds: int
    exact_rounds: int
    dropped_rounds: int
    tau_chain: float | None
    tau_tree: float | None
    r: float | None
    r_source: str | None
    speedup: float | None             # (tau_tree / tau_chain) / r
    lower: float | None               # one-sided lower bound of speedup at 1 - alpha
    upper: float | None               # one-sided upper bound (keep-chain when below 1)
    p_better: float | None            # one-sided p that mean(t - r*c) <= 0 (the tree is not better)
    p_worse: float | None             # one-sided p that mean(t - r*c) >= 0
    recommendation: str
    reason: str
    silent: str | None = None
    restarted: bool = False
    alpha: float = 0.05

    def to_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def measured_ratio(c: Counters, min_rounds: int = MIN_COST_ROUNDS) -> float | None:
    """r from the verify-cost counters: the time the tree forwards took over the time chain forwards
    of the same batch-size buckets would have taken (each bucket's mean chain forward, weighted by its
    tree forwards). Buckets with fewer than `min_rounds` forwards of either arm are left out."""
    tree_s = chain_s = 0.0
    for (arm, bs), (secs, n) in c.verify.items():
        if arm != "tree" or n < min_rounds:
            continue
        cs, cn = c.verify.get(("chain", bs), (0.0, 0.0))
        if cn < min_rounds or cs <= 0:
            continue
        tree_s += secs
        chain_s += n * cs / cn
    return tree_s / chain_s if chain_s > 0 else None


def ratio_in_force(c: Counters, r: float | None = None) -> tuple[float | None, str | None]:
    """(r, where from): the caller's; else an operator's DDTREE_VERIFY_COST_RATIO; else measured on
    this server's own verify rounds; else the configured default (the engine benchmark's)."""
    if r is not None:
        return float(r), FROM_GIVEN
    if FROM_ENV in c.cost_ratios:
        return c.cost_ratios[FROM_ENV], FROM_ENV
    measured = measured_ratio(c)
    if measured is not None:
        return measured, FROM_MEASURED
    rest = sorted((k, v) for k, v in c.cost_ratios.items() if k != FROM_MEASURED)
    if rest:
        return rest[0][1], rest[0][0]
    if FROM_MEASURED in c.cost_ratios:
        return c.cost_ratios[FROM_MEASURED], FROM_MEASURED
    return None, None


def verdict(counters: Counters, *, r: float | None = None, min_exact: int = 20, alpha: float = 0.05,
            bar: float = 1.0, mode: str | None = None) -> Verdict:
    """The call over the counters' exact rounds (see the module docstring)."""
    name, s = counters.mode(mode)
    ratio, source = ratio_in_force(counters, r)
    n = int(round(s.exact))
    dropped = int(round(sum(s.dropped.values())))
    tau_c = s.chain / n if n else None
    tau_t = s.tree / n if n else None
    base = dict(mode=name, rounds=int(round(s.rounds)), exact_rounds=n, dropped_rounds=dropped, tau_chain=tau_c,
                tau_tree=tau_t, r=ratio, r_source=source, silent=counters.silent, restarted=counters.restarted,
                alpha=alpha)
    if counters.silent is not None and n == 0:
        return Verdict(**base, speedup=None, lower=None, upper=None, p_better=None, p_worse=None,
                       recommendation=INCONCLUSIVE, reason=f"silent: {counters.silent}")
    if not n or not tau_c:
        return Verdict(**base, speedup=None, lower=None, upper=None, p_better=None, p_worse=None,
                       recommendation=INCONCLUSIVE, reason=f"{n} exact rounds; need at least {min_exact}")
    big_r = s.tree / s.chain
    if ratio is None:
        return Verdict(**base, speedup=None, lower=None, upper=None, p_better=None, p_worse=None,
                       recommendation=INCONCLUSIVE,
                       reason="no tree/chain verify cost ratio to weigh the tree against")
    speedup = big_r / ratio
    z = NormalDist().inv_cdf(1.0 - alpha)
    if n >= 2:
        # sum((t - R c)^2) with R = T / C; the sum of t - R c is 0 by construction
        ss = max(0.0, s.tree_sq - 2 * big_r * s.tree_chain + big_r * big_r * s.chain_sq)
        se = math.sqrt(ss / (n * (n - 1))) / tau_c / ratio
        lower, upper = speedup - z * se, speedup + z * se
        d_sum = s.tree - ratio * s.chain
        d_ss = max(0.0, s.tree_sq - 2 * ratio * s.tree_chain + ratio * ratio * s.chain_sq)
        p_better, p_worse = _mean_test(n, d_sum, d_ss)
    else:
        lower = upper = None
        p_better = p_worse = None
    base.update(speedup=speedup, lower=lower, upper=upper, p_better=p_better, p_worse=p_worse)
    figures = (f"tau_tree {tau_t:.3f} / tau_chain {tau_c:.3f} over {n} exact rounds at r {ratio:.3f} ({source}): "
               f"speedup {speedup:.3f}")
    if n < min_exact or lower is None or upper is None:
        return Verdict(**base, recommendation=INCONCLUSIVE, reason=f"{n} exact rounds; need at least {min_exact}")
    bound = f", {100 * (1 - alpha):g}% lower bound {lower:.3f}"
    if lower > bar:
        return Verdict(**base, recommendation=PROMOTE, reason=f"{figures}{bound} > {bar:g}")
    if upper < 1.0:
        return Verdict(**base, recommendation=KEEP_CHAIN,
                       reason=f"{figures}, upper bound {upper:.3f} < 1: the tree does not pay for its verify cost")
    return Verdict(**base, recommendation=INCONCLUSIVE, reason=f"{figures}{bound}, upper {upper:.3f}: not told "
                                                               f"apart from {bar:g}")


def _mean_test(n: int, d_sum: float, d_ss: float) -> tuple[float, float]:
    """One-sided p-values that the mean paired difference is <= 0 / >= 0 (normal approximation);
    a zero spread with a non-zero mean is decisive."""
    mean = d_sum / n
    var = max(0.0, (d_ss - n * mean * mean) / (n - 1))
    if var <= 1e-12 * max(1.0, mean * mean):
        return (0.0, 1.0) if mean > 0 else (1.0, 0.0) if mean < 0 else (1.0, 1.0)
    upper = 0.5 * math.erfc((mean / math.sqrt(var / n)) / math.sqrt(2.0))
    return upper, 1.0 - upper
