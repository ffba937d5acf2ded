"""KV-pool prediction: SGLang's formula on the story's numbers (facts/sglang-ddtree.md 7.1-7.2)."""

from __future__ import annotations

from ddtree_ops import memory

QWEN3_8B = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 36,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288,
            "vocab_size": 151936, "torch_dtype": "bfloat16", "tie_word_embeddings": False}
DFLASH_DRAFT = {"architectures": ["DFlashDraftModel"], "hidden_size": 4096, "num_hidden_layers": 5,
                "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288,
                "vocab_size": 151936, "torch_dtype": "bfloat16", "block_size": 16,
                "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]}}
A6000_MIB = 49140


def _plan(mfs: float, ctx: int, conc: int, free_mib: int = A6000_MIB) -> memory.MemoryPlan:
    target = memory.model_shape(QWEN3_8B)
    return memory.plan(gpu_total_mib=A6000_MIB, free_mib=free_mib, target=target,
                       weights=16_381_470_720,
                       draft_cell=memory.model_shape(DFLASH_DRAFT).cell_bytes(),
                       draft_weights=memory.draft_weights_bytes(DFLASH_DRAFT, target),
                       mem_fraction_static=mfs, context_length=ctx, concurrency=conc)


def test_cell_sizes_match_the_worked_example() -> None:
    assert memory.model_shape(QWEN3_8B).cell_bytes() == 147_456  # 144 KiB per token
    assert memory.model_shape(DFLASH_DRAFT).cell_bytes() == 20 * 1024


def test_story_attempt_1_is_refused_with_numbers_and_fixes() -> None:
    p = _plan(0.88, 131072, 4)
    assert not p.fits
    assert 140_000 < p.tokens < 170_000  # one 131k request fits, four do not
    assert p.needed_tokens == 524_288
    assert "131,072 context x 4 requests need 524,288" in p.problems[0]
    assert any(s.startswith("memory.context_length=") for s in p.suggestions)
    assert "memory.max_running_requests=1 (at 131072 context)" in p.suggestions


def test_story_attempt_2_fits_but_leaves_no_runtime_headroom() -> None:
    p = _plan(0.95, 32768, 4)
    assert p.fits
    assert p.warnings and "expect CUDA out of memory" in p.warnings[0]


def test_shipped_ct129_setting_fits_without_warnings() -> None:
    p = _plan(0.81, 32768, 4)
    assert p.fits and not p.warnings, (p.problems, p.warnings)


def test_weights_larger_than_the_static_budget_give_sglangs_message() -> None:
    p = _plan(0.30, 4096, 1)
    assert p.tokens == 0 and not p.fits
    assert "Not enough memory. Please try to increase --mem-fraction-static." in p.problems[0]
    assert any(s.startswith("memory.mem_fraction_static=") for s in p.suggestions)


def test_a_stray_process_shrinks_the_pool() -> None:
    assert _plan(0.81, 32768, 4, free_mib=A6000_MIB - 30_000).tokens == 0


def test_weights_prefer_the_checkpoint_index() -> None:
    assert memory.weights_bytes(QWEN3_8B, {"metadata": {"total_size": 123}}) == 123
    estimate = memory.weights_bytes(QWEN3_8B, None)
    assert abs(estimate - 16_381_470_720) / 16_381_470_720 < 0.02  # shapes give Qwen3-8B's real size


def test_plan_from_configs_is_what_preflight_predicts() -> None:
    """The memory table and its test predict with `plan_from_configs`; preflight with its own
    shapes. Both must give the same pool for the same configs, cards and settings."""
    import json
    from pathlib import Path

    from ddtree_ops.preflight import Preflight, check_models
    from ddtree_ops.profile import load_profile

    fix = Path(__file__).resolve().parents[2] / "ddtree_ops" / "lab" / "fixtures"
    target = json.loads((fix / "Qwen3-8B" / "config.json").read_text())
    index = json.loads((fix / "Qwen3-8B" / "model.safetensors.index.json").read_text())
    draft = json.loads((fix / "Qwen3-8B-DFlash-b16" / "config.json").read_text())
    for tp in (1, 2):
        p = load_profile("ct200", overrides=[f"parallel.tp_size={tp}", f"gpus={list(range(tp))}",
                                             f"gpu.count={tp}"])
        files = {f"{p.service.model_path}/config.json": json.dumps(target).encode(),
                 f"{p.service.model_path}/model.safetensors.index.json": json.dumps(index).encode(),
                 f"{p.modes.dflash.draft_model_path}/config.json": json.dumps(draft).encode()}
        pf = Preflight()
        check_models(pf, p, "dflash", files)
        assert pf.memory is not None and pf.free_mib is not None
        ours = memory.plan_from_configs(target, index=index, draft_cfg=draft, gpu_total_mib=p.gpu.memory_mib,
                                        free_mib=pf.free_mib, mem_fraction_static=p.memory.mem_fraction_static,
                                        kv_cache_dtype=p.memory.kv_cache_dtype, page_size=p.memory.page_size, tp=tp)
        assert (ours.tokens, ours.cell_bytes, ours.weights_gib) == (pf.memory.tokens, pf.memory.cell_bytes,
                                                                   pf.memory.weights_gib), tp
