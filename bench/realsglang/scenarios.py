"""The scenarios run on real SGLang, as data: which profile mode, which `--set` overrides, which
environment, what the run does with the server, and the `diagnose` label its log should get.

Models are configs and a tokenizer only (SGLang's `--load-format dummy` makes random weights):
`tiny-qwen3` (4 layers, hidden 256) for serving, and the shapes of Qwen3-8B and Qwen3-1.7B for the
memory table. With random weights a draft never matches its target, so the serving scenarios use
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


def _8b(mfs: float, model: str = "qwen3-8b") -> tuple[str, ...]:
    return (f"service.model_path={MODELS}/{model}", f"modes.dflash.draft_model_path={MODELS}/{model}-dflash",
            "modes.dflash.block_size=16", f"memory.mem_fraction_static={mfs}", "memory.cuda_graph=false")


GROUPS: dict[str, list[Scenario]] = {
    "serve": [
        Scenario("dflash", "DFLASH, the in-graph draft head", "dflash", "healthy", env=SIMULATE, tax_arm="dflash"),
        Scenario("dflash_eager", "DFLASH with the draft head kept eager (SGLANG_DFLASH_EAGER_DRAFT_SAMPLER=1), "
                 "as DDTREE shadow keeps it", "dflash", "healthy",
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
    "memory": [
        *[Scenario(f"mem_8b_{int(m * 100)}", f"memory probe: Qwen3-8B shape + 5-layer DFlash draft, mfs {m}",
                   "dflash", "healthy", sets=_8b(m)) for m in (0.5, 0.7, 0.85)],
        *[Scenario(f"mem_1p7b_{int(m * 100)}", f"memory probe: Qwen3-1.7B shape + 2-layer DFlash draft, mfs {m}",
                   "dflash", "healthy", sets=_8b(m, "qwen3-1.7b")) for m in (0.3, 0.6, 0.9)],
    ],
}


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
    index = (HERE.parents[1] / "ddtree_ops" / "lab" / "fixtures" / "Qwen3-8B" / "model.safetensors.index.json").read_text()
    return {
        "tiny-qwen3": {"config.json": tiny},
        "tiny-qwen3-dflash": {"config.json": tiny_draft},
        "tiny-qwen3-dflash-last": {"config.json": last},
        "qwen3-8b": {"config.json": q8, "model.safetensors.index.json": index},
        "qwen3-8b-dflash": {"config.json": _draft(q8, tiny_draft, layers=5, ids=[1, 9, 17, 25, 33], block=16)},
        "qwen3-1.7b": {"config.json": q17},
        "qwen3-1.7b-dflash": {"config.json": _draft(q17, tiny_draft, layers=2, ids=[1, 13, 25], block=16)},
    }
