"""The scenarios run on real SGLang, as data: which profile mode, which `--set` overrides, which
environment, what the run does with the server, and the `diagnose` label its log should get.

Models are configs and a tokenizer only (SGLang's `--load-format dummy` makes random weights):
`tiny-qwen3` (4 layers, hidden 256) for serving, and the shapes of Qwen3-1.7B, Qwen3-8B and
Qwen3-32B for the memory table. With random weights a draft never matches its target, so the serving scenarios use
SGLang's own benchmark knob `SGLANG_SIMULATE_ACC_LEN` (real draft tokens are committed up to the
forced length): acceptance is then above 1 and the smoke check and shadow accounting see
realistic rounds, in every arm alike.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODELS = "/tmp/rs/models"
SIMULATE = {"SGLANG_SIMULATE_ACC_LEN": "3", "SGLANG_SIMULATE_ACC_TOKEN_MODE": "real-draft-token"}
# the hooks' decisions for the first verify rounds, in the log of every DDTREE arm
TRACE = {"DDTREE_SHADOW_TRACE": "6"}
# Servers of one group share the GPU. SGLang sizes its KV pool as (free memory after the weights)
# - total x (1 - mem_fraction_static), so a server that starts after another has taken its pool
# sees less free memory and, past the third, none at all (the first run lost two arms to
# "Loaded weights leave no GPU memory for the KV cache"). A cap keeps every pool small.
SHARED_GPU_CAP = ("--max-total-tokens", "32768")


@dataclass(frozen=True)
class Scenario:
    name: str
    about: str
    mode: str
    label: str                          # what `diagnose --log` should name the log
    sets: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    tax_arm: str = ""                   # an arm of the shadow-tax measurement
    extra_requests: int = 0             # batches of 8 x 64 tokens after the smoke check
    kill_in_stay: float = 0.0           # SIGKILL the scheduler this long into the stay window
    cli_smoke: bool = False             # also run `ddtree-ops smoke h200 --json` against it
    plain: bool = False                 # memory probes: the rendered argv without its --speculative-* flags
    refuse_key: str = ""                # refusals: the profile key preflight's refusal must name
    args: tuple[str, ...] = ()          # flags the profile does not model, appended (tree.py's lossless set)


def _8b(mfs: float, model: str = "qwen3-8b") -> tuple[str, ...]:
    return (f"service.model_path={MODELS}/{model}", f"modes.dflash.draft_model_path={MODELS}/{model}-dflash",
            "modes.dflash.block_size=16", f"memory.mem_fraction_static={mfs}", "memory.cuda_graph=false")


# `serve`'s tax arms measure tiny-qwen3 side by side: a check that the arms serve and account, not
# the tax (docs/realsglang.md: idle servers spinning, a host-bound model); tax.py measures that.
GROUPS: dict[str, list[Scenario]] = {
    "serve": [
        Scenario("dflash", "DFLASH, the in-graph draft head", "dflash", "healthy", env=SIMULATE, tax_arm="dflash"),
        Scenario("dflash_eager", "DFLASH with the draft head kept eager (SGLANG_DFLASH_EAGER_DRAFT_SAMPLER=1), "
                 "as DDTREE shadow kept it before issue 22", "dflash", "healthy",
                 env={**SIMULATE, "SGLANG_DFLASH_EAGER_DRAFT_SAMPLER": "1"}, tax_arm="dflash-eager-head"),
        # issue 14: the single-GPU path of the multi-GPU code, rendered through the parallel and gpus
        # fields (--tp-size 1, CUDA_VISIBLE_DEVICES=0); real TP=2 needs a machine with several GPUs
        Scenario("dflash_tp1", "DFLASH rendered through parallel.tp_size=1 and gpus=[0]", "dflash", "healthy",
                 sets=("parallel.tp_size=1", "gpus=[0]"), env=SIMULATE),
        Scenario("ddtree_s025", "DDTREE shadow through the ddtree plugin, share 0.25", "ddtree-shadow", "healthy",
                 sets=("modes.ddtree-shadow.shadow.share=0.25",), env={**SIMULATE, **TRACE}, tax_arm="ddtree-share-0.25",
                 cli_smoke=True),
        # hooks on every round, the draft head left in the graph, nothing sampled: separates the
        # plugin's per-round cost from the accounting's (run 5: batch-1 tax the same at 0.25 and 1.0)
        Scenario("ddtree_s000", "DDTREE through the ddtree plugin, share 0 (no round sampled)", "ddtree-shadow",
                 "healthy", sets=("modes.ddtree-shadow.shadow.share=0.0",),
                 env={**SIMULATE, "DDTREE_SHADOW_WARN_AFTER": "1000000"}, tax_arm="ddtree-share-0"),
        Scenario("ddtree_s100", "DDTREE shadow through the ddtree plugin, share 1.0", "ddtree-shadow", "healthy",
                 sets=("modes.ddtree-shadow.shadow.share=1.0",), env={**SIMULATE, **TRACE}, tax_arm="ddtree-share-1.0"),
    ],
    "failures": [
        Scenario("layers_last", "DFLASH draft whose target_layer_ids [1, 3] include the target's last layer",
                 "dflash", "spec_decode_misconfig", sets=(f"modes.dflash.draft_model_path={MODELS}/tiny-qwen3-dflash-last",)),
        Scenario("kv_too_small", "Qwen3-8B shape at mem_fraction_static 0.08: weights exceed the static budget",
                 "dflash", "kv_pool_too_small", sets=_8b(0.08)),
        Scenario("ddtree_share0", "DDTREE shadow with DDTREE_SHADOW_SHARE=0: nothing is accounted",
                 "ddtree-shadow", "shadow_accounting_off",
                 sets=("modes.ddtree-shadow.shadow.share=0.0",), env={**SIMULATE, **TRACE, "DDTREE_SHADOW_WARN_AFTER": "40"},
                 extra_requests=3),
        # SGLang reports a SIGKILLed scheduler as "crashed with exit code -9"; nothing in the log
        # says who sent it (here the runner did), so it is killed_by_signal, not host_oom (issue 20)
        Scenario("crash_after_ready", "DFLASH; the scheduler process is SIGKILLed 2 s into the stay window",
                 "dflash", "killed_by_signal", sets=("gate.stay_healthy_s=15",), env=SIMULATE, kill_in_stay=2.0),
        # issue 20: the operator's mistakes the first H200 session met, to capture as real logs
        # (tests/diagnose/fixtures/synthetic-bad_launch_flags-* are made up from 0.5.17's source until then)
        Scenario("gpus_absent", "gpus: [1] on a one-card host: CUDA_VISIBLE_DEVICES names no card",
                 "dflash", "bad_launch_flags", sets=("gpus=[1]",)),
        Scenario("tp2_one_card", "parallel.tp_size 2 with gpus [0, 1] on a one-card host: rank 1 has no card",
                 "dflash", "bad_launch_flags", sets=("parallel.tp_size=2", "gpus=[0, 1]")),
        Scenario("context_past_max", "memory.context_length 65536, past the tiny model's own maximum",
                 "dflash", "bad_launch_flags", sets=("memory.context_length=65536",)),
    ],
    # Issue 21: every row of the memory table from a probe whose raw output is committed
    # (bench/results/memory_probes/). One start each (SGLang sizes the pool from the memory free
    # at its own start), stopped once the pools are allocated; the new coverage first, then the
    # two run-4 probes whose logs were not kept (same settings). Run 4's mem_1p7b_30 is committed
    # with its log and is not run again.
    "memory": [
        Scenario("mem_1p7b_90_plain", "memory probe: Qwen3-1.7B shape, no draft, mfs 0.9", "dflash", "healthy",
                 sets=_8b(0.9, "qwen3-1.7b"), plain=True),
        Scenario("mem_32b_80", "memory probe: Qwen3-32B shape + 5-layer DFlash draft, mfs 0.8", "dflash", "healthy",
                 sets=_8b(0.8, "qwen3-32b")),
        Scenario("mem_8b_70_plain", "memory probe: Qwen3-8B shape, no draft, mfs 0.7", "dflash", "healthy",
                 sets=_8b(0.7), plain=True),
        Scenario("mem_8b_85", "memory probe: Qwen3-8B shape + 5-layer DFlash draft, mfs 0.85", "dflash", "healthy",
                 sets=_8b(0.85)),
        Scenario("mem_1p7b_60", "memory probe: Qwen3-1.7B shape + 2-layer DFlash draft, mfs 0.6", "dflash",
                 "healthy", sets=_8b(0.6, "qwen3-1.7b")),
    ],
    # Not run by default (name it): settings preflight refuses, started anyway with the same rendered
    # argv to record what real SGLang does with them (for diagnose). All three at once, each stopped
    # when it dies or after REFUSAL_WAIT_S. Labels are left to a person reading the logs, except the
    # context length, which 0.5.17 refuses while resolving its server args.
    "refusals": [
        Scenario("refuse_gpus1", "gpus [1] on the one-card H200 (CUDA_VISIBLE_DEVICES=1)", "dflash", "",
                 sets=("gpus=[1]",), refuse_key="gpus"),
        Scenario("refuse_tp2", "parallel.tp_size 2 with gpus [0, 1] on the one-card H200", "dflash", "",
                 sets=("parallel.tp_size=2", "gpus=[0, 1]"), refuse_key="gpus"),
        Scenario("refuse_context", "memory.context_length 50000 past tiny-qwen3's 4096 (no override in service.env)",
                 "dflash", "bad_launch_flags", sets=("memory.context_length=50000",),
                 refuse_key="memory.context_length"),
    ],
}
REFUSAL_WAIT_S = 90.0


def _qwen3(tiny: dict[str, Any], *, hidden: int, inter: int, layers: int, heads: int, kv: int, tie: bool) -> dict[str, Any]:
    cfg = copy.deepcopy(tiny)
    cfg.update(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
               num_key_value_heads=kv, head_dim=128, vocab_size=151936, tie_word_embeddings=tie,
               max_position_embeddings=40960, max_window_layers=layers, layer_types=["full_attention"] * layers)
    return cfg


def _draft(target: dict[str, Any], tiny_draft: dict[str, Any], *, layers: int, ids: list[int], block: int) -> dict[str, Any]:
    cfg = copy.deepcopy(tiny_draft)
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "vocab_size", "max_position_embeddings"):
        cfg[key] = target[key]
    cfg.update(num_hidden_layers=layers, layer_types=["full_attention"] * layers, block_size=block,
               num_target_layers=target["num_hidden_layers"])
    cfg["dflash_config"] = {"mask_token_id": 3, "target_layer_ids": ids}
    return cfg


def model_configs() -> dict[str, dict[str, Any]]:
    """Directory name -> files (config.json and, for the 8B shape, the real checkpoint's index,
    whose total_size preflight reads)."""
    tiny = json.loads((HERE / "models" / "tiny-qwen3" / "config.json").read_text())
    tiny_draft = json.loads((HERE / "models" / "tiny-qwen3-dflash" / "config.json").read_text())
    last = copy.deepcopy(tiny_draft)
    last["dflash_config"]["target_layer_ids"] = [1, 3]
    q8 = _qwen3(tiny, hidden=4096, inter=12288, layers=36, heads=32, kv=8, tie=False)
    q17 = _qwen3(tiny, hidden=2048, inter=6144, layers=28, heads=16, kv=8, tie=True)
    q32 = _qwen3(tiny, hidden=5120, inter=25600, layers=64, heads=64, kv=8, tie=False)
    index = (HERE.parents[1] / "ddtree_ops" / "lab" / "fixtures" / "Qwen3-8B" / "model.safetensors.index.json").read_text()
    return {
        "tiny-qwen3": {"config.json": tiny},
        "tiny-qwen3-dflash": {"config.json": tiny_draft},
        "tiny-qwen3-dflash-last": {"config.json": last},
        "qwen3-8b": {"config.json": q8, "model.safetensors.index.json": index},
        "qwen3-8b-dflash": {"config.json": _draft(q8, tiny_draft, layers=5, ids=[1, 9, 17, 25, 33], block=16)},
        "qwen3-1.7b": {"config.json": q17},
        "qwen3-1.7b-dflash": {"config.json": _draft(q17, tiny_draft, layers=2, ids=[1, 13, 25], block=16)},
        # ids: SGLang's default formula for 5 draft layers on 64 (dflash_utils.build_target_layer_ids)
        "qwen3-32b": {"config.json": q32},
        "qwen3-32b-dflash": {"config.json": _draft(q32, tiny_draft, layers=5, ids=[1, 16, 31, 46, 61], block=16)},
    }


# ------------------------------------------------------------------ issue 22: the shadow tax (tax.py)
# Five servers of the Qwen3-8B shape (random weights) on the one GPU, CUDA graphs on, each with
# --sleep-on-idle (an idle 0.5.17 scheduler busy-polls a core: the co-located arms disturbed each
# other), a KV cap, and SGLang's acceptance knob in every arm. A DFLASH twin is the A/A control.
TAX_EXTRA = ("--max-total-tokens", "16384", "--sleep-on-idle")


def _tax_sets(mode: str) -> tuple[str, ...]:
    return (f"service.model_path={MODELS}/qwen3-8b", f"modes.{mode}.draft_model_path={MODELS}/qwen3-8b-dflash",
            f"modes.{mode}.block_size=16", "memory.mem_fraction_static=0.88", "memory.cuda_graph=true",
            "memory.cuda_graph_max_bs=8")


def tax_scenarios() -> list[Scenario]:
    quiet = {"DDTREE_SHADOW_WARN_AFTER": "1000000"}
    ddtree = lambda name, share, about, env: Scenario(  # noqa: E731
        name, about, "ddtree-shadow", "healthy",
        sets=(*_tax_sets("ddtree-shadow"), "modes.ddtree-shadow.budget=16", f"modes.ddtree-shadow.shadow.share={share}"),
        env={**SIMULATE, **env}, tax_arm=name)
    return [
        Scenario("dflash", "DFLASH, Qwen3-8B shape", "dflash", "healthy", sets=_tax_sets("dflash"), env=SIMULATE,
                 tax_arm="dflash"),
        Scenario("dflash_twin", "DFLASH again: the A/A control", "dflash", "healthy", sets=_tax_sets("dflash"),
                 env=SIMULATE, tax_arm="dflash_twin"),
        ddtree("ddtree_s000", 0.0, "DDTREE, share 0: hooks on, nothing sampled", quiet),
        ddtree("ddtree_s025", 0.25, "DDTREE shadow, share 0.25", {}),
        ddtree("ddtree_s100", 1.0, "DDTREE shadow, share 1.0", {}),
        # issue 22 item 4, not in the default set: the accounting on a thread of its own
        ddtree("ddtree_s100_thread", 1.0, "DDTREE shadow, share 1.0, accounting on its own thread",
               {"DDTREE_SHADOW_ACCOUNT_THREAD": "1"}),
    ]


TAX_DEFAULT = ("dflash", "dflash_twin", "ddtree_s000", "ddtree_s025", "ddtree_s100")


# ------------------------------------------------------------------ issue 23: the shadow's verdict (truth.py)
# A trained target and its DFlash draft (bench/pair/train.py --out DIR), served for real: no
# acceptance knob, trained weights (no --load-format dummy outside the stand-in).


def truth_scenarios(pair: str, block: int, budget: int, cost_env: dict[str, str],
                    context: int = 2048) -> list[Scenario]:
    """DFLASH and DDTREE shadow at shares 0.25 and 1.0, greedy; DFLASH and DDTREE at 1.0 with
    temperature (the request decides: each server gets one kind, so its own counters are clean).
    `context`: the server's context length, at most what the trained target was made for."""
    def sets(mode: str) -> tuple[str, ...]:
        return (f"service.model_path={pair}/target", f"modes.{mode}.draft_model_path={pair}/draft",
                f"modes.{mode}.block_size={block}", "memory.mem_fraction_static=0.88", "memory.cuda_graph=true",
                "memory.cuda_graph_max_bs=8", f"memory.context_length={context}")

    def ddtree(name: str, share: float, about: str) -> Scenario:
        return Scenario(name, about, "ddtree-shadow", "healthy",
                        sets=(*sets("ddtree-shadow"), f"modes.ddtree-shadow.budget={budget}",
                              f"modes.ddtree-shadow.shadow.share={share}", "modes.ddtree-shadow.shadow.report_every=50"),
                        env={**cost_env, "DDTREE_SHADOW_WARN_AFTER": "1000000"})

    return [
        Scenario("dflash", "DFLASH on the trained pair, greedy", "dflash", "healthy", sets=sets("dflash")),
        ddtree("ddtree_s025", 0.25, "DDTREE shadow on the trained pair, share 0.25, greedy"),
        ddtree("ddtree_s100", 1.0, "DDTREE shadow on the trained pair, share 1.0, greedy"),
        ddtree("ddtree_s100_long", 1.0, "DDTREE shadow on the trained pair, share 1.0, greedy, long requests"),
        Scenario("dflash_temp", "DFLASH on the trained pair, temperature", "dflash", "healthy", sets=sets("dflash")),
        ddtree("ddtree_s100_temp", 1.0, "DDTREE shadow on the trained pair, share 1.0, temperature"),
    ]


# The lossless set: float16 activations and float32 logits (`--enable-fp32-lm-head`). In bfloat16 the
# logits of this weak pair tie exactly (one bfloat16 step is 1/32 at |logit| 4-8), and which of two
# equal logits a kernel's argmax returns is not decided by the model (run 1 of issue 33: every
# divergence of the target, DFLASH and the tree was at a top-2 gap of 0 or one step); float32 activations
# are refused by sgl-kernel's rmsnorm in 0.5.17 ("failed to dispatch data type Float", the same run).
FP16 = ("memory.dtype=float16",)
FP32_LOGITS = ("--enable-fp32-lm-head",)


def tree_scenarios(pair: str, block: int, budget: int, context: int = 2048, report_every: int = 50,
                   chain_share: float = 0.05) -> list[Scenario]:
    """Issue 33 on a trained pair: the target alone, DFLASH and DDTREE tree serving in float16 with
    float32 logits (the lossless set), and the same three plus a DFLASH twin (the A/A control) and
    DDTREE shadow at share 1.0 in the pair's bfloat16 (the speed arms, and a second lossless set as served)."""
    def sets(mode: str) -> tuple[str, ...]:
        return (f"service.model_path={pair}/target", f"modes.{mode}.draft_model_path={pair}/draft",
                f"modes.{mode}.block_size={block}", "memory.mem_fraction_static=0.85", "memory.cuda_graph=true",
                "memory.cuda_graph_max_bs=32", "memory.max_running_requests=32", f"memory.context_length={context}")

    shadow = (*sets("ddtree-shadow"), f"modes.ddtree-shadow.budget={budget}", "modes.ddtree-shadow.shadow.share=1.0",
              f"modes.ddtree-shadow.shadow.report_every={report_every}")
    tree = (*shadow, f"modes.ddtree.tree.chain_share={chain_share}", f"modes.ddtree.tree.report_every={report_every}")
    quiet = {"DDTREE_SHADOW_WARN_AFTER": "1000000"}

    def target(name: str, extra: tuple[str, ...], args: tuple[str, ...], about: str) -> Scenario:
        return Scenario(name, about, "dflash", "healthy", sets=(*sets("dflash"), *extra), plain=True, args=args)

    return [
        target("target16", FP16, FP32_LOGITS, "the target alone (no speculation), float16, float32 logits: the reference"),
        Scenario("dflash16", "DFLASH on the pair, float16, float32 logits", "dflash", "healthy",
                 sets=(*sets("dflash"), *FP16), args=FP32_LOGITS),
        Scenario("tree16", "DDTREE tree serving on the pair, float16, float32 logits", "ddtree", "healthy",
                 sets=(*tree, *FP16), env=quiet, args=FP32_LOGITS),
        target("target", (), (), "the target alone (no speculation), bfloat16"),
        Scenario("dflash", "DFLASH on the pair (speed arm)", "dflash", "healthy", sets=sets("dflash")),
        Scenario("dflash_twin", "DFLASH on the pair, a second server (the A/A control)", "dflash", "healthy",
                 sets=sets("dflash")),
        Scenario("ddtree_shadow", "DDTREE shadow at share 1.0 on the pair (speed arm, the prediction)", "ddtree-shadow",
                 "healthy", sets=shadow, env=quiet),
        Scenario("ddtree_tree", "DDTREE tree serving on the pair (speed arm)", "ddtree", "healthy", sets=tree,
                 env=quiet),
    ]
