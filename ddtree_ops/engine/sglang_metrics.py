"""The DDTREE plugin's /metrics: Prometheus counters of the running sums, and the older gauges.

Created if prometheus_client is importable (SGLang depends on it), once per process: SGLang's
/metrics reads every scheduler's series through its multiprocess directory (counters are summed
across processes there, gauges keep the most recent value).

Counters (`treestats` reads them; any window between two scrapes is their difference), published
together at each report so that a scrape right after a report line holds exactly its figures:
  ddtree_rounds_total{mode}, ddtree_exact_rounds_total{mode}, ddtree_dropped_rounds_total{mode,reason},
  ddtree_chain_tokens_total{mode}, ddtree_tree_tokens_total{mode}, ddtree_chain_tokens_sq_total{mode},
  ddtree_tree_tokens_sq_total{mode}, ddtree_tree_chain_tokens_total{mode},
  ddtree_verify_seconds_total{arm,bs}, ddtree_verify_rounds_total{arm,bs};
gauges: ddtree_cost_ratio{source} (the r in force, by where it came from) and ddtree_silent{reason}.
The shadow's gauges (`ddtree_shadow_rounds`, `_tau_chain`, `_tau_tree_lower`, `_silent`, ...) stay for
dashboards and the `smoke` of earlier releases.
"""

from __future__ import annotations

import os
from typing import Any

from ddtree_ops.treestats import ModeSums

# counter name (without _total) -> ModeSums field; the `mode` label says shadow or tree
_SUMS = (("ddtree_rounds", "rounds", "rounds accounted (a verify round of one request)"),
         ("ddtree_exact_rounds", "exact", "rounds with exact paired chain and tree figures (greedy)"),
         ("ddtree_chain_tokens", "chain", "chain tokens (bonus included) over the exact rounds"),
         ("ddtree_tree_tokens", "tree", "tree tokens (bonus included) over the exact rounds"),
         ("ddtree_chain_tokens_sq", "chain_sq", "sum of squared chain tokens over the exact rounds"),
         ("ddtree_tree_tokens_sq", "tree_sq", "sum of squared tree tokens over the exact rounds"),
         ("ddtree_tree_chain_tokens", "tree_chain", "sum of tree tokens times chain tokens over the exact rounds"))


class ShadowMetrics:
    _shared: dict[str, Any] | None = None

    def __init__(self) -> None:
        if ShadowMetrics._shared is None:
            ShadowMetrics._shared = self._create()
        self.gauges = ShadowMetrics._shared
        self.sent_modes: dict[str, ModeSums] = {}
        self.sent_cost: dict[tuple[str, str], tuple[float, float]] = {}

    @staticmethod
    def _create() -> dict[str, Any]:
        try:
            from prometheus_client import Counter, Gauge
        except ImportError:
            return {}
        mode = {"multiprocess_mode": "mostrecent"} if os.environ.get("PROMETHEUS_MULTIPROC_DIR") else {}
        gauges: dict[str, Any] = {}
        try:
            for name, doc in (("rounds", "verify rounds accounted"),
                              ("tau_chain", "tokens per round committed by the DFlash chain"),
                              ("tau_tree_lower", "lower bound on the DDTree tree's tokens per round"),
                              ("tau_tree", "the DDTree tree's exact tokens per round (greedy rounds)"),
                              ("promote", "1 promote the tree, 0 inconclusive, -1 keep the chain"),
                              ("verify_rounds", "verify rounds DFlash ran")):
                gauges[name] = Gauge(f"ddtree_shadow_{name}", doc, **mode)
            gauges["sibling_hits"] = Gauge("ddtree_shadow_sibling_hits",
                                           "rounds whose tree path took a sibling at this depth", ["depth"], **mode)
            # what `smoke` of earlier releases reads: 1 once the worker has said that nothing is being accounted
            gauges["silent"] = Gauge("ddtree_shadow_silent", "1: verify rounds ran and none was accounted",
                                     ["reason"], **mode)
            for name, key, doc in _SUMS:
                gauges["c_" + key] = Counter(name, doc, ["mode"])
            gauges["c_dropped"] = Counter("ddtree_dropped_rounds", "rounds accounted without an exact pair, by reason",
                                          ["mode", "reason"])
            gauges["c_verify_s"] = Counter("ddtree_verify_seconds", "device seconds of verify forwards (measured)",
                                           ["arm", "bs"])
            gauges["c_verify_n"] = Counter("ddtree_verify_rounds", "verify forwards timed", ["arm", "bs"])
            gauges["cost_ratio"] = Gauge("ddtree_cost_ratio", "the tree/chain verify cost ratio in force, by its "
                                         "source", ["source"], **mode)
            gauges["any_silent"] = Gauge("ddtree_silent", "1: verify rounds ran and none was accounted",
                                         ["reason"], **mode)
        except ValueError:      # registered by someone else in this process
            return {}
        return gauges

    def progress(self, verify_rounds: int) -> None:
        if self.gauges:
            self.gauges["verify_rounds"].set(verify_rounds)

    def silent(self, verify_rounds: int, reason: str) -> None:
        if self.gauges:
            self.gauges["silent"].labels(reason=reason[:120]).set(1)
            self.gauges["any_silent"].labels(reason=reason[:120]).set(1)
            self.gauges["verify_rounds"].set(verify_rounds)

    def cost_ratio(self, source: str, ratio: float) -> None:
        if self.gauges:
            self.gauges["cost_ratio"].labels(source=source).set(ratio)

    def publish_counters(self, counters: Any) -> None:
        """Bring the Prometheus counters up to `counters` (a `treestats.Counters` of running sums):
        each counter is increased by what it lacks, so /metrics holds the same sums."""
        if not self.gauges:
            return
        g = self.gauges
        for mode, sums in counters.modes.items():
            sent = self.sent_modes.get(mode, ModeSums())
            for _name, key, _doc in _SUMS:
                delta = getattr(sums, key) - getattr(sent, key)
                if delta > 0:
                    g["c_" + key].labels(mode=mode).inc(delta)
            for reason, value in sums.dropped.items():
                delta = value - sent.dropped.get(reason, 0.0)
                if delta > 0:
                    g["c_dropped"].labels(mode=mode, reason=reason).inc(delta)
            self.sent_modes[mode] = sums
        for (arm, bs), (secs, n) in counters.verify.items():
            s0, n0 = self.sent_cost.get((arm, bs), (0.0, 0.0))
            if secs > s0:
                g["c_verify_s"].labels(arm=arm, bs=bs).inc(secs - s0)
            if n > n0:
                g["c_verify_n"].labels(arm=arm, bs=bs).inc(n - n0)
            self.sent_cost[(arm, bs)] = (secs, n)

    def publish(self, rep: Any, counters: Any = None) -> None:
        if not self.gauges:
            return
        if counters is not None:
            self.publish_counters(counters)
        self.gauges["rounds"].set(rep.rounds)
        self.gauges["tau_chain"].set(rep.tau_chain)
        self.gauges["tau_tree_lower"].set(rep.tau_tree_lower)
        if rep.tau_tree is not None and "tau_tree" in self.gauges:
            self.gauges["tau_tree"].set(rep.tau_tree)
        self.gauges["promote"].set({"promote-tree": 1, "keep-chain": -1}.get(rep.recommendation, 0))
        for depth, hits in enumerate(rep.sibling_hits, start=1):
            self.gauges["sibling_hits"].labels(depth=str(depth)).set(hits)
