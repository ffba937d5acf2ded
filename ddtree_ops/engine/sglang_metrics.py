"""The DDTREE shadow's Prometheus gauges, as SGLang's /metrics carries them.

Created if prometheus_client is importable (SGLang depends on it), once per process: SGLang's
/metrics reads every scheduler's gauges through its multiprocess directory. `smoke` reads
`ddtree_shadow_rounds`, `_tau_chain`, `_tau_tree_lower` and `_silent` (`smoke/parse.py`).
"""

from __future__ import annotations

import os
from typing import Any


class ShadowMetrics:
    _shared: dict[str, Any] | None = None

    def __init__(self) -> None:
        if ShadowMetrics._shared is None:
            ShadowMetrics._shared = self._create()
        self.gauges = ShadowMetrics._shared

    @staticmethod
    def _create() -> dict[str, Any]:
        try:
            from prometheus_client import Gauge
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
            # what `smoke` reads: 1 once the worker has said that nothing is being accounted
            gauges["silent"] = Gauge("ddtree_shadow_silent", "1: verify rounds ran and none was accounted",
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
            self.gauges["verify_rounds"].set(verify_rounds)

    def publish(self, rep: Any) -> None:
        if not self.gauges:
            return
        self.gauges["rounds"].set(rep.rounds)
        self.gauges["tau_chain"].set(rep.tau_chain)
        self.gauges["tau_tree_lower"].set(rep.tau_tree_lower)
        if rep.tau_tree is not None and "tau_tree" in self.gauges:
            self.gauges["tau_tree"].set(rep.tau_tree)
        self.gauges["promote"].set({"promote-tree": 1, "keep-chain": -1}.get(rep.recommendation, 0))
        for depth, hits in enumerate(rep.sibling_hits, start=1):
            self.gauges["sibling_hits"].labels(depth=str(depth)).set(hits)
