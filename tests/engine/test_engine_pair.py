"""A trained pair, made in the test by the same script as the H200's (bench/pair/train.py, scale
`test`: a 4 x 64 Qwen3 and a 1-layer DFlash draft, ~40 s on two cores), then decoded by the engine:
chain and tree reproduce autoregressive greedy token for token, and the trained draft really drafts.
Also: the files SGLang and the shadow side read, `engine verify --target --draft`, engine_run.py's
JSON contract, and that the seed alone decides the weights."""

from __future__ import annotations

import dataclasses
import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = [pytest.mark.engine, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PAIR = REPO / "bench" / "pair"


def pair_module(name: str) -> Any:
    """A bench/pair module under its plain name: the scripts import each other that way."""
    here = str(REPO / "bench" / "pair")
    if here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    train = pair_module("train")
    scales = pair_module("scales")
    out = tmp_path_factory.mktemp("pair") / "pair"
    train.setup(train.SEED, "cpu", None)
    meta = train.run(scales.SCALES["test"], out, train.SEED, "cpu")
    return out, meta


@pytest.fixture(scope="module")
def loaded(pair) -> tuple[Any, Any, Any]:
    from ddtree_ops.engine.dflash import load_pair

    out, _ = pair
    return load_pair(out / "target", out / "draft")


def test_the_pair_has_the_files_sglang_and_the_shadow_side_read(pair) -> None:
    from transformers import AutoTokenizer

    from ddtree_ops.engine.dflash import DraftSpec

    out, meta = pair
    for sub in ("target", "draft"):
        for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            assert (out / sub / f).is_file(), f"{sub}/{f}"
    draft_cfg = json.loads((out / "draft" / "config.json").read_text())
    target_cfg = json.loads((out / "target" / "config.json").read_text())
    assert draft_cfg["architectures"] == ["DFlashDraftModel"] and target_cfg["architectures"] == ["Qwen3ForCausalLM"]
    spec = DraftSpec.from_config(draft_cfg)
    tok = AutoTokenizer.from_pretrained(str(out / "target"))
    assert tok.convert_tokens_to_ids("<|MASK|>") == spec.mask_token_id == draft_cfg["dflash_config"]["mask_token_id"]
    assert max(spec.target_layer_ids) <= target_cfg["num_hidden_layers"] - 2     # SGLang can capture them
    prompts = json.loads((out / "prompts.json").read_text())
    assert len(prompts["prompts"]) == len(prompts["text"]) == meta["prompts"]["count"]
    assert all(len(p) == meta["prompts"]["length"] for p in prompts["prompts"])
    assert tok.decode(prompts["prompts"][0]) == prompts["text"][0]
    curve = json.loads((out / "train_curve.json").read_text())
    assert len(curve["target_loss"]) == meta["scale"]["target"]["steps"]
    assert len(curve["draft_loss"]) == meta["scale"]["draft"]["steps"]
    assert curve["target_loss"][-1] < curve["target_loss"][0] - 1.0                # it learned
    assert curve["draft_loss"][-1] < curve["draft_loss"][0] - 1.0
    assert meta["target"]["heldout_loss"] > 0 and 0 <= meta["target"]["share_top1_p_gt_0.5"] <= 1


def test_pair_decodes_losslessly_and_the_draft_drafts(pair, loaded) -> None:
    from ddtree_ops.engine.decoder import Decoder

    out, _ = pair
    model, _, drafter = loaded
    prompts = json.loads((out / "prompts.json").read_text())["prompts"][:4]
    dec = Decoder(model, drafter, budget=16)
    chain_rounds = chain_tokens = tree_tokens = tree_rounds = 0
    for p in prompts:
        ar = dec.generate(p, 48, "ar").tokens
        chain = dec.generate(p, 48, "chain")
        tree = dec.generate(p, 48, "tree")
        assert chain.tokens == ar and tree.tokens == ar
        chain_rounds += chain.rounds
        chain_tokens += sum(chain.round_tokens)
        tree_rounds += tree.rounds
        tree_tokens += sum(tree.round_tokens)
    tau_chain, tau_tree = chain_tokens / chain_rounds, tree_tokens / tree_rounds
    assert tau_chain >= 2.0, f"chain tau {tau_chain:.2f}: the trained draft does not draft"
    assert tau_tree >= tau_chain


def test_the_training_objective_predicts_every_round_of_the_engine(pair, loaded) -> None:
    """The training path, fed the decoded sequence, says for each round of the engine's chain
    decode how many tokens that round accepts: 1 + the leading run of depths where the draft's
    argmax is the target's token. Equal on every round, so the draft the objective trains is the
    draft that drafts, context features from the verify forwards included."""
    from ddtree_ops.engine.decoder import Decoder

    draft_train = pair_module("draft_train")
    out, _ = pair
    model, _, drafter = loaded
    bs = drafter.spec.block_size
    checked = 0
    for p in json.loads((out / "prompts.json").read_text())["prompts"][:4]:
        dec = Decoder(model, drafter, budget=16)
        ar = dec.generate(p, 48, "ar").tokens
        chain = dec.generate(p, 48, "chain")
        seq = torch.tensor([p + ar])
        roots, pos = [], len(p)
        for n in chain.round_tokens:
            if pos + bs <= seq.shape[1]:          # rounds whose whole block lies inside the sequence
                roots.append(pos)
            pos += n
        feats = draft_train.features(model, seq, drafter.spec, "cpu")
        logits, labels, _ = draft_train.block_logits(drafter.draft_model, model, seq, feats, torch.tensor([roots]),
                                                     "cpu")
        agree = (logits.argmax(-1) == labels)[0]
        predicted = (1 + torch.cumprod(agree.long(), dim=1).sum(dim=1)).tolist()
        assert predicted == chain.round_tokens[:len(roots)]
        checked += len(roots)
    assert checked >= 10


def test_an_untrained_draft_does_not_draft(pair, loaded) -> None:
    """The control for the test above: the same pair with the draft's weights re-randomised
    accepts next to nothing, so the acceptance there comes from training."""
    from ddtree_ops.engine.decoder import Decoder
    from ddtree_ops.engine.dflash import DFlashDraft, DFlashDrafter

    out, _ = pair
    model, _, drafter = loaded
    torch.manual_seed(0)
    raw = DFlashDraft(drafter.spec)
    raw.init_weights()
    prompts = json.loads((out / "prompts.json").read_text())["prompts"][:2]
    res = [Decoder(model, DFlashDrafter(model, raw.eval()), budget=16).generate(p, 32, "chain") for p in prompts]
    tau = sum(sum(r.round_tokens) for r in res) / sum(r.rounds for r in res)
    assert tau < 1.3


def test_engine_verify_cli_on_the_pair(pair) -> None:
    out, _ = pair
    cmd = [sys.executable, "-m", "ddtree_ops", "engine", "verify", "--target", str(out / "target"), "--draft",
           str(out / "draft"), "--budget", "12", "--prompts", "2", "--max-new-tokens", "24", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["identical"] and doc["draft"] == str(out / "draft") and doc["horizon"] == 7
    assert doc["tau_chain"] >= 2.0 and doc["tau_tree"] >= doc["tau_chain"]
    assert "the pair's prompts.json" in " ".join(doc["notes"])
    bad = subprocess.run(cmd[:-1] + ["--horizon", "15"], capture_output=True, text=True, cwd=REPO, timeout=120,
                         env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert bad.returncode == 64 and "drafts 7 positions" in bad.stderr


def test_engine_run_writes_the_contract(pair, tmp_path) -> None:
    out, _ = pair
    dest = tmp_path / "run.json"
    proc = subprocess.run([sys.executable, str(PAIR / "engine_run.py"), "--pair", str(out), "--budget", "12",
                           "--max-new", "24", "--prompts", "3", "--reps", "2", "--out", str(dest)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(dest.read_text())
    for key in ("tau_chain", "tau_tree", "budget", "lossless", "tok_s_chain", "tok_s_tree", "tok_s_ar",
                "rounds_chain", "rounds_tree"):
        assert key in doc, key
    assert doc["lossless"] is True and doc["budget"] == 12 and doc["complete"] is True
    assert doc["rounds_chain"] == sum(len(r) for r in doc["accepted_chain"])
    assert doc["tau_chain"] == pytest.approx(sum(map(sum, doc["accepted_chain"])) / doc["rounds_chain"], abs=1e-3)
    # every token after the prefill's came from a round (the last round may overshoot max_new)
    assert sum(map(sum, doc["accepted_chain"])) >= doc["tokens_per_arm"] - doc["prompts"]
    assert [t["arm"] for t in doc["turns"]] == ["chain", "tree", "chain_b"] * 2
    assert doc["turns"][0]["order"] == ["chain", "tree", "chain_b"] and doc["turns"][3]["order"][0] == "chain_b"
    assert doc["shadow"]["rounds"] == doc["rounds_chain"]                 # the shadow commits the chain


def test_the_seed_decides_the_weights(tmp_path) -> None:
    """Two runs with one seed write identical files; another seed does not (so the check can fail)."""
    train = pair_module("train")
    scales = pair_module("scales")
    base = scales.SCALES["test"]
    micro = dataclasses.replace(base, corpus_bytes=100_000, tokenizer_bytes=100_000, prompts=2, eval_windows=2,
                                target=dataclasses.replace(base.target, steps=4, batch=2, seq_len=64),
                                draft=dataclasses.replace(base.draft, steps=4, batch=2, anchors=4, prompt_len=16,
                                                          gen_len=24, gen_seqs=8, eval_seqs=2))
    metas = [train.run(micro, tmp_path / name, seed, "cpu")["sha256"]
             for name, seed in (("a", 7), ("b", 7), ("c", 8))]
    assert metas[0] == metas[1]
    assert metas[0]["target/model.safetensors"] != metas[2]["target/model.safetensors"]
    assert metas[0]["draft/model.safetensors"] != metas[2]["draft/model.safetensors"]
