"""The ddtree plugin's shadow accounting, run for real on a simulated DFlash worker.

When DDTREE is registered by the ddtree plugin (its worker factory is the plugin's), real SGLang
builds the plugin's worker: SGLang's `DFlashWorkerV2` with the plugin's `ShadowWorkerMixin` in front.
The stand-in builds the same composition: the plugin's own mixin (imported from the installed engine
wheel) in front of `SimDFlashWorker`, which has the shape of the three DFlashWorkerV2 methods the
mixin wraps (0.5.17: `_maybe_build_draft_sampler`, `_greedy_sample_from_vocab_parallel_head`,
`forward_batch_generation`) and drafts from a small random head. Its draft sampler has the shape
of DFlash's `_DflashDraftSampler` (the plugin folds its top-K into it, as on a GPU), and a "graph
replay" calls it as SGLang's captured graph runs it. Each request is a `SimRequest` whose
`output_ids` grow by what each round commits (the chain's accepted drafts and the bonus), as
SGLang's scheduler fills them: the plugin's exact greedy accounting reads them. So every `DDTREE
...` line, when it is printed and what it says, and the Prometheus gauges, come from the plugin's
code, fed with simulated rounds whose committed lengths are the stand-in's per-request acceptance.

Under `SGLANG_SIMULATE_ACC_LEN` (the real runs' knob for random weights) the draft is as flat as a
random-weight model's and the bonus an arbitrary token, as on the H200: the tree then spreads
wide at depth 1 and the real runs' verdict (the chain's forced tokens beat it) is what the
stand-in's plugin reaches too.

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
SIM_MAX_BS = 8       # the largest captured draft graph (h200.yaml: cuda_graph_max_bs 8)
SIM_SHARPNESS = 3.0  # a trained drafter is confident: its top choice holds most of the mass
SIM_FLAT = 0.05      # random weights (the real runs under SGLANG_SIMULATE_ACC_LEN): nearly uniform


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


class ForwardMode:
    """SGLang's ForwardMode as the plugin asks it (also the engine tests' fake batches use it)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def is_extend(self) -> bool:
        # SGLang's ForwardMode.is_extend() is also true of TARGET_VERIFY
        return self.name in ("extend", "target_verify")

    def is_target_verify(self) -> bool:
        return self.name == "target_verify"

    def is_idle(self) -> bool:
        return self.name == "idle"


class SimRequest:
    """SGLang's Req as the plugin reads it: the prompt, the committed outputs, greedy params."""

    def __init__(self, prompt_len: int) -> None:
        self.origin_input_ids = [0] * max(1, prompt_len)
        self.output_ids: list[int] = []
        self.sampling_params = types.SimpleNamespace(top_k=1, temperature=1.0)   # temperature 0, normalised
        self.done = False

    def finished(self) -> bool:
        return self.done


class _Batch:
    def __init__(self, mode: str, commits: list[int], reqs: Optional[list[SimRequest]] = None) -> None:
        import torch

        self.forward_mode, self.is_extend_in_batch, self.commits = ForwardMode(mode), mode == "extend", commits
        self.reqs = reqs
        self.seq_lens = (torch.tensor([len(r.origin_input_ids) + len(r.output_ids) - 1 for r in reqs])
                         if reqs else None)


class _DflashDraftSampler:
    """DFlash's in-graph greedy head, as both supported releases define it (the plugin's tests
    hold the real class to the same fields and call): an argmax over the head into `out`."""

    def __init__(self, *, weight: Any, block_size: int, num_org: int, org_vocab_start: int, max_bs: int) -> None:
        import torch

        self.weight, self.block_size, self.num_org, self.org_vocab_start = weight, block_size, num_org, org_vocab_start
        self.tp_size = 1
        self.out = torch.empty((max_bs * (block_size - 1),), dtype=torch.int64)

    def __call__(self, hidden_states: Any, input_ids: Any = None) -> None:
        import torch

        bs = hidden_states.shape[0] // self.block_size
        hs = hidden_states.view(bs, self.block_size, -1)[:, 1:, :].reshape(-1, hidden_states.shape[-1])
        n = hs.shape[0]
        self.out[:n].copy_(torch.argmax(torch.matmul(hs, self.weight[: self.num_org].T), dim=-1))


class SimDFlashWorker:
    """DFlashWorkerV2's shape where the mixin hooks in; the target's runner carries the capture
    layers (`spec_aux_config.dflash_target_layer_ids`) as SGLang's does."""

    def __init__(self, block_size: int, capture_layers: Optional[list[int]], seed: int = 0,
                 sharpness: float = SIM_SHARPNESS) -> None:
        import torch

        # the simulated tensors are tiny: worker threads only contend (35x slower on a busy 2-core box)
        torch.set_num_threads(1)
        self.block_size = int(block_size)
        self.sharpness = sharpness
        aux = types.SimpleNamespace(dflash_target_layer_ids=capture_layers)
        self.model_runner = types.SimpleNamespace(spec_aux_config=aux,
                                                  model_config=types.SimpleNamespace(vocab_size=SIM_VOCAB))
        gen = torch.Generator().manual_seed(seed)
        self.lm_head = types.SimpleNamespace(weight=torch.randn(SIM_VOCAB, SIM_HIDDEN, generator=gen))
        self._gen = gen
        self._rng = random.Random(seed)
        self._draft_sampler: Any = None
        self._draft_block_tokens_buf: Any = None
        self.committed: list[list[int]] = []     # per row of the last round: what the scheduler appends

    # ---- DFlashWorkerV2.init_cuda_graphs: the sampler is built before the draft graph capture,
    # and SGLang's capture warms it up (here: once, at the largest size)
    def init_cuda_graphs(self) -> None:
        import torch

        self._draft_sampler = self._maybe_build_draft_sampler()
        if self._draft_sampler is not None:
            self._draft_sampler(torch.zeros(SIM_MAX_BS * self.block_size, SIM_HIDDEN), None)

    def _maybe_build_draft_sampler(self) -> Any:
        sglog.info(lines.DRAFT_HEAD_FOLDED)
        return _DflashDraftSampler(weight=self.lm_head.weight, block_size=self.block_size, num_org=SIM_VOCAB,
                                   org_vocab_start=0, max_bs=SIM_MAX_BS)

    def _greedy_sample_from_vocab_parallel_head(self, *, hidden_states: Any, lm_head: Any, chunk_size: int = 256) -> Any:
        import torch

        return torch.argmax(hidden_states @ lm_head.weight.T, dim=-1)

    def forward_batch_generation(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        """One prefill (extend) or one verify round for len(batch.commits) rows: the draft's block
        from the head, then DFlash's result (commit lengths with the bonus, the bonus tokens)."""
        import torch

        if batch.forward_mode.is_extend():
            return types.SimpleNamespace(accept_lens=None, next_draft_input=None)
        batch.forward_mode = ForwardMode("target_verify")   # as real 0.5.17 hands the batch back
        bs, width = len(batch.commits), self.block_size
        full = self.sharpness * torch.randn(bs * width, SIM_HIDDEN, generator=self._gen)
        hidden = full.view(bs, width, -1)[:, 1:, :].reshape(-1, SIM_HIDDEN)
        if self._draft_sampler is not None and bs <= SIM_MAX_BS:   # the graph replays the folded head
            self._draft_sampler(full, None)
            draft = self._draft_sampler.out[:bs * (width - 1)].clone()
        else:                                # eager head (no graph, or a batch beyond the graphs)
            draft = self._greedy_sample_from_vocab_parallel_head(hidden_states=hidden, lm_head=self.lm_head)
        chain = draft.view(bs, width - 1)
        roots = [int(r.output_ids[-1]) if r.output_ids else 0 for r in (batch.reqs or [])] or [0] * bs
        self._draft_block_tokens_buf = torch.cat([torch.tensor(roots, dtype=chain.dtype).view(bs, 1), chain], dim=1)
        commit = torch.tensor([max(1, min(int(c), width)) for c in batch.commits], dtype=torch.int32)
        bonus = []
        logits = (hidden @ self.lm_head.weight.T).view(bs, width - 1, -1)
        for b, c in enumerate(commit.tolist()):
            depth = c - 1                    # drafts accepted; the bonus sits at this depth
            if self.sharpness >= SIM_SHARPNESS and depth < width - 1 and self._rng.random() < 0.3:
                # the target's token is the draft's second choice there: a sibling the tree holds
                bonus.append(int(torch.topk(logits[b, depth], 2).indices[1]))
            else:
                bonus.append(self._rng.randrange(SIM_VOCAB))
        self.committed = [chain[b, :c - 1].tolist() + [bonus[b]] for b, c in enumerate(commit.tolist())]
        return types.SimpleNamespace(accept_lens=commit,
                                     next_draft_input=types.SimpleNamespace(bonus_tokens=torch.tensor(bonus)))


class ShadowRun:
    """The plugin's worker in the stand-in: built at the draft graph capture (or at the first
    forward without graphs), fed the prefill and every verify round of every request."""

    def __init__(self, mixin: type, block_size: int, capture_layers: Optional[list[int]]) -> None:
        import os

        cls = type("DDTreeShadowWorker", (mixin, SimDFlashWorker), {})
        flat = bool(os.environ.get("SGLANG_SIMULATE_ACC_LEN"))
        self.worker = cls(block_size, capture_layers, sharpness=SIM_FLAT if flat else SIM_SHARPNESS)
        self.request: Optional[SimRequest] = None

    def init_cuda_graphs(self) -> None:
        self.worker.init_cuda_graphs()

    def prefill(self, prompt_tokens: int = 8) -> None:
        self.request = SimRequest(prompt_tokens)
        self.request.output_ids.append(self.worker._rng.randrange(SIM_VOCAB))   # the prefill's token
        self.worker.forward_batch_generation(_Batch("extend", []))

    def rounds(self, commits: list[int]) -> None:
        req = self.request or SimRequest(8)
        for c in commits:
            self.worker.forward_batch_generation(_Batch("decode", [c], [req]))
            req.output_ids.extend(self.worker.committed[0])       # what the scheduler appends
        req.done = True
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
        return "".join(ln + "\n" for ln in text.splitlines() if "ddtree_" in ln and "_created" not in ln)


# ---------------------------------------------------------------- a metrics recorder (no prometheus_client)


class _Gauge:
    """prometheus_client.Gauge's constructor, labels() and set(), kept in memory."""

    registry: list["_Gauge"]
    kind = "gauge"
    suffix = ""

    def __init__(self, name: str, doc: str, labelnames: tuple[str, ...] | list[str] = (), **_kw: Any) -> None:
        self.name, self.doc, self.labelnames = name, doc, tuple(labelnames)
        self.values: dict[tuple[str, ...], float] = {} if self.labelnames else {(): 0.0}
        self.registry.append(self)

    def labels(self, *values: str, **kw: str) -> "_Child":
        key = tuple(values) if values else tuple(str(kw[n]) for n in self.labelnames)
        self.values.setdefault(key, 0.0)
        return _Child(self, key)

    def set(self, value: float) -> None:
        self.values[()] = float(value)

    def inc(self, amount: float = 1.0) -> None:
        self.values[()] = self.values.get((), 0.0) + float(amount)


class _Counter(_Gauge):
    """prometheus_client.Counter: exported as NAME_total, only ever increased."""

    kind = "counter"
    suffix = "_total"

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        super().inc(amount)


class _Child:
    def __init__(self, gauge: _Gauge, key: tuple[str, ...]) -> None:
        self.gauge, self.key = gauge, key

    def set(self, value: float) -> None:
        self.gauge.values[self.key] = float(value)

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0 and self.gauge.kind == "counter":
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.gauge.values[self.key] = self.gauge.values.get(self.key, 0.0) + float(amount)


class _Recorder(types.ModuleType):
    """Stands for the `prometheus_client` module where it is not installed (the lab's venv)."""

    def __init__(self) -> None:
        super().__init__("prometheus_client", "ddtree-ops LAB STAND-IN: metrics in Prometheus text format")
        self.gauges: list[_Gauge] = []
        self.Gauge = type("Gauge", (_Gauge,), {"registry": self.gauges})
        self.Counter = type("Counter", (_Counter,), {"registry": self.gauges})

    def render(self) -> str:
        out = []
        for g in self.gauges:
            out += [f"# HELP {g.name}{g.suffix} {g.doc}", f"# TYPE {g.name}{g.suffix} {g.kind}"]
            for key, value in sorted(g.values.items()):
                labels = ",".join(f'{n}="{v}"' for n, v in zip(g.labelnames, key))
                out.append(f"{g.name}{g.suffix}{{{labels}}} {value!r}" if labels else f"{g.name}{g.suffix} {value!r}")
        return "".join(ln + "\n" for ln in out)


def _recorder_module() -> _Recorder:
    return _Recorder()
