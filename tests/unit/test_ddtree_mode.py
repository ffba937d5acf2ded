"""Mode `ddtree` (tree serving): the profile section, the rules that tie it to the shadow it is promoted
from, the environment it renders (read back by the plugin's own settings parser), and preflight's
check that a tree verify backend is declared on the host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ddtree_ops.errors import ProfileError
from ddtree_ops.preflight import FAIL, OK, Preflight, check_parallel, check_sglang
from ddtree_ops.profile import DDTreeMode, load_profile
from ddtree_ops.render import launch_argv, mode_env, render
from test_profile import _edit, profiles  # noqa: F401  (profiles: a copy of the shipped profiles, a fixture)

REPO = Path(__file__).resolve().parents[2]


def test_the_served_tree_is_the_shadows_unless_told_otherwise() -> None:
    for host in ("ct129", "ct200"):
        p = load_profile(host, directory=REPO / "profiles")
        tree, shadow = p.mode("ddtree"), p.mode("ddtree-shadow")
        assert isinstance(tree, DDTreeMode)
        assert (tree.draft_model_path, tree.block_size, tree.budget, tree.draft_attention_backend) == (
            shadow.draft_model_path, shadow.block_size, shadow.budget, shadow.draft_attention_backend)
        assert tree.budget == 32                # both classes serve the same tree (docs/lab.md: r is the card's)
        # the shadow changed for one run: the served tree follows it
        moved = load_profile(host, overrides=["modes.ddtree-shadow.budget=48"], directory=REPO / "profiles")
        assert moved.mode("ddtree").budget == 48
        # and the launch line is the shadow's: the mode lives in the environment
        assert launch_argv(p, "ddtree") == launch_argv(p, "ddtree-shadow")


def test_a_tree_that_is_not_the_shadows_is_refused_naming_file_and_line(profiles: Path) -> None:
    line = _edit(profiles / "ct200.yaml", "  ddtree:\n    tree:\n", "  ddtree:\n    budget: 64\n    tree:\n") + 1
    with pytest.raises(ProfileError) as exc:
        load_profile("ct200", directory=profiles)
    (msg,) = exc.value.problems
    assert msg.endswith(f"ct200.yaml:{line} modes.ddtree.budget: 64 differs from modes.ddtree-shadow.budget 32: the "
                        "served tree must be the one the shadow measured (promote acts on its prediction); leave it "
                        "out to take the shadow's")


def test_without_a_shadow_the_tree_names_its_own_draft(profiles: Path) -> None:
    with pytest.raises(ProfileError, match=r"modes.ddtree: draft_model_path is required when modes.ddtree-shadow"):
        load_profile("ct129", overrides=["modes.ddtree-shadow=null", "mode=nextn"], directory=profiles)
    p = load_profile("ct129", overrides=["modes.ddtree-shadow=null", "mode=nextn",
                                         "modes.ddtree.draft_model_path=/models/d", "modes.ddtree.budget=20"],
                     directory=profiles)
    assert (p.mode("ddtree").draft_model_path, p.mode("ddtree").budget, p.mode("ddtree").block_size) == ("/models/d", 20, 16)
    with pytest.raises(ProfileError, match=r"modes.ddtree.budget: 8 is below the draft horizon 15"):
        load_profile("ct129", overrides=["modes.ddtree-shadow=null", "mode=nextn",
                                         "modes.ddtree.draft_model_path=/models/d", "modes.ddtree.budget=8"],
                     directory=profiles)


def test_chain_share_is_bounded_by_name(profiles: Path) -> None:
    line = _edit(profiles / "ct129.yaml", "      chain_share: 0.05", "      chain_share: 0.8")
    with pytest.raises(ProfileError) as exc:
        load_profile("ct129", directory=profiles)
    assert any(f"ct129.yaml:{line} modes.ddtree.tree.chain_share: 0.8" in m for m in exc.value.problems)


def test_tree_mode_with_tensor_parallel_is_refused() -> None:
    with pytest.raises(ProfileError, match=r"parallel.tp_size: 2 with mode ddtree"):
        load_profile("ct200", overrides=["mode=ddtree", "parallel.tp_size=2", "gpus=[0, 1]", "gpu.count=2"],
                     directory=REPO / "profiles")


def test_the_rendered_environment_is_what_the_plugin_reads() -> None:
    """Round trip: the env file render writes, through the plugin's own parser (sglang_settings)."""
    from ddtree_ops.engine.sglang_settings import read_settings

    for host in ("ct129", "ct200"):
        p = load_profile(host, directory=REPO / "profiles")
        env = mode_env(p, "ddtree")
        settings, problems = read_settings(env)
        assert problems == []
        assert (settings.mode, settings.budget, settings.chain_share, settings.report_every) == (
            "tree", p.mode("ddtree").budget, 0.05, 64)
        assert env["SGLANG_PLUGINS"] == "ddtree"
        shadow, _ = read_settings(mode_env(p, "ddtree-shadow"))
        assert shadow.mode == "shadow" and shadow.budget == settings.budget
        r = render(p, "ddtree", environ={})
        assert "mode=ddtree" in r.unit_text.splitlines()[0] and "DDTREE_MODE=tree" in r.env_text.splitlines()
        assert r.release_id.startswith("ddtree-") and r.release_id != render(p, "ddtree-shadow", environ={}).release_id


# ------------------------------------------------------------------ preflight


def report(sglang: str, backends: dict[str, str] | None) -> dict[str, Any]:
    doc = {"sglang": sglang, "ddtree-ops": "0.1.0", "parse": "ok",
           "algorithm": {"resolved": "DDTREE", "dflash": True, "dflash_family": True}}
    if backends is not None:
        doc["tree_backends"] = backends
    return doc


def tree_check(doc: dict[str, Any], mode: str = "ddtree") -> Any:
    pf = Preflight()
    check_sglang(pf, load_profile("ct200", directory=REPO / "profiles"), mode, (doc, ""), "0.1.0")
    return next((c for c in pf.checks if c.name == "tree"), None)


def test_preflight_refuses_tree_mode_where_no_backend_is_declared() -> None:
    check = tree_check(report("0.5.17", {}))
    assert check.status == FAIL and "no tree verify backend for sglang 0.5.17" in check.detail
    assert "issue 33" in check.detail and "serve ddtree-shadow meanwhile" in check.detail
    # declared for another release only
    assert tree_check(report("0.5.17", {"0.5.23": "x:Y"})).status == FAIL
    # the host could not say (an older check script)
    assert tree_check(report("0.5.17", None)).status == FAIL


@pytest.mark.parametrize("backends", [{"*": "sglang_standin.treesim:SimTreeVerify"}, {"0.5.17": "pkg.mod:Backend"}])
def test_preflight_passes_tree_mode_where_a_backend_is_declared(backends: dict[str, str]) -> None:
    check = tree_check(report("0.5.17.post1", backends))
    assert check.status == OK and next(iter(backends.values())) in check.detail


def test_the_shadow_needs_no_backend() -> None:
    assert tree_check(report("0.5.17", {}), mode="ddtree-shadow") is None


def test_preflight_refuses_tree_mode_over_tensor_parallel_ranks() -> None:
    from ddtree_ops.memory import model_shape

    p = load_profile("ct200", overrides=["parallel.tp_size=2", "gpus=[0, 1]", "gpu.count=2"], directory=REPO / "profiles")
    pf = Preflight()
    pf.shapes = type("Shapes", (), {"target": model_shape({"num_attention_heads": 32, "num_key_value_heads": 8,
                                                           "hidden_size": 4096, "num_hidden_layers": 36,
                                                           "head_dim": 128, "vocab_size": 151936}),
                                    "draft": None})()
    check_parallel(pf, p, "ddtree")
    check = next(c for c in pf.checks if c.name == "tree")
    assert check.status == FAIL and "tp_size 2 with mode ddtree" in check.detail
