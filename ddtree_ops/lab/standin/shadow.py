"""The ddtree plugin's worker, run for real on a simulated DFlash worker: shadow accounting or tree serving.

When DDTREE is registered by the ddtree plugin (its worker factory is the plugin's), real SGLang
builds the plugin's worker: SGLang's `DFlashWorkerV2` with the plugin's `ShadowWorkerMixin` (or, under
DDTREE_MODE=tree, its `TreeWorkerMixin`) in front. The stand-in builds the same composition: the
plugin's own mixin (imported from the installed engine wheel) in front of `SimDFlashWorker`, which has
the shape of the DFlashWorkerV2 methods the mixins wrap (0.5.17: `_maybe_build_draft_sampler`,
`_greedy_sample_from_vocab_parallel_head`, `forward_batch_generation`). Its draft sampler has the
shape of DFlash's `_DflashDraftSampler` (the plugin folds its top-K into it, as on a GPU), and a
"graph replay" calls it as SGLang's captured graph runs it. Requests are `SimRequest`s whose
`output_ids` grow by what each round commits, as SGLang's scheduler fills them; a /generate's prompts
are one batch, verified together round by round. The draft's distributions, the target's choices and
the verify forwards' cost are simulated (`treesim`: a calibrated draft against a truth tape, a
roofline of the simulated card); the tree rounds go through the tree verify backend the stand-in
declares (`treesim.SimTreeVerify`). So every `DDTREE ...` line, when it is printed and what it says,
and the /metrics counters and gauges, come from the plugin's code, fed with simulated rounds whose
chain acceptance is the stand-in's per-request acceptance.

Under `SGLANG_SIMULATE_ACC_LEN` (the real runs' knob for random weights) the draft is flat, as a
random-weight model's is on the H200: the chain's forced tokens are the draft's own and the tree gains
nothing past them, the real runs' verdict that the stand-in's plugin reaches too.

Without the plugin (not installed, or torch missing for its accounting) nothing of this runs: the
stand-in serves as SGLang's DFlash worker alone.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Optional

from . import lines, sglog
from .treesim import SIM_VOCAB, VerifyCost, World, commit_to_tape

PLUGIN_FACTORY = ("ddtree_ops.engine.sglang_plugin", "worker_factory")
SIM_MAX_BS = 8       # the largest captured draft graph (h200.yaml: cuda_graph_max_bs 8)


def is_plugin_worker(algo: Any) -> bool:
    """Whether the registered algorithm's worker is the ddtree plugin's (whatever its spec class)."""
    factory = getattr(algo, "factory", None)
    return (getattr(factory, "__module__", None), getattr(factory, "__name__", None)) == PLUGIN_FACTORY


def plugin_mixin() -> tuple[Optional[type], str]:
    """(the plugin's worker mixin for its DDTREE_MODE, "") from the installed plugin, or (None, why not)."""
    if importlib.util.find_spec("torch") is None:
        return None, "torch is not installed"
    try:
        if "prometheus_client" not in sys.modules and importlib.util.find_spec("prometheus_client") is None:
            # the lab venv has no prometheus_client (SGLang depends on it): the plugin's gauges are
            # kept by a text-format recorder of the same interface
            sys.modules.setdefault("prometheus_client", _recorder_module())
        # the ddtree plugin where it is installed: a lab host has it only after a ddtree deploy
        from ddtree_ops.engine.sglang_settings import read_settings
        from ddtree_ops.engine.sglang_shadow import ShadowWorkerMixin

        if read_settings()[0].mode == "tree":
            # the same wheel's tree worker: older plugins have none, and say so by failing here
            from ddtree_ops.engine.sglang_tree import TreeWorkerMixin

            return TreeWorkerMixin, ""
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
    """SGLang's Req as the plugin reads it: the prompt, the committed outputs, greedy params; and the
    simulated target's truth tape (`treesim.World`)."""

    def __init__(self, prompt_len: int, greedy: bool = True) -> None:
        self.origin_input_ids = [0] * max(1, prompt_len)
        self.output_ids: list[int] = []
        # SGLang normalises temperature 0 to top_k 1; a sampled request keeps its top_k -1
        self.sampling_params = types.SimpleNamespace(top_k=1 if greedy else -1, temperature=1.0 if greedy else 0.7)
        self.done = False
        self.tape: dict[int, int] = {}

    def finished(self) -> bool:
        return self.done

    @property
    def root_pos(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids) - 1


class _Batch:
    def __init__(self, mode: str, commits: list[int], reqs: Optional[list[SimRequest]] = None) -> None:
        import torch

        self.forward_mode, self.is_extend_in_batch, self.commits = ForwardMode(mode), mode == "extend", commits
        self.reqs = reqs
        self.seq_lens = torch.tensor([r.root_pos for r in reqs]) if reqs else None


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


@dataclass
class Row:
    """One row of a simulated round: its request, root, the target's truth, the chain DFlash drafted."""

    req: SimRequest
    root: int
    root_pos: int
    truth: list[int]
    chain: list[int] = field(default_factory=list)


class SimDFlashWorker:
    """DFlashWorkerV2's shape where the mixins hook in; the target's runner carries the capture
    layers (`spec_aux_config.dflash_target_layer_ids`) as SGLang's does. The head is the identity
    over a small vocabulary, so a draft position's hidden state is its logits (`treesim.World`)."""

    def __init__(self, block_size: int, capture_layers: Optional[list[int]], seed: int = 0, flat: bool = False,
                 cost: Optional[VerifyCost] = None, faults: frozenset[str] = frozenset()) -> None:
        import torch

        # the simulated tensors are tiny: worker threads only contend (35x slower on a busy 2-core box)
        torch.set_num_threads(1)
        self.block_size = int(block_size)
        self.world = World(seed, flat=flat)
        self.cost, self.faults = cost, faults
        aux = types.SimpleNamespace(dflash_target_layer_ids=capture_layers)
        self.model_runner = types.SimpleNamespace(spec_aux_config=aux,
                                                  model_config=types.SimpleNamespace(vocab_size=SIM_VOCAB))
        self.lm_head = types.SimpleNamespace(weight=torch.eye(SIM_VOCAB))
        self._draft_sampler: Any = None
        self._draft_block_tokens_buf: Any = None
        self.committed: list[list[int]] = []     # per row of the last round: what the scheduler appends
        self.round_rows: list[Row] = []
        self.last_seconds: Optional[float] = None
        self.sim_seconds = 0.0                   # every verify forward's simulated time, summed
        super().__init__()

    # ---- DFlashWorkerV2.init_cuda_graphs: the sampler is built before the draft graph capture,
    # and SGLang's capture warms it up (here: once, at the largest size)
    def init_cuda_graphs(self) -> None:
        import torch

        self._draft_sampler = self._maybe_build_draft_sampler()
        if self._draft_sampler is not None:
            self._draft_sampler(torch.zeros(SIM_MAX_BS * self.block_size, SIM_VOCAB), None)

    def _maybe_build_draft_sampler(self) -> Any:
        sglog.info(lines.DRAFT_HEAD_FOLDED)
        return _DflashDraftSampler(weight=self.lm_head.weight, block_size=self.block_size, num_org=SIM_VOCAB,
                                   org_vocab_start=0, max_bs=SIM_MAX_BS)

    def _greedy_sample_from_vocab_parallel_head(self, *, hidden_states: Any, lm_head: Any, chunk_size: int = 256) -> Any:
        import torch

        return torch.argmax(hidden_states @ lm_head.weight.T, dim=-1)

    # ---- the simulation's side (treesim.SimTreeVerify calls these)
    def sim_cost(self, tokens: int) -> Optional[float]:
        return self.cost(tokens) if self.cost is not None else None

    def sim_draft(self, batch: Any) -> list[Row]:
        """The round's draft for every row: the world's distributions as the draft's hidden states, run
        through DFlash's head (the graph replay of the folded sampler, or the eager head)."""
        import torch

        reqs = batch.reqs or []
        bs, width = len(reqs), self.block_size
        rows, hidden = [], torch.zeros(bs, width, SIM_VOCAB)
        for b, req in enumerate(reqs):
            commit = max(1, min(int(batch.commits[b]), width)) if batch.commits else None
            logits, truth = self.world.draft_row(req.tape, req.root_pos, width - 1, commit)
            hidden[b, 1:] = torch.tensor(logits)
            root = int(req.output_ids[-1]) if req.output_ids else 0
            rows.append(Row(req, root, req.root_pos, truth))
        full = hidden.view(bs * width, SIM_VOCAB)
        if self._draft_sampler is not None and bs <= SIM_MAX_BS:   # the graph replays the folded head
            self._draft_sampler(full, None)
            draft = self._draft_sampler.out[:bs * (width - 1)].clone()
        else:                                # eager head (no graph, or a batch beyond the graphs)
            h = hidden[:, 1:, :].reshape(-1, SIM_VOCAB)
            draft = self._greedy_sample_from_vocab_parallel_head(hidden_states=h, lm_head=self.lm_head)
        chains = draft.view(bs, width - 1).tolist()
        for row, chain in zip(rows, chains):
            row.chain = chain
        self.round_rows = rows
        self.committed = [[] for _ in rows]
        return rows

    def sim_commit(self, row: Row, committed: list[int]) -> None:
        """A tree round committed these tokens for the row (the scheduler appends them)."""
        commit_to_tape(row.req.tape, row.root_pos, committed)
        self.committed[next(i for i, r in enumerate(self.round_rows) if r is row)] = committed

    def forward_batch_generation(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        """DFlash's own round: one prefill (extend), or one verify of the chain for every row, its
        acceptance the stand-in's (`batch.commits`): the drafts up to it, then the target's token."""
        import torch

        if batch.forward_mode.is_extend():
            return types.SimpleNamespace(accept_lens=None, next_draft_input=None)
        batch.forward_mode = ForwardMode("target_verify")   # as real 0.5.17 hands the batch back
        rows = self.sim_draft(batch)
        width = self.block_size
        commits, bonuses, committed = [], [], []
        for row, c in zip(rows, batch.commits):
            c = max(1, min(int(c), width))
            # under random weights (flat) SGLang forces the drafts' acceptance: the chain's own tokens
            done = row.chain[:c - 1] + [row.truth[c - 1]]
            commit_to_tape(row.req.tape, row.root_pos, done)
            commits.append(c)
            bonuses.append(done[-1])
            committed.append(done)
        self.committed = committed
        roots = [row.root for row in rows]
        self._draft_block_tokens_buf = torch.cat([torch.tensor(roots, dtype=torch.int64).view(-1, 1),
                                                  torch.tensor([row.chain for row in rows], dtype=torch.int64)], dim=1)
        self.last_seconds = self.sim_cost(len(rows) * width)
        self.sim_seconds += self.last_seconds or 0.0
        return types.SimpleNamespace(accept_lens=torch.tensor(commits, dtype=torch.int32),
                                     next_draft_input=types.SimpleNamespace(bonus_tokens=torch.tensor(bonuses)))


@dataclass
class Job:
    """One prompt of a /generate: its length, the tokens to produce, the chain's acceptance per round."""

    prompt_tokens: int
    completion: int
    chain: list[int]
    greedy: bool = True


class ShadowRun:
    """The plugin's worker in the stand-in: built at the draft graph capture (or at the first
    forward without graphs), fed the prefill and every verify round of every batch of requests."""

    def __init__(self, mixin: type, block_size: int, capture_layers: Optional[list[int]], *,
                 card: Any = None, weight_bytes: int = 0, faults: frozenset[str] = frozenset()) -> None:
        self.tree = mixin.__name__ == "TreeWorkerMixin"
        name = "DDTreeTreeWorker" if self.tree else "DDTreeShadowWorker"
        cls = type(name, (mixin, SimDFlashWorker), {})
        flat = bool(os.environ.get("SGLANG_SIMULATE_ACC_LEN"))
        cost = VerifyCost(card.name, card.compute_cap, weight_bytes) if card is not None else None
        self.worker = cls(block_size, capture_layers, flat=flat, cost=cost, faults=frozenset(faults))

    def init_cuda_graphs(self) -> None:
        self.worker.init_cuda_graphs()

    def prefill(self, prompt_tokens: int = 8) -> None:
        req = SimRequest(prompt_tokens)
        req.output_ids.append(self.worker.world.rng.randrange(SIM_VOCAB))   # the prefill's token
        self.worker.forward_batch_generation(_Batch("extend", [], [req]))

    def serve(self, jobs: list[Job]) -> tuple[list[list[int]], float]:
        """Every job's rounds, batched as SGLang batches a request's prompts: per job the tokens each
        round committed (the chain's in shadow mode, the tree's in tree mode), and the simulated
        seconds the verify forwards took."""
        w = self.worker
        reqs = [SimRequest(j.prompt_tokens, j.greedy) for j in jobs]
        for r in reqs:
            r.output_ids.append(w.world.rng.randrange(SIM_VOCAB))          # the prefill's token
        w.forward_batch_generation(_Batch("extend", [], reqs))
        steps: list[list[int]] = [[] for _ in jobs]
        t0 = w.sim_seconds
        k = 0
        while True:
            live = [i for i, j in enumerate(jobs) if not reqs[i].done]
            if not live:
                break
            commits = [jobs[i].chain[min(k, len(jobs[i].chain) - 1)] if not self.tree
                       else jobs[i].chain[k % len(jobs[i].chain)] for i in live]
            w.forward_batch_generation(_Batch("decode", commits, [reqs[i] for i in live]))
            for n, i in enumerate(live):
                done = w.committed[n]
                left = jobs[i].completion - sum(steps[i])
                got = min(len(done), left)
                reqs[i].output_ids.extend(done)
                steps[i].append(got)
                if (not self.tree and len(steps[i]) >= len(jobs[i].chain)) or sum(steps[i]) >= jobs[i].completion:
                    reqs[i].done = True
            k += 1
        if not self.tree:
            state = w.__dict__.get("_ddtree_state")
            if state is not None:     # a request's last round is accounted before its answer returns
                state.drain(wait=True)

        return steps, w.sim_seconds - t0

    def rounds(self, commits: list[int]) -> None:
        """One request of the chain's `commits` (shadow mode)."""
        self.serve([Job(8, sum(commits), commits)])

    def metrics_text(self) -> str:
        """The plugin's counters and gauges in Prometheus text format, as SGLang's /metrics carries them."""
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
