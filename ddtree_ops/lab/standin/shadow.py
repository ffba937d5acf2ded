"""The ddtree plugin's shadow accounting, run for real on a simulated DFlash worker.

When DDTREE is registered by the ddtree plugin (its worker factory is the plugin's), real SGLang
builds the plugin's worker: SGLang's `DFlashWorkerV2` with the plugin's `ShadowWorkerMixin` in front.
The stand-in builds the same composition: the plugin's own mixin (imported from the installed engine
wheel) in front of `SimDFlashWorker`, which has the shape of the three DFlashWorkerV2 methods the
mixin wraps (0.5.17: `_maybe_build_draft_sampler`, `_greedy_sample_from_vocab_parallel_head`,
`forward_batch_generation`) and drafts from a small random head. So every `DDTREE ...` line, when
it is printed and what it says, and the Prometheus gauges, come from the plugin's code, fed with
simulated rounds whose committed lengths are the stand-in's per-request acceptance.

Without the plugin (not installed, or torch missing for its accounting) nothing of this runs: the
stand-in serves as SGLang's DFlash worker alone.
"""

from __future__ import annotations

import importlib.util
import random
import sys
import types
from typing import Any, Optional

from . import lines, sglog

PLUGIN_FACTORY = ("ddtree_ops.engine.sglang_plugin", "worker_factory")
SIM_VOCAB = 512  # the simulated draft head: small, so a verify round costs microseconds on a CPU
SIM_HIDDEN = 32
SIM_SHARPNESS = 3.0  # a trained drafter is confident: its top choice holds most of the mass


def is_plugin_worker(algo: Any) -> bool:
    """Whether the registered algorithm's worker is the ddtree plugin's (whatever its spec class)."""
    factory = getattr(algo, "factory", None)
    return (getattr(factory, "__module__", None), getattr(factory, "__name__", None)) == PLUGIN_FACTORY


def plugin_mixin() -> tuple[Optional[type], str]:
    """(ShadowWorkerMixin, "") from the installed plugin, or (None, why not)."""
    if importlib.util.find_spec("torch") is None:
        return None, "torch is not installed"
    try:
        if importlib.util.find_spec("prometheus_client") is None:
            # the lab venv has no prometheus_client (SGLang depends on it): the plugin's gauges are
            # kept by a text-format recorder of the same interface
            sys.modules.setdefault("prometheus_client", _recorder_module())
        # the ddtree plugin where it is installed: a lab host has it only after a ddtree-shadow deploy
        from ddtree_ops.engine.sglang_shadow import ShadowWorkerMixin
    except Exception as exc:  # noqa: BLE001 - an engine wheel of another version, a missing dependency
        return None, f"{type(exc).__name__}: {exc}"
    return ShadowWorkerMixin, ""


class _Mode:
    def __init__(self, name: str) -> None:
        self.name = name

    def is_extend(self) -> bool:
        # SGLang's ForwardMode.is_extend() is also true of TARGET_VERIFY
        return self.name in ("extend", "target_verify")

    def is_target_verify(self) -> bool:
        return self.name == "target_verify"

    def is_idle(self) -> bool:
        return False


class _Batch:
    def __init__(self, mode: str, commits: list[int]) -> None:
        self.forward_mode, self.is_extend_in_batch, self.commits = _Mode(mode), mode == "extend", commits


class SimDFlashWorker:
    """DFlashWorkerV2's shape where the mixin hooks in; the target's runner carries the capture
    layers (`spec_aux_config.dflash_target_layer_ids`) as SGLang's does."""

    def __init__(self, block_size: int, capture_layers: Optional[list[int]], seed: int = 0) -> None:
        import torch

        # the simulated tensors are tiny: worker threads only contend (35x slower on a busy 2-core box)
        torch.set_num_threads(1)
        self.block_size = int(block_size)
        aux = types.SimpleNamespace(dflash_target_layer_ids=capture_layers)
        self.model_runner = types.SimpleNamespace(spec_aux_config=aux,
                                                  model_config=types.SimpleNamespace(vocab_size=SIM_VOCAB))
        gen = torch.Generator().manual_seed(seed)
        self.lm_head = types.SimpleNamespace(weight=torch.randn(SIM_VOCAB, SIM_HIDDEN, generator=gen))
        self._gen = gen
        self._rng = random.Random(seed)
        self._draft_sampler: Any = None
        self._draft_block_tokens_buf: Any = None

    # ---- DFlashWorkerV2.init_cuda_graphs: the sampler is built before the draft graph capture
    def init_cuda_graphs(self) -> None:
        self._draft_sampler = self._maybe_build_draft_sampler()

    def _maybe_build_draft_sampler(self) -> Any:
        sglog.info(lines.DRAFT_HEAD_FOLDED)
        return "in-graph greedy head"

    def _greedy_sample_from_vocab_parallel_head(self, *, hidden_states: Any, lm_head: Any, chunk_size: int = 256) -> Any:
        import torch

        return torch.argmax(hidden_states @ lm_head.weight.T, dim=-1)

    def forward_batch_generation(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        """One prefill (extend) or one verify round for len(batch.commits) rows: the draft's block
        from the head, then DFlash's result (commit lengths with the bonus, the bonus tokens)."""
        import torch

        if batch.forward_mode.is_extend():
            return types.SimpleNamespace(accept_lens=None, next_draft_input=None)
        batch.forward_mode = _Mode("target_verify")   # as real 0.5.17 hands the batch back
        bs, width = len(batch.commits), self.block_size
        hidden = SIM_SHARPNESS * torch.randn(bs * (width - 1), SIM_HIDDEN, generator=self._gen)
        if self._draft_sampler is None:      # eager head (no graph, or kept eager by a plugin)
            draft = self._greedy_sample_from_vocab_parallel_head(hidden_states=hidden, lm_head=self.lm_head)
        else:                                # the head folded into the graph: no eager call
            draft = torch.argmax(hidden @ self.lm_head.weight.T, dim=-1)
        chain = draft.view(bs, width - 1)
        self._draft_block_tokens_buf = torch.cat([torch.zeros((bs, 1), dtype=chain.dtype), chain], dim=1)
        commit = torch.tensor([max(1, min(int(c), width)) for c in batch.commits], dtype=torch.int32)
        bonus = []
        logits = (hidden @ self.lm_head.weight.T).view(bs, width - 1, -1)
        for b, c in enumerate(commit.tolist()):
            depth = c - 1                    # drafts accepted; the bonus sits at this depth
            if depth < width - 1 and self._rng.random() < 0.3:
                # the target's token is the draft's second choice there: a sibling the tree holds
                bonus.append(int(torch.topk(logits[b, depth], 2).indices[1]))
            else:
                bonus.append(self._rng.randrange(SIM_VOCAB))
        return types.SimpleNamespace(accept_lens=commit,
                                     next_draft_input=types.SimpleNamespace(bonus_tokens=torch.tensor(bonus)))


class ShadowRun:
    """The plugin's worker in the stand-in: built at the draft graph capture (or at the first
    forward without graphs), fed the prefill and every verify round of every request."""

    def __init__(self, mixin: type, block_size: int, capture_layers: Optional[list[int]]) -> None:
        cls = type("DDTreeShadowWorker", (mixin, SimDFlashWorker), {})
        self.worker = cls(block_size, capture_layers)

    def init_cuda_graphs(self) -> None:
        self.worker.init_cuda_graphs()

    def prefill(self) -> None:
        self.worker.forward_batch_generation(_Batch("extend", []))

    def rounds(self, commits: list[int]) -> None:
        for c in commits:
            self.worker.forward_batch_generation(_Batch("decode", [c]))
        state = self.worker.__dict__.get("_ddtree_state")
        if state is not None:     # a request's last round is accounted before its answer returns
            state.drain(wait=True)

    def metrics_text(self) -> str:
        """The plugin's gauges in Prometheus text format, as SGLang's /metrics carries them."""
        mod = sys.modules.get("prometheus_client")
        if isinstance(mod, _Recorder):
            return mod.render()
        try:
            from prometheus_client import REGISTRY, generate_latest
        except ImportError:
            return ""
        text = generate_latest(REGISTRY).decode()
        return "".join(ln + "\n" for ln in text.splitlines() if "ddtree_shadow_" in ln)


# ---------------------------------------------------------------- a gauge recorder (no prometheus_client)


class _Gauge:
    """prometheus_client.Gauge's constructor, labels() and set(), kept in memory."""

    registry: list["_Gauge"]

    def __init__(self, name: str, doc: str, labelnames: tuple[str, ...] | list[str] = (), **_kw: Any) -> None:
        self.name, self.doc, self.labelnames = name, doc, tuple(labelnames)
        self.values: dict[tuple[str, ...], float] = {} if self.labelnames else {(): 0.0}
        self.registry.append(self)

    def labels(self, *values: str, **kw: str) -> "_Child":
        key = tuple(values) if values else tuple(str(kw[n]) for n in self.labelnames)
        return _Child(self, key)

    def set(self, value: float) -> None:
        self.values[()] = float(value)


class _Child:
    def __init__(self, gauge: _Gauge, key: tuple[str, ...]) -> None:
        self.gauge, self.key = gauge, key

    def set(self, value: float) -> None:
        self.gauge.values[self.key] = float(value)


class _Recorder(types.ModuleType):
    """Stands for the `prometheus_client` module where it is not installed (the lab's venv)."""

    def __init__(self) -> None:
        super().__init__("prometheus_client", "ddtree-ops LAB STAND-IN: gauges in Prometheus text format")
        self.gauges: list[_Gauge] = []
        self.Gauge = type("Gauge", (_Gauge,), {"registry": self.gauges})

    def render(self) -> str:
        out = []
        for g in self.gauges:
            out += [f"# HELP {g.name} {g.doc}", f"# TYPE {g.name} gauge"]
            for key, value in sorted(g.values.items()):
                labels = ",".join(f'{n}="{v}"' for n, v in zip(g.labelnames, key))
                out.append(f"{g.name}{{{labels}}} {value}" if labels else f"{g.name} {value}")
        return "".join(ln + "\n" for ln in out)


def _recorder_module() -> _Recorder:
    return _Recorder()
