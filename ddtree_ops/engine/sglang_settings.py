"""What the DDTREE plugin is configured with, and which SGLang versions it serves on.

The first module of the plugin's one-way chain: settings, then shadow (`sglang_shadow`), then
worker (`sglang_worker`), then plugin (`sglang_plugin`). Standard library only: preflight reads
the version table on the control machine, and the plugin reads the environment inside SGLang.

Configuration is by environment, because a plugin has no sanctioned way to add server flags:
DDTREE_BUDGET, DDTREE_SHADOW_SHARE, DDTREE_SHADOW_REPORT_EVERY, DDTREE_SHADOW_WARN_AFTER,
DDTREE_VERIFY_COST_RATIO (else `default_cost_ratio`, from the committed engine benchmark),
DDTREE_MODE (`shadow`: the DFlash chain is committed, the tree accounted beside it; `tree`: the tree
is served, with the chain's spine inside it, `sglang_tree`), DDTREE_CHAIN_SHARE (tree mode: the share of
verify rounds that verify the spine alone, DFlash's own round, so that the verify cost ratio r is
measured on the same traffic), DDTREE_COST_PROBE_SHARE (shadow mode, where a tree verify backend is
installed: the share of rounds followed by a timed tree verify forward whose result is discarded),
DDTREE_SHADOW_TRACE (log the hooks' decisions for the first N verify rounds: what support asks for
when a release behaves unlike its source), DDTREE_SHADOW_MAX_PENDING (sampled trees kept while the
tokens that decide them are committed), DDTREE_SHADOW_ACCOUNT_THREAD (1: the accounting runs on a
thread of its own instead of the scheduler's). DDTREE_SHADOW_REPORT_EVERY sets the report interval in
both modes.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from typing import Any

NAME = "DDTREE"
PLUGIN = "ddtree"
MAX_BUDGET = 2048
MAX_HORIZON = 32
DEFAULT_SHARE = 0.1
DEFAULT_REPORT_EVERY = 200
DEFAULT_WARN_AFTER = 500       # verify rounds with nothing accounted before the plugin says so
DEFAULT_MAX_PENDING = 4096     # sampled trees waiting for their committed continuation, all requests
MODES = ("shadow", "tree")
DEFAULT_CHAIN_SHARE = 0.05     # tree mode: spine-only rounds, enough for r per batch bucket, little cost
MAX_CHAIN_SHARE = 0.5          # above this the server mostly serves the chain it was promoted away from
DEFAULT_PROBE_SHARE = 0.05     # shadow mode: timed tree verify forwards, where a backend can run them

# The measured default of the tree/chain cost ratio: one verify forward of N tokens on the
# Qwen3-8B shape, H200, CUDA graphs, context 2048, median ms (bench/results/engine.md, "Verify
# forward cost vs tree tokens"): N -> (causal chain, ancestor-masked tree). A round of the tree
# verifies B + 1 tokens, the chain's the block. The draft forward is the same in both and the
# fused tree build is under 0.1 ms (same file), so the verify ratio slightly overstates the cost
# of a tree round: a conservative default. Set DDTREE_VERIFY_COST_RATIO from your own curve.
VERIFY_MS: dict[int, tuple[float, float]] = {
    1: (11.5, 11.2), 2: (13.1, 12.9), 8: (13.6, 13.3), 16: (14.0, 13.8), 17: (15.4, 15.3), 33: (15.6, 15.5),
    65: (15.9, 15.7), 129: (17.0, 16.9), 257: (20.0, 19.9), 513: (31.0, 30.9), 1025: (50.3, 50.0),
}
COST_FROM_ENV = "DDTREE_VERIFY_COST_RATIO"
COST_FROM_BENCH = "engine-bench-h200-qwen3-8b"

# The SGLang releases the plugin was checked against, and how. DFlashWorkerV2's shape differs
# between them (0.5.17 accepts inline in forward_batch_generation, 0.5.23 in `_accept_block`), but
# both return the committed lengths and the bonus from forward_batch_generation and keep the
# verified block in `_draft_block_tokens_buf`, which is what the shadow hook reads. A release not
# listed here is refused at preflight and at server start: an unchecked release could run
# "shadow mode" for a week and measure nothing, as 0.5.17 did before it was listed.
SUPPORTED: dict[str, str] = {
    "0.5.17": ("registered and served DDTREE on an NVIDIA H200 (tests/data/real-sglang/0.5.17); the shadow "
               "hook checked against its DFlashWorkerV2 source"),
    "0.5.23": "checked on CPU: sglang's parser, plugin loader, spec predicates and DFlashWorkerV2 source",
}

_RELEASE = re.compile(r"^(\d+\.\d+\.\d+)(?:\.post\d+)?$")


def release_of(version: str | None) -> str | None:
    """'0.5.17.post1' -> '0.5.17'; a dev, rc or local build -> None (not a release we checked)."""
    m = _RELEASE.match((version or "").strip())
    return m.group(1) if m else None


def sglang_version() -> str | None:
    """The installed SGLang's version (None without one)."""
    try:
        import sglang

        return getattr(sglang, "__version__", None)
    except Exception:
        return None


def version_problem(version: str | None) -> str | None:
    """None when the plugin serves on this SGLang; else the sentence an operator reads."""
    if release_of(version) in SUPPORTED:
        return None
    return (f"DDTREE plugin: sglang {version or 'unknown'} is not supported "
            f"(supported: {', '.join(SUPPORTED)})")


@dataclass(frozen=True)
class ShadowSettings:
    budget: int | None              # None: block size - 1 (the chain's own node count)
    share: float
    report_every: int
    warn_after: int
    cost_ratio: float | None
    mode: str
    trace: int = 0
    max_pending: int = DEFAULT_MAX_PENDING
    account_thread: bool = False
    chain_share: float = DEFAULT_CHAIN_SHARE
    probe_share: float = DEFAULT_PROBE_SHARE

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_settings(env: dict[str, str] | None = None) -> tuple[ShadowSettings, list[str]]:
    """The DDTREE_* environment, parsed; problems are returned, not raised, so a validator can
    report all of them at once."""
    env = dict(os.environ if env is None else env)
    problems: list[str] = []

    def number(key: str, cast: Any, default: Any, lo: float, hi: float) -> Any:
        raw = env.get(key)
        if raw is None or raw.strip() == "":
            return default
        try:
            value = cast(raw)
        except ValueError:
            problems.append(f"{key}={raw!r} is not a{'n integer' if cast is int else ' number'}")
            return default
        if not lo <= value <= hi:
            problems.append(f"{key}={raw} is out of range [{lo:g}, {hi:g}]")
            return default
        return value

    mode = env.get("DDTREE_MODE", "shadow").strip().lower() or "shadow"
    if mode not in MODES:
        problems.append(f"DDTREE_MODE={env.get('DDTREE_MODE')!r} is not a mode: one of {', '.join(MODES)} "
                        "(shadow: serve the DFlash chain and account the tree; tree: serve the tree)")
        mode = "shadow"
    settings = ShadowSettings(
        budget=number("DDTREE_BUDGET", int, None, 1, MAX_BUDGET),
        share=number("DDTREE_SHADOW_SHARE", float, DEFAULT_SHARE, 0.0, 1.0),
        report_every=number("DDTREE_SHADOW_REPORT_EVERY", int, DEFAULT_REPORT_EVERY, 1, 10**9),
        warn_after=number("DDTREE_SHADOW_WARN_AFTER", int, DEFAULT_WARN_AFTER, 1, 10**9),
        cost_ratio=number("DDTREE_VERIFY_COST_RATIO", float, None, 0.01, 1000.0),
        mode=mode,
        trace=number("DDTREE_SHADOW_TRACE", int, 0, 0, 10**6),
        max_pending=number("DDTREE_SHADOW_MAX_PENDING", int, DEFAULT_MAX_PENDING, 0, 10**7),
        account_thread=bool(number("DDTREE_SHADOW_ACCOUNT_THREAD", int, 0, 0, 1)),
        chain_share=number("DDTREE_CHAIN_SHARE", float, DEFAULT_CHAIN_SHARE, 0.0, MAX_CHAIN_SHARE),
        probe_share=number("DDTREE_COST_PROBE_SHARE", float, DEFAULT_PROBE_SHARE, 0.0, 1.0))
    return settings, problems


def _interp(n: float, column: int) -> float:
    points = sorted(VERIFY_MS)
    if n <= points[0]:
        return VERIFY_MS[points[0]][column]
    for lo, hi in zip(points, points[1:]):
        if n <= hi:
            a, b = VERIFY_MS[lo][column], VERIFY_MS[hi][column]
            return a + (b - a) * (n - lo) / (hi - lo)
    lo, hi = points[-2], points[-1]        # beyond the table: the last slope
    a, b = VERIFY_MS[lo][column], VERIFY_MS[hi][column]
    return b + (b - a) * (n - hi) / (hi - lo)


def default_cost_ratio(budget: int, block: int) -> float:
    """The tree round's verify cost in chain rounds, from `VERIFY_MS`: a tree of B + 1 tokens
    against the chain's block, never below 1 (a tree holds the chain it shadows)."""
    return round(max(1.0, _interp(budget + 1, 1) / _interp(block, 0)), 3)


def cost_ratio(settings: ShadowSettings, budget: int, block: int) -> tuple[float, str]:
    """(ratio, where it came from): DDTREE_VERIFY_COST_RATIO if set, else the measured default."""
    if settings.cost_ratio is not None:
        return float(settings.cost_ratio), COST_FROM_ENV
    return default_cost_ratio(budget, block), COST_FROM_BENCH


def reference_dir() -> "os.PathLike[str]":
    """Where `make install` keeps the wheels of supported SGLang releases that are not the one
    installed (their source is checked on CPU; nothing from them is imported)."""
    import sys
    from pathlib import Path

    return Path(sys.prefix) / "share" / "ddtree-ops" / "reference"


def reference_wheel(version: str) -> "os.PathLike[str] | None":
    from pathlib import Path

    found = sorted(Path(reference_dir()).glob(f"sglang-{version}-*.whl"))
    return found[-1] if found else None
